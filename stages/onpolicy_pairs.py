"""Stage onpolicy_pairs: the SFT model's own answers as rejected responses -> data/onpolicy/{pairs.parquet,
stats.json}. For every train and val prompt of data/prompts/pairs.parquet (the RM trains on the first, picks its
checkpoint on the second; the evaluation's prompts are never sampled here): K samples, each a pair with chosen =
the prompt's reference answer, kind sft_sample; K = 0 writes an empty file. With compute.nproc > 1 the prompt
batches are shared over that many processes (torchrun), with the same output as one."""
import pyarrow.parquet as pq

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import pick_device, write_json, write_table
from speedrun.reward import onpolicy
from speedrun.shapes import use_shapes
from speedrun.stage import run_stage
from speedrun.train import distributed
from speedrun.train.checkpoint import context_length, load_model

READS = ("seed", "compute.nproc", "compute.device", "compute.width_step", "onpolicy")
PATHS = {"pairs": "data/prompts/pairs.parquet", "sft_dir": "outs/sft", "tokenizer_dir": "outs/base/tokenizer",
         "out_dir": "data/onpolicy"}


def main(p, io) -> None:
    c = p.onpolicy
    if c.samples_per_prompt:
        distributed.maybe_relaunch(p.compute.nproc, "stages.onpolicy_pairs")
    table = pq.read_table(io.pairs)
    refs = [r for r in onpolicy.reference_answers(table.to_pylist(), str(io.pairs)) if r["split"] != "eval"]
    if not refs:
        raise ValueError(f"{io.pairs}: no pairs, so no prompts to sample answers for")
    rows, stats = [], {"prompts": len(refs), "samples_per_prompt": 0, "pairs": 0}
    if c.samples_per_prompt:
        d = distributed.setup(pick_device(p.compute.device))
        dev = d.device
        use_shapes(p.compute.width_step, dev)
        tok = tokenizer_lib.load(io.tokenizer_dir)
        model, _ = load_model(io.sft_dir, dev, tok.digest)
        prompt_len = context_length(c.max_prompt_len, io.sft_dir, c.max_new_tokens, "onpolicy.max_prompt_len")
        rows, stats = onpolicy.sample_rejected(model, tok, refs, c.samples_per_prompt, c.max_new_tokens,
                                               c.temperature, c.top_p, p.seed, c.batch_prompts, prompt_len, dev, d,
                                               c.keep_truncated)
        distributed.teardown()
        if not d.is_main:
            return
    write_table(io.out_dir / "pairs.parquet", onpolicy.pairs_table(rows, table.schema))
    write_json(io.out_dir / "stats.json", stats)
    print(f"onpolicy: {stats['pairs']} pairs from {stats['prompts']} prompts x {c.samples_per_prompt} samples "
          f"({stats.get('truncated_frac', 0):.1%} kept that hit max_new_tokens, "
          f"{stats.get('skipped', {}).get('truncated', 0)} skipped for it)")


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
