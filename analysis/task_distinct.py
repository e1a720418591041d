"""The positive control for a diversity mechanism (reports/experiments/task-distinct-control, its plan's readings in
code): `distinct` (the checker plus a bonus for right values rare in their group) against `checker`, each at two
learning rates on the same GRPO seeds. Can the task track's instrument, distinct right values at an equal number of
right answers (speedrun.eval.rarefaction), see a mechanism that acts on diversity, apart from skill and from how far
the policy moved? First the manipulation check, then the call at matched KL, then the same-step readings.

    python analysis/task_distinct.py reports/experiments/task-distinct-control
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from speedrun import kept
from speedrun.eval.matched_kl import kl_weight
from speedrun.eval.rarefaction import narrowing, right_answers
from speedrun.eval.upstream import cluster_interval
from speedrun.typer_app import new_app, run_app

ARM, CONTROL = "distinct", "checker"
app = new_app()


def _ci(d: dict) -> str:
    return f"{d['value']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"


def load(root: Path) -> dict[str, dict]:
    """Each learning rate's sub-run (lr_<lr>/): its metrics, seeds, arm temperature and right answers per run."""
    out = {}
    for path in sorted(kept.glob(root, "lr_*/metrics/task.json")):
        sub = path.parent.parent
        m = kept.read_json(path)
        grpo = kept.read_json(sub / "metrics/task_grpo.json")
        a = kept.read_parquet(sub / "answers.parquet", columns=["model", "temperature", "item_id", "answer"])
        a = a[a["temperature"] == m["arm_temperature"]]
        right = right_answers(a)
        seeds = sorted({r["seed"] for r in grpo.values()})
        out[sub.name] = {"metrics": m, "grpo": grpo, "right": right, "seeds": seeds}
    if len(out) != 2:
        raise SystemExit(f"{root}: {len(out)} lr_<lr>/ sub-runs, the plan has two learning rates")
    return out


def _coverage(run: dict[str, list[str]]) -> float:
    return float(np.mean([len(set(v)) for v in run.values()]))


def per_seed(subs: dict[str, dict]) -> dict:
    """Per seed: each distinct run's readings against the same seed's checker runs at both learning rates, read at
    the distinct run's KL on the line (in log KL) through them, and the same-step readings."""
    (lo, a), (hi, b) = sorted(subs.items(), key=lambda kv: float(kv[0][3:]))
    seeds = sorted(set(a["seeds"]) & set(b["seeds"]))
    out: dict = {"matched": [], "matched_coverage": [], "extrapolated": 0, "same_step": {lo: [], hi: []},
                 "same_step_coverage": {lo: [], hi: []}, "kl": {lo: [], hi: []}, "gold_distinct": {lo: [], hi: []}}
    for s in seeds:
        runs = {name: {arm: (sub["right"][f"{arm}_s{s}"], sub["grpo"][f"{arm}_s{s}"]) for arm in (ARM, CONTROL)}
                for name, sub in subs.items()}
        k_lo, k_hi = runs[lo][CONTROL][1]["kl_end"], runs[hi][CONTROL][1]["kl_end"]
        matched, matched_cov = [], []
        for name in (lo, hi):
            right, g = runs[name][ARM]
            kl = g["kl_end"]
            w = kl_weight(kl, k_lo, k_hi)  # 0 at the low step's KL, 1 at the high's
            out["extrapolated"] += int(not 0 <= w <= 1)
            d_lo, d_hi = (narrowing(right, runs[c][CONTROL][0])["value"] for c in (lo, hi))
            matched.append((1 - w) * d_lo + w * d_hi)
            c_lo, c_hi = (_coverage(runs[c][CONTROL][0]) for c in (lo, hi))
            matched_cov.append(_coverage(right) - ((1 - w) * c_lo + w * c_hi))
            out["same_step"][name].append(d_lo if name == lo else d_hi)
            out["same_step_coverage"][name].append(_coverage(right) - _coverage(runs[name][CONTROL][0]))
            out["kl"][name].append((kl, runs[name][CONTROL][1]["kl_end"]))
            out["gold_distinct"][name].append(g["gold_distinct_end"] - runs[name][CONTROL][1]["gold_distinct_end"])
        out["matched"].append(float(np.mean(matched)))
        out["matched_coverage"].append(float(np.mean(matched_cov)))
    out["seeds"] = seeds
    return out


@app.command(help=__doc__.splitlines()[0])
def main(root: Annotated[Path, typer.Argument(help="task-distinct-control: lr_<lr>/ sub-runs with checker and "
                                                   "distinct on the same seeds")]) -> None:
    subs = load(root)
    r = per_seed(subs)
    print(f"{root.name}: seeds {r['seeds']}, learning rates {', '.join(n[3:] for n in subs)}\n\nManipulation check "
          "(read first): the bonus keeps more distinct right values per training group at the end (distinct − "
          "checker, per seed):\n")
    for name, v in r["gold_distinct"].items():
        print(f"- {name}: {_ci(cluster_interval(v))} ({sum(x > 0 for x in v)} of {len(v)} seeds above 0)")
    passed = all(cluster_interval(v)["value"] > 0 for v in r["gold_distinct"].values())
    m = cluster_interval(r["matched"])
    called = m["ci_low"] > 0 or m["ci_high"] < 0
    verdict = ("the instrument sees a diversity mechanism apart from skill and from how far the policy moved"
               if called and m["value"] > 0 else "called below 0: the bonus narrows (unexpected)" if called else
               f"the instrument does not see diversity apart from skill at this scale (MDE {m['mde']:.3f})")
    if not passed:
        verdict = f"not read (the manipulation check failed): {verdict}"
    print(f"\nThe call (the plan's primary): Δ distinct right values at an equal number of right answers, at the "
          f"distinct run's KL, mean of the two steps per seed: {_ci(m)}, p {m['p']:.4f}, MDE {m['mde']:.3f}; "
          f"{r['extrapolated']} of {2 * len(r['seeds'])} readings extrapolate beyond the checker's two KLs: "
          f"**{verdict}**\n")
    print("| reading (distinct − checker, t over seeds) | Δ [95% CI] | MDE |\n|---|---:|---:|")
    rows = [("at matched KL: distinct right values at equal right answers", r["matched"]),
            ("at matched KL: coverage at T = 1 (distinct right values, all answers)", r["matched_coverage"])]
    for name in subs:
        rows += [(f"{name}, same step: distinct right values at equal right answers", r["same_step"][name]),
                 (f"{name}, same step: coverage at T = 1", r["same_step_coverage"][name])]
    for name, v in rows:
        d = cluster_interval(v)
        print(f"| {name} | {_ci(d)} | {d['mde']:.3f} |")
    print("\nKL at the end, distinct / checker per seed: " + "; ".join(
        f"{name} " + ", ".join(f"{x:.3f}/{y:.3f}" for x, y in v) for name, v in r["kl"].items()))
    for name, sub in subs.items():
        c = sub["metrics"]["comparisons"].get(f"{ARM}:{CONTROL}", {})
        print(f"- {name}, the eval's own readings: " + ", ".join(
            f"{k} {_ci(c[k])}" for k in ("gap", "same_temperature", "matched", "matched_other", "pass@1") if k in c))


if __name__ == "__main__":
    run_app(app, None, "analysis/task_distinct.py")
