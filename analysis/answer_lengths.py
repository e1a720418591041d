"""Length check of a task-track experiment, from its committed answers alone (no model, no DVC cache).

Does an arm answer in longer or shorter sentences than another, and does it give the bare value (just `13`) more
often? A coverage difference that comes with a change of wording is a stylistic effect beside the semantic one.
Per arm (its runs pooled): words per answer and the bare-value share, with the task SFT model at T = 1 for scale;
per "a:b" pair the difference with the interval the task comparisons use (stats.pooled_delta: seeds + items).
Log entry: docs/LOG.md, 2026-11-26 ("GRPO on the task shortens answers to the bare value").

    python analysis/answer_lengths.py reports/experiments/task-density-20-seeds/answers.parquet \
        density:checker balanced:checker
"""
import re
import sys

import numpy as np
import pandas as pd

from speedrun import kept
from speedrun.eval.stats import pooled_delta
from speedrun.eval.task_track import item_draws

BARE = re.compile(r"^\s*`[^`]*`\s*\.?\s*$")


def per_run_items(d: pd.DataFrame, items: list[str]) -> dict[str, pd.DataFrame]:
    """Per model (run): its per-item mean words and bare share, rows in `items` order."""
    d = d.assign(words=d.text.str.split().str.len(), bare=d.text.str.match(BARE).astype(float))
    return {m: g.groupby("item_id")[["words", "bare"]].mean().reindex(items) for m, g in d.groupby("model")}


def main(path: str, pairs: list[str], n_boot: int = 1000) -> None:
    d = kept.read_parquet(path)
    items = sorted(d.item_id.unique())
    runs = per_run_items(d[d.model != "task_sft"], items)
    sft = per_run_items(d[(d.model == "task_sft") & (d.temperature == 1.0)], items)
    arms: dict[str, list[str]] = {}
    for m in sorted(runs):
        arms.setdefault(m.rsplit("_s", 1)[0], []).append(m)
    draws = item_draws(len(items), n_boot, 0, "answer_lengths")
    print(f"{path}: {len(items)} held-out items, {len(d)} answers")
    print("| model | runs | words per answer | bare value share |\n|---|---:|---:|---:|")
    for name, frames in [("task SFT, T=1.0", list(sft.values()))] + [(a, [runs[m] for m in ms]) for a, ms in
                                                                     arms.items()]:
        print(f"| {name} | {len(frames)} | {np.mean([f.words.mean() for f in frames]):.2f} | "
              f"{np.mean([f.bare.mean() for f in frames]):.3f} |")
    for pair in pairs:
        a, b = pair.split(":")
        for col in ("words", "bare"):
            ma, mb = ([[runs[m][col].to_numpy()[r].mean() for m in arms[x]] for r in draws] for x in (a, b))
            ma, mb = np.array(ma), np.array(mb)
            r = pooled_delta(ma[0], mb[0], ma[1:], mb[1:])
            print(f"{a} - {b}, {col}: {r['value']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] (p {r['p']:.3f})")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
