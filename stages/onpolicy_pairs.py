"""Stage onpolicy_pairs: the SFT model's own answers as rejected responses -> data/onpolicy/{pairs.parquet,
stats.json}. For every prompt of data/prompts/pairs.parquet (both splits, so held-out prompts stay held out):
K samples, each a pair with chosen = the prompt's reference answer, kind sft_sample; K = 0 writes an empty file."""
from pathlib import Path

import pyarrow.parquet as pq
import typer

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import pick_device, write_json, write_table
from speedrun.reward import onpolicy
from speedrun.train.checkpoint import load_model
from speedrun.cli import stage_flags


@stage_flags()
def main(pairs: Path, sft_dir: Path, tokenizer_dir: Path, samples_per_prompt: int, max_new_tokens: int,
         temperature: float, top_p: float, max_prompt_len: int, batch_prompts: int, seed: int, device: str,
         out_dir: Path) -> None:
    if samples_per_prompt < 0 or max_new_tokens < 1 or batch_prompts < 1:
        raise typer.BadParameter("need --samples-per-prompt >= 0, --max-new-tokens >= 1, --batch-prompts >= 1")
    table = pq.read_table(pairs)
    refs = onpolicy.reference_answers(table.to_pylist())
    if not refs:
        raise ValueError(f"{pairs}: no pairs, so no prompts to sample answers for")
    rows, stats = [], {"prompts": len(refs), "samples_per_prompt": 0, "pairs": 0}
    if samples_per_prompt:
        dev = pick_device(device)
        tok = tokenizer_lib.load(tokenizer_dir)
        model, _ = load_model(sft_dir, dev, tok.digest)
        rows, stats = onpolicy.sample_rejected(model, tok, refs, samples_per_prompt, max_new_tokens, temperature,
                                               top_p, seed, batch_prompts, max_prompt_len, dev)
    write_table(out_dir / "pairs.parquet", onpolicy.pairs_table(rows, table.schema))
    write_json(out_dir / "stats.json", stats)
    print(f"onpolicy: {stats['pairs']} pairs from {stats['prompts']} prompts x {samples_per_prompt} samples "
          f"({stats.get('truncated_frac', 0):.1%} hit --max-new-tokens)")


if __name__ == "__main__":
    typer.run(main)
