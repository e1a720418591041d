"""Does a model read its prompt, in the pretraining format too? Prints the prompt gain (eval.sampling.prompt_gain: an
answer's mean log-probability per token under its own prompt minus under another's) of each checkpoint on the
corpus's documents, a document's first paragraph (its header: `class pkgutil.ImpImporter`) as the prompt and the
rest as the answer, for the pretrained modules (train) and the never-pretrained ones (val); then on the held-out
chat prompts with their reference answers, as the evaluation measures it (here the first --docs of them in the
evaluation's order, not only eval.max_prompts, and without leaving out the few whose reference answer is also a
trained prompt's). It asks whether a prompt-blind SFT model inherits that from its base model or from the chat
format, and whether another checkpoint (a longer pretraining) reads its prompt.

    python analysis/prompt_gain.py outs/pretrain outs/sft
Needs outs/tokenizer, data/corpus and data/prompts (`dvc repro dedup_prompts`). Nothing is written.
"""
from pathlib import Path

import pandas as pd
import torch
import typer

from speedrun.typer_app import new_app

from speedrun import params
from speedrun import tokenizer as tokenizer_lib
from speedrun.eval.sampling import (PROMPT_GAIN, prompt_gain, prompt_gain_summary, reference_token_ids,
                                    swapped_prompt_rows)
from speedrun.rl.prompts import load_prompts
from speedrun.train.checkpoint import load_model


app = new_app()


@app.command(help=__doc__)
def main(checkpoints: list[Path] = typer.Argument(...),
         docs: int = typer.Option(256, help="documents per split (a fixed random draw)"),
         threads: int = typer.Option(2)) -> None:
    torch.set_num_threads(threads)
    tok = tokenizer_lib.load("outs/tokenizer")
    models = {ck: load_model(ck, "cpu", tok.digest)[0].eval() for ck in checkpoints}
    seq_len = min(m.config.seq_len for m in models.values())
    sets = {}
    for split in ("train", "val"):
        rows, prompt_lens = [], []
        for text in pd.read_parquet(f"data/corpus/{split}.parquet")["text"].sample(docs, random_state=0):
            head, _, body = text.partition("\n\n")
            if body:  # a document with no body has no answer to score
                prompt = [tok.bos_id] + tok.encode(head + "\n\n")
                rows.append(prompt + tok.encode(body))
                prompt_lens.append(len(prompt))
        sets[f"{split} docs"] = (rows, prompt_lens)
    df, ids = load_prompts(Path("data/prompts/prompts.parquet"), tok, "eval", params.load().eval.max_prompt_len)
    order = df.sort_values("prompt_id").index[:docs]  # the evaluation's order
    sets["held-out chat prompts"] = reference_token_ids(Path("data/prompts/pairs.parquet"), tok,
                                                        df["prompt_id"][order].tolist(), [ids[i] for i in order],
                                                        seq_len)
    for name, (rows, prompt_lens) in sets.items():
        swapped = swapped_prompt_rows(rows, prompt_lens, seq_len)
        for ck, model in models.items():
            s = prompt_gain_summary(prompt_gain(model, swapped, "cpu"))
            print(f"{name} ({s['prompts']}), {ck}: prompt gain {s['gain']:+.3f} "
                  f"[{s['ci_low']:+.3f}, {s['ci_high']:+.3f}] nats/token (a model that reads its prompt: "
                  f">= {PROMPT_GAIN:g})", flush=True)


if __name__ == "__main__":
    app()
