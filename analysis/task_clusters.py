"""Where density sampling's coverage loss comes from, cluster by cluster, across the committed 609-item runs.

Density sampling moves GRPO's training draws between the task's clusters (off numbers, onto letters and months). If
its coverage loss were only the evaluation mix (88% of the held-out items are numbers, trained on less), it would
show in numbers alone and the clusters trained on more would gain. Per experiment and cluster this prints: the
clusters' share of the training draws under uniform sampling (the train items) and under density's weights, and
density − uniform at the GRPO temperature in pass@1 and coverage@16 (stats.pooled_delta over seeds and items, the
items resampled within the cluster), beside the frontier gap's Δ the experiment's report already holds; then uniform
GRPO against the task SFT model at the same temperature (what training does to each cluster). Last, each cluster's
Δ pooled over the experiments: weighted by the inverse of each run's between-seed variance (the seeds are disjoint)
with the item variance kept whole, not divided, since every run is read on the same items. A post-hoc, descriptive
reading of runs already reported (secondary, unadjusted); the runs differ in density's cap (10, then 12).

    python analysis/task_clusters.py                  # the four committed 609-item density experiments
    python analysis/task_clusters.py --arm balanced   # group-balanced sampling: the two of them that ran it
"""
import math
from pathlib import Path

import numpy as np
import pandas as pd
import typer

from speedrun import kept
from speedrun.typer_app import new_app

from speedrun.data import task
from speedrun.eval.stats import pooled_delta
from speedrun.eval.task_track import curve_columns, item_draws, per_item

EXPERIMENTS = ("task-density-609-items", "task-density-609-items-replication", "task-density-matched",
               "task-density-matched-replication")
ROOT = Path("reports/experiments")


def cluster_columns(answers: pd.DataFrame, models: list[str], temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """[run, column (pass@1, coverage), item] of the models' answers at one temperature, and each item's cluster."""
    at_t = answers[answers.temperature == temperature]
    tabs = [per_item(at_t[at_t.model == m], (1,)) for m in models]
    return curve_columns(tabs), tabs[0]["cluster"].to_numpy()


def delta(a: np.ndarray, b: np.ndarray, rows: np.ndarray, col: int, n_boot: int, tag: str,
          fixed_b: bool = False) -> dict:
    """Δ of one column's cluster mean, a − b ([run, column, item] each), items resampled within `rows`."""
    draws = [rows[d] for d in item_draws(len(rows), n_boot, 0, tag)]
    pa, pb = (np.array([x[:, col, r].mean(-1) for r in draws]) for x in (a, b))
    return pooled_delta(pa[0], pb[0], pa[1:], pb[1:], fixed_b=fixed_b)


def pooled(ds: list[dict]) -> tuple[float, float, float]:
    """Estimate and 95% normal interval over experiments: inverse between-seed-variance weights, item variance whole."""
    w = np.array([1.0 / d["between_var"] for d in ds])
    value = float(np.dot(w, [d["value"] for d in ds]) / w.sum())
    var = 1.0 / w.sum() + float(np.mean([d["prompt_var"] for d in ds]))
    return value, value - 1.96 * math.sqrt(var), value + 1.96 * math.sqrt(var)


def ci(d: dict) -> str:
    return f"{d['value']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"


app = new_app()


@app.command(help=__doc__)
def main(experiments: list[str] = typer.Argument(list(EXPERIMENTS), help="folders under reports/experiments"),
         arm: str = typer.Option("density", help="the sampling arm read against uniform (density, balanced)"),
         n_boot: int = typer.Option(400)) -> None:
    train = task.cluster_sizes(task.items(0.1, 0.4, 215), "train")  # the 609-item set: number_max 215, eval_frac 0.4
    shares = {c: n / sum(train.values()) for c, n in train.items()}
    pooled_in: dict[tuple[str, str], list[dict]] = {}
    for name in experiments:
        folder = ROOT / name
        metrics = kept.read_json(folder / "metrics" / "task.json")
        t = float(metrics["arm_temperature"])
        if f"{arm}:checker" not in metrics["comparisons"]:
            print(f"\n{name}: no {arm} arm")
            continue
        weights = metrics["manipulation"][arm]["shares_weights"]
        gaps = metrics["comparisons"][f"{arm}:checker"]["clusters"]
        answers = kept.read_parquet(folder / "answers.parquet")
        runs = {x: sorted(m for m in answers.model.unique() if m.rsplit("_s", 1)[0] == x) for x in (arm, "checker")}
        cols = {x: cluster_columns(answers, ms, t)[0] for x, ms in runs.items()}
        sft, clusters = cluster_columns(answers, ["task_sft"], t)
        print(f"\n{name}: {len(runs[arm])} + {len(runs['checker'])} runs, {len(clusters)} held-out items, T {t}")
        print(f"  cluster  | draws: uniform → {arm} | {arm} − uniform: pass@1, coverage@16, frontier gap "
              "| uniform − SFT: pass@1, coverage@16")
        for c in sorted(shares, key=lambda x: -shares[x]):
            rows = np.flatnonzero(clusters == c)
            dd = [delta(cols[arm], cols["checker"], rows, i, n_boot, f"clusters/{c}") for i in range(2)]
            dg = gaps[c]
            ds = [delta(cols["checker"], sft, rows, i, n_boot, f"clusters/{c}", fixed_b=True) for i in range(2)]
            for key, d in zip(("pass@1", "coverage", "gap"), (*dd, dg)):
                pooled_in.setdefault((c, key), []).append(d)
            print(f"  {c:8s} | {shares[c]:.3f} → {weights[c]:.3f} (×{weights[c] / shares[c]:.2f}) | "
                  f"{ci(dd[0])}, {ci(dd[1])}, {ci(dg)} | {ci(ds[0])}, {ci(ds[1])}")
    n = len(next(iter(pooled_in.values())))
    print(f"\npooled over {n} experiments (inverse between-seed variance; the item variance whole):")
    for (c, key), ds in pooled_in.items():
        v, lo, hi = pooled(ds)
        print(f"  {c:8s} {key:9s} {v:+.3f} [{lo:+.3f}, {hi:+.3f}]   per experiment: "
              + ", ".join(f"{d['value']:+.3f}" for d in ds))


if __name__ == "__main__":
    app()
