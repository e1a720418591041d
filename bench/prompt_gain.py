"""Does a model read its prompt, in the pretraining format too? Prints the prompt gain (eval.sampling.prompt_gain: an
answer's mean log-probability per token under its own prompt minus under another's) of each checkpoint on the
corpus's documents, a document's first paragraph (its header: `class pkgutil.ImpImporter`) as the prompt and the
rest as the answer, for the pretrained modules (train) and the never-pretrained ones (val). The evaluation reports
the same measure on the held-out chat prompts; this one asks whether a prompt-blind SFT model inherits it from its
base model or from the chat format.

    python bench/prompt_gain.py outs/pretrain outs/sft
Needs outs/tokenizer and data/corpus (`dvc repro pretrain`). Nothing is written.
"""
from pathlib import Path

import pandas as pd
import torch
import typer

from speedrun import tokenizer as tokenizer_lib
from speedrun.eval.sampling import PROMPT_GAIN, prompt_gain, prompt_gain_summary, swapped_prompt_rows
from speedrun.train.checkpoint import load_model


def main(checkpoints: list[Path], docs: int = typer.Option(256, help="documents per split (a fixed random draw)"),
         threads: int = typer.Option(2)) -> None:
    torch.set_num_threads(threads)
    tok = tokenizer_lib.load("outs/tokenizer")
    models = {ck: load_model(ck, "cpu", tok.digest)[0].eval() for ck in checkpoints}
    for split in ("train", "val"):
        rows, prompt_lens = [], []
        for text in pd.read_parquet(f"data/corpus/{split}.parquet")["text"].sample(docs, random_state=0):
            head, _, body = text.partition("\n\n")
            if body:  # a document with no body has no answer to score
                prompt = [tok.bos_id] + tok.encode(head + "\n\n")
                rows.append(prompt + tok.encode(body))
                prompt_lens.append(len(prompt))
        seq_len = min(m.config.seq_len for m in models.values())
        swapped = swapped_prompt_rows(rows, prompt_lens, seq_len)
        for ck, model in models.items():
            s = prompt_gain_summary(prompt_gain(model, swapped, "cpu"))
            print(f"{split} docs ({s['prompts']} with a body), {ck}: prompt gain {s['gain']:+.3f} "
                  f"[{s['ci_low']:+.3f}, {s['ci_high']:+.3f}] nats/token (a model that reads its prompt: "
                  f">= {PROMPT_GAIN:g})", flush=True)


if __name__ == "__main__":
    typer.run(main)
