"""Seeds and held-out items for a task-track comparison, from a committed experiment's answers (no model needed).
Also what the primary is made of: each arm's coverage@samples, pass@1 and right-answer entropy against the control's at
the same temperature (the frontier gap moves with pass@1 wherever the SFT frontier is steep).

The between-run variance of a run's frontier gap has two parts: the training seed's effect on the whole model (it
stays whatever the eval set) and the run's own noise over the held-out items (each run's answers to these items:
it shrinks as 1 / items, like the arm x item term). stats.pooled_delta already estimates the second from the
bootstrap over items; here both are split out per arm and the MDE is projected to more items and seeds
(stats.mde at Holm's first step over m tests). Log entry: docs/LOG.md, 2026-11-27 ("run noise over items").

    python analysis/task_power.py reports/experiments/task-density-20-seeds/answers.parquet \
        density:checker balanced:checker --items 1,2,4.14 --seeds 20,24,30 --m 2,4
"""
import numpy as np
import pandas as pd
import typer

from speedrun import kept
from speedrun.typer_app import new_app

from speedrun.eval.stats import mde, pooled_delta
from speedrun.eval.task_track import gap_draws, item_draws, per_item


def arm_tables(path: str, n_boot: int) -> tuple[dict[float, pd.DataFrame], dict[str, list[pd.DataFrame]],
                                                list[np.ndarray]]:
    """The task SFT model's per-item tables (one per temperature), each arm's per-run tables, shared item draws."""
    d = kept.read_parquet(path)
    k = (1, int(d.groupby(["model", "temperature", "item_id"]).size().min()))  # pass@1 and pass@samples
    compared = set(d.loc[d.model != "task_sft", "item_id"])  # the trained clusters' items (task.train_clusters)
    sft = {float(t): per_item(g[g.item_id.isin(compared)], k)
           for t, g in d[d.model == "task_sft"].groupby("temperature")}
    runs = {m: per_item(g, k) for m, g in d[d.model != "task_sft"].groupby("model")}
    arms: dict[str, list[pd.DataFrame]] = {}
    for m in sorted(runs):
        arms.setdefault(m.rsplit("_s", 1)[0], []).append(runs[m])
    return sft, arms, item_draws(len(next(iter(sft.values()))), n_boot, 0, "task_power")


def raw_deltas(arms: dict[str, list[pd.DataFrame]], draws: list[np.ndarray], comp: str) -> None:
    """treatment − control on coverage@samples, pass@1 and entropy at the arms' own temperature (stats.pooled_delta)."""
    a, b = comp.split(":")
    for col in ("coverage", "pass@1", "entropy"):
        ma, mb = (np.array([[t[col].to_numpy()[r].mean() for t in arms[x]] for r in draws]) for x in (a, b))
        r = pooled_delta(ma[0], mb[0], ma[1:], mb[1:])
        print(f"  same temperature, {col}: {ma[0].mean():.3f} against {mb[0].mean():.3f}, Δ {r['value']:+.3f} "
              f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]")


def split(g: np.ndarray) -> tuple[float, float]:
    """(variance of the gap over runs, the part of it that is each run's noise over the items)."""
    r = g.shape[1]
    noise = float(np.var(g[1:] - g[1:].mean(1, keepdims=True), axis=0).mean()) * r / (r - 1)
    return float(np.var(g[0], ddof=1)), noise


app = new_app()


@app.command(help=__doc__)
def main(path: str = typer.Argument(..., metavar="answers"),
         comparisons: list[str] = typer.Argument(..., help="treatment:control arm pairs"),
         items: str = typer.Option("1,2,4", help="multiples of the held-out item count to project to"),
         seeds: str = typer.Option("20,30,40", help="seeds per arm to project to"),
         m: str = typer.Option("2", help="Holm's first step over this many tests (comma-separated)"),
         n_boot: int = typer.Option(400)) -> None:
    mults, news, ms = ([float(x) for x in items.split(",")], [int(x) for x in seeds.split(",")],
                       [int(x) for x in m.split(",")])
    sft, arms, draws = arm_tables(path, n_boot)
    gaps, n = {a: gap_draws(sft, frames, draws) for a, frames in arms.items()}, len(draws[0])
    print(f"{path}: {n} held-out items")
    for arm, g in gaps.items():
        total, noise = split(g)
        print(f"  {arm}: {g.shape[1]} runs, gap {g[0].mean():+.3f}; variance over runs {total:.5f}, of which the runs' "
              f"noise over items {noise:.5f} ({noise / total:.0%})")
    for comp in comparisons:
        a, b = comp.split(":")
        r = gaps[a].shape[1]
        (ta, na), (tb, nb) = split(gaps[a]), split(gaps[b])
        seed_part = (max(ta - na, 0.0) + max(tb - nb, 0.0)) / r
        noise_part = (na + nb) / r
        arm_item = max(0.0, float(np.var(gaps[a][1:].mean(1) - gaps[b][1:].mean(1))) - noise_part)
        collapse = -float(gaps[b][0].mean())
        print(f"{comp}: Var(Δ) at {r} runs = seed {seed_part:.5f} + run noise over items {noise_part:.5f} + arm x item "
              f"{arm_item:.5f}; {b}'s collapse {collapse:.3f}")
        raw_deltas(arms, draws, comp)
        print("  | items | seeds/arm | " + " | ".join(f"MDE, Holm over {m}" for m in ms) + " |")
        for mult in mults:
            for new in news:
                var = (seed_part + noise_part / mult) * r / new + arm_item / mult
                cells = [mde(var, 0.0, new, new, m) for m in ms]
                print(f"  | {round(n * mult)} | {new} | " + " | ".join(f"{c:.3f} ({c / collapse:.0%})" for c in cells)
                      + " |")


if __name__ == "__main__":
    app()
