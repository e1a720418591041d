"""Every reading of a committed task comparison, with today's instruments: the frontier gap against the task SFT
model's envelope (eval/envelope.py), the same-temperature Δ coverage and Δ coverage at equal pass@1 at either arm's
pass@1 (runs sampled at several temperatures), each with stats.pooled_delta's interval over seeds and items, and the
effect as their range (task_compare.compare_arms, what task_eval calls). A post-hoc re-reading of committed answers,
not a new test: each experiment's call stays the one its plan fixed.

    python analysis/task_readings.py reports/experiments/task-density-matched/answers.parquet density:checker
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from speedrun import kept
from speedrun.eval.task_compare import compare_arms
from speedrun.eval.task_track import pass_k_values
from speedrun.typer_app import new_app

app = new_app()
NAMES = {"gap": "frontier gap (envelope)", "same_temperature": "same temperature",
         "matched": "equal pass@1, the control's", "matched_other": "equal pass@1, the treatment's"}


@app.command(help=__doc__.splitlines()[0])
def main(answers: Annotated[Path, typer.Argument(help="a task answers.parquet (task_eval's, or an experiment's)")],
         comparisons: Annotated[list[str], typer.Argument(help="treatment:control arm pairs")],
         temperature: float = typer.Option(1.0, help="the GRPO temperature (each run's own reading)"),
         n_boot: int = typer.Option(1000, help="bootstrap draws of the items"),
         seed: int = typer.Option(1337, help="the bootstrap's seed (task_eval's: params.yaml seed)")) -> None:
    a = kept.read_parquet(answers)
    runs_only = a[a["model"] != "task_sft"]
    a = a[a["cluster"].isin(set(runs_only["cluster"]))]  # the items the runs answered
    sft = {float(t): g.reset_index(drop=True) for t, g in a[a["model"] == "task_sft"].groupby("temperature")}
    arms: dict[str, list[pd.DataFrame]] = {}
    curves: dict[str, list[dict[float, pd.DataFrame]]] = {}
    for m, g in runs_only.groupby("model", sort=True):
        by_t = {float(t): x.reset_index(drop=True) for t, x in g.groupby("temperature")}
        arms.setdefault(m.rsplit("_s", 1)[0], []).append(by_t[temperature])
        curves.setdefault(m.rsplit("_s", 1)[0], []).append(by_t)
    several = all(len(c) > 1 for cs in curves.values() for c in cs)
    k = pass_k_values(int(a.groupby(["model", "temperature", "item_id"]).size().max()))
    out = compare_arms(sft, arms, comparisons, n_boot, seed, k, 0.5, 0.3, curves if several else None, temperature)
    n_items = a[a["model"] == "task_sft"]["item_id"].nunique()
    print(f"{answers}: {n_items} held-out items; SFT at T = {', '.join(f'{t:g}' for t in sorted(sft))}; runs per arm "
          + ", ".join(f"{x} {len(v)}" for x, v in arms.items()))
    for comp, r in out.items():
        print(f"{comp}:")
        for key, name in NAMES.items():
            if key in r:
                d = r[key]
                ext = f" ({d['extended_share']:.0%} of readings extended)" if "extended_share" in d else ""
                print(f"  {name}: {d['value']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}], MDE {d['mde']:.3f}{ext}")
        p1 = r["pass@1"]
        print(f"  range over the readings: {r['range']['low']:+.3f} to {r['range']['high']:+.3f}; pass@1 Δ "
              f"{p1['value']:+.3f} [{p1['ci_low']:+.3f}, {p1['ci_high']:+.3f}]")


if __name__ == "__main__":
    app()
