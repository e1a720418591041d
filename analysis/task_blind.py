"""Does a task SFT model read its prompt on every cluster? Each checkpoint answers the held-out items (task_eval's
sampler, task.eval.samples answers at T = 1); per cluster its pass@1 is printed beside the prompt-blind baseline
(task_track.blind_baseline: each item's checker applied to the answers to the cluster's other items) and whether it
clears task_track's bar (2x blind and blind + 0.15). Used to choose the task SFT recipe and the trained clusters
(docs/LOG.md, 2026-11-29).

    python analysis/task_blind.py outs/task_sft scratch/lever/sft1200"""
from __future__ import annotations

from pathlib import Path

import typer

from speedrun import tokenizer as tokenizer_lib
from speedrun.data import task
from speedrun.eval.task_track import blind_baseline, sample_answers
from speedrun import params as params_lib
from speedrun.train.checkpoint import load_model
from speedrun.typer_app import new_app

app = new_app()


@app.command(help=__doc__)
def main(checkpoints: list[Path] = typer.Argument(..., help="task SFT checkpoint directories"),
         items: Path = typer.Option(Path("data/task/items.parquet")),
         tokenizer_dir: Path = typer.Option(Path("outs/tokenizer")),
         temperature: float = typer.Option(1.0)) -> None:
    p = params_lib.load()
    tok = tokenizer_lib.load(tokenizer_dir)
    all_items = task.load_items(items)
    held_out = [i for i in all_items if i.split == "eval"]
    for ckpt in checkpoints:
        model, _ = load_model(ckpt, "cpu", tok.digest)
        a = sample_answers(model, str(ckpt), tok, held_out, p.task.eval.samples, p.task.eval.max_new_tokens,
                           temperature, p.seed, "cpu")
        cells = [f"{c} {v['pass@1']:.3f} vs blind {v['blind']:.3f} ({'reads' if v['reads_prompt'] else 'blind'})"
                 for c, v in blind_baseline(a, held_out).items()]
        print(f"{ckpt}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    app()
