"""Calibrates the narrowing estimators (speedrun.eval.rarefaction) on simulated task-track runs where the truth is
known: no narrowing (both arms draw their right answers from one process) and a known narrowing. Prints each
estimator's mean reading and its spread over replicate experiments.

The process, shaped like the task track (113 items, 16 samples per item, 2 runs per arm): each item has a base
distribution over its right values (Dirichlet(0.5) over 6); each run draws its own per-item distribution around it
(Dirichlet(κ x base): a smaller κ, runs that differ more, as GRPO runs from one model do); a run gives Binomial(16, p)
right answers per item. The treatment arm has fewer right answers (p 0.15 against the control's 0.45).

- pooled: the treatment run's distinct values minus the pooled control runs' right answers thinned to its count
  (analysis/task_rm_decomposition.py's "narrower" part);
- symmetric: each treatment run against each control run, both thinned to the smaller count (rarefaction.narrowing).

    python bench/rarefaction_bias.py
"""
from __future__ import annotations

import numpy as np

from speedrun.eval.rarefaction import expected_distinct, narrowing

ITEMS, SAMPLES, VALUES, RUNS, REPLICATES = 113, 16, 6, 2, 200


def _run(rng: np.random.Generator, base: np.ndarray, kappa: float, p: float, squeeze: float) -> dict[str, list[str]]:
    """One run: item → its right answers' values. squeeze > 1 sharpens the run's distributions (narrowing)."""
    out = {}
    for i, b in enumerate(base):
        q = rng.dirichlet(kappa * b) ** squeeze
        q /= q.sum()
        n = rng.binomial(SAMPLES, p)
        out[f"i{i}"] = [str(v) for v in rng.choice(VALUES, size=n, p=q)]
    return out


def _experiment(rng: np.random.Generator, kappa: float, squeeze: float) -> tuple[float, float]:
    base = rng.dirichlet(np.full(VALUES, 0.5), size=ITEMS) + 1e-9
    control = [_run(rng, base, kappa, 0.45, 1.0) for _ in range(RUNS)]
    treatment = [_run(rng, base, kappa, 0.15, squeeze) for _ in range(RUNS)]
    pooled = []
    for t in treatment:
        for item, values in t.items():
            pool = [v for c in control for v in c[item]]
            counts = [pool.count(v) for v in set(pool)]
            pooled.append(len(set(values)) - expected_distinct(counts, len(values)))
    symmetric = [narrowing(t, c)["value"] for t in treatment for c in control]
    return float(np.mean(pooled)), float(np.mean(symmetric))


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"{ITEMS} items x {SAMPLES} samples, {RUNS} runs per arm, {REPLICATES} replicate experiments each")
    print("| truth | κ (run spread: smaller = wider) | pooled: mean (SD) | symmetric: mean (SD) |")
    print("|---|---:|---:|---:|")
    for squeeze, truth in ((1.0, "no narrowing"), (2.0, "narrower (q^2)")):
        for kappa in (1000.0, 20.0, 5.0):
            r = np.array([_experiment(rng, kappa, squeeze) for _ in range(REPLICATES)])
            print(f"| {truth} | {kappa:g} | {r[:, 0].mean():+.3f} ({r[:, 0].std(ddof=1):.3f}) | "
                  f"{r[:, 1].mean():+.3f} ({r[:, 1].std(ddof=1):.3f}) |")


if __name__ == "__main__":
    main()
