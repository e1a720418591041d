"""How much of each arm's Δ gap against `rm` a smaller step alone would give (post hoc; not in the plan of
task-selection-rm): a line through `rm`'s two steps (part A, lr 3e-4; part B, lr 1e-4) on the same upstream models,
gap against KL at the end of training, predicts each arm's Δ from its KL difference to `rm`. Read on the raw gap below
the envelope and on the gap beyond `shuffled`; pooled (ratio of means) and per upstream model (mean of each model's
own line). A line across learning rates is crude: it says how much of a Δ moving less *could* explain, not how much
it does.

    python analysis/task_selection_kl.py reports/experiments/task-selection-rm \
        --slow reports/experiments/task-selection-rm/slow
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from speedrun.eval.upstream import cluster_interval
from speedrun.typer_app import new_app, run_app

from task_selection import sub_runs  # analysis/ is the script's directory: on sys.path

app = new_app()


def _kl(sub: dict, arm: str) -> float:
    return float(np.mean(sub["training"][arm]["kl_end"]))


def _gap(sub: dict, arm: str, beyond: bool) -> float:
    g = sub["frontier_gap"][arm]
    return g["minus_control"]["gap"] if beyond else g["gap"]  # beyond: the arm's gap minus shuffled's


@app.command(help=__doc__.splitlines()[0])
def main(root: Annotated[Path, typer.Argument(help="the experiment (part A: rm and the arms)")],
         slow: Annotated[Path, typer.Option(help="part B: rm and shuffled at the smaller step")]) -> None:
    fast_runs, slow_runs = sub_runs(root), sub_runs(slow)
    ups = [u for u in fast_runs if u in slow_runs]
    kl_a = np.array([_kl(fast_runs[u], "rm") for u in ups])
    kl_b = np.array([_kl(slow_runs[u], "rm") for u in ups])
    print(f"{len(ups)} upstream models; rm's KL at the end: {kl_a.mean():.3f} (lr 3e-4), {kl_b.mean():.3f} (lr 1e-4)\n")
    print("| arm − rm | observed Δ gap | Δ KL [95% CI], t | reading | slope (per unit KL) | predicted Δ, pooled line | "
          "predicted Δ, per-model lines |")
    print("|---|---:|---:|---|---:|---:|---:|")
    arms = sorted(a for a in next(iter(fast_runs.values()))["training"] if a.startswith("rm_"))
    for arm in arms:
        dkl = np.array([_kl(fast_runs[u], arm) for u in ups]) - kl_a
        d = cluster_interval(list(dkl))
        dkl_text = f"{d['value']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}], t {d['value'] / d['se']:+.1f}"
        observed = np.array([_gap(fast_runs[u], arm, False) - _gap(fast_runs[u], "rm", False) for u in ups])
        for beyond in (False, True):
            ga = np.array([_gap(fast_runs[u], "rm", beyond) for u in ups])
            gb = np.array([_gap(slow_runs[u], "rm", beyond) for u in ups])
            slope = (ga.mean() - gb.mean()) / (kl_a.mean() - kl_b.mean())
            per_model = (ga - gb) / (kl_a - kl_b) * dkl
            print(f"| {arm} | {observed.mean():+.3f} | {dkl_text} | "
                  f"{'gap beyond shuffled' if beyond else 'raw gap'} | {slope:+.2f} | {slope * dkl.mean():+.3f} | "
                  f"{per_model.mean():+.3f} |")


if __name__ == "__main__":
    run_app(app, None, "analysis/task_selection_kl.py")
