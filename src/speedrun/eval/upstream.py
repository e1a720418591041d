"""A task-track effect over several upstream models (task SFT seeds, each with its own task RM): each upstream seed's
run of the track is one experiment (`dvc exp run -S task.sft.seed=<s>`, kept by speedrun.experiment into
<dir>/sft_<s>/); the effect per upstream seed is that run's own comparison (task_compare.compare_arms, in its
metrics/task.json), and the pooled effect is their mean with a Student-t interval over the upstream seeds: the
upstream model is the unit, so the interval counts the variation between SFT models that one-upstream designs leave
out (and is wide with few of them: t(0.975, 2) = 4.30).

    python -m speedrun.eval.upstream reports/experiments/task-collapse-upstream
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import numpy as np
import pandas as pd
import typer

from speedrun import kept
from speedrun.eval.stats import ALPHA, holm, t_cdf, t_ppf
from speedrun.typer_app import new_app, run_app

READINGS = ("gap", "same_temperature", "matched", "matched_other")
app = new_app()


def cluster_interval(values: list[float], power: float = 0.8) -> dict:
    """Mean of per-upstream estimates, a 95% Student-t interval and two-sided p over them (df = n − 1), and the MDE
    at `power` for this many upstream seeds: (t(0.975) + t(power)) x SE."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        raise ValueError(f"an interval over upstream seeds needs at least 2 of them, got {len(x)}")
    df, mean = len(x) - 1, float(x.mean())
    se = float(x.std(ddof=1) / math.sqrt(len(x)))
    q = t_ppf(0.975, df)
    p = 2.0 * (1.0 - t_cdf(abs(mean) / se, df)) if se > 0 else (0.0 if mean else 1.0)
    return {"value": round(mean, 4), "ci_low": round(mean - q * se, 4), "ci_high": round(mean + q * se, 4),
            "se": round(se, 5), "p": round(p, 4), "mde": round((q + t_ppf(power, df)) * se, 4), "upstream": len(x),
            "per_upstream": [round(float(v), 4) for v in x]}


def two_way_interval(deltas: np.ndarray, n_boot: int = 2000, seed: int = 0) -> dict:
    """Mean of an [upstream, item] matrix of per-item effects with a bootstrap that resamples upstream models and
    items independently: the 113 items are shared by every upstream model, so an interval over upstream models alone
    leaves their draw out. Resampling both ways counts the residual twice (conservative, as the pigeonhole bootstrap
    is); the interval and p take that SE with Student-t(upstream − 1), as the interval over upstream models does;
    `widening` is the SE over that interval's."""
    if deltas.ndim != 2 or min(deltas.shape) < 2:
        raise ValueError(f"two_way_interval: need an [upstream >= 2, item >= 2] matrix, got shape {deltas.shape}")
    rng = np.random.default_rng(seed)
    u, i = deltas.shape
    boot = np.array([deltas[rng.integers(0, u, u)][:, rng.integers(0, i, i)].mean() for _ in range(n_boot)])
    se, t_se = float(boot.std(ddof=1)), float(deltas.mean(1).std(ddof=1) / math.sqrt(u))
    mean, q = float(deltas.mean()), t_ppf(1 - ALPHA / 2, u - 1)
    p = 2.0 * (1.0 - t_cdf(abs(mean) / se, u - 1)) if se > 0 else (0.0 if mean else 1.0)
    return {"value": round(mean, 4), "ci_low": round(mean - q * se, 4), "ci_high": round(mean + q * se, 4),
            "se": round(se, 5), "p": round(p, 4), "widening": round(se / t_se, 3) if t_se > 0 else None, "items": i,
            "n_boot": n_boot}


def item_deltas(sub: Path, treatment: str, control: str, temperature: float) -> pd.Series:
    """One sub-run's per-item Δ coverage (distinct right answers) at `temperature`: the treatment's runs' mean minus
    the control's, from its answers.parquet (item_id order)."""
    a = kept.read_parquet(sub / "answers.parquet", columns=["model", "temperature", "item_id", "answer"])
    a = a[a["temperature"] == temperature]

    def coverage(arm: str) -> pd.Series:
        rows = a[a["model"].str.fullmatch(rf"{arm}_s\d+")]
        if rows.empty:
            raise SystemExit(f"{sub / 'answers.parquet'}: no answers of {arm} at T = {temperature}")
        return rows.groupby(["model", "item_id"])["answer"].nunique().groupby("item_id").mean()
    return coverage(treatment) - coverage(control)


def pool(root: Path, two_way: bool = False) -> dict:
    """Every sub-run <root>/sft_<seed>/metrics/task.json pooled: per comparison, each reading's interval over the
    upstream seeds, Holm over the comparisons' primaries; per arm, its gap and its gap minus the control's; the
    manipulation checks' inputs (pass@1 per comparison, the RM arm's proxy reward start and end per run)."""
    subs = kept.glob(root, "sft_*/metrics/task.json")  # files, or members of root/results.zip
    if len(subs) < 2:
        raise SystemExit(f"{root}: {len(subs)} sft_<seed>/metrics/task.json, need at least 2 upstream seeds")
    results = {p.parent.parent.name: kept.read_json(p) for p in subs}
    first = next(iter(results.values()))
    out: dict = {"upstream": list(results), "comparisons": {}, "arms": {}, "training": {}}
    for comp, c in first["comparisons"].items():
        primary = c.get("primary", "gap")
        res = {"treatment": c["treatment"], "control": c["control"], "primary": primary}
        for k in READINGS + ("pass@1",):
            if all(k in r["comparisons"][comp] for r in results.values()):
                res[k] = cluster_interval([r["comparisons"][comp][k]["value"] for r in results.values()])
        gaps = [r["frontier_gap"][c["control"]]["gap"] for r in results.values()]
        for k in READINGS:  # the control's own gap below the envelope: what every reading's MDE is a share of
            if k in res:
                res[k]["collapse"] = round(-float(np.mean(gaps)), 4)
        if two_way and "same_temperature" in res:  # every sub-run's answers: items and upstream models resampled
            d = [item_deltas(p.parent.parent, c["treatment"], c["control"], r["arm_temperature"])
                 for p, r in zip(subs, results.values())]
            if any(not x.index.equals(d[0].index) for x in d):
                raise SystemExit(f"{root}: the sub-runs' answers cover different items: no items x upstream matrix")
            res["same_temperature"]["two_way"] = two_way_interval(np.stack([x.to_numpy() for x in d]))
        readings = {k: res[k]["value"] for k in READINGS if k in res}
        res["range"] = {"low": min(readings.values()), "high": max(readings.values()), "readings": readings}
        out["comparisons"][comp] = res
    adjusted = holm({c: r[r["primary"]]["p"] for c, r in out["comparisons"].items()})
    for c, r in out["comparisons"].items():
        g = r[r["primary"]]
        g["p_holm"] = round(adjusted[c], 4)
        g["called"] = bool(adjusted[c] <= ALPHA)
        g["mde_share"] = round(g["mde"] / abs(g["value"]), 4) if g["value"] else None
    for arm in first["frontier_gap"]:
        g = [r["frontier_gap"][arm] for r in results.values()]
        out["arms"][arm] = {"gap": cluster_interval([x["gap"] for x in g])}
        if all("minus_control" in x for x in g):
            out["arms"][arm]["minus_control"] = cluster_interval([x["minus_control"]["gap"] for x in g])
        out["training"][arm] = {u: r["training"][arm] for u, r in results.items()}
    return out


def markdown(pooled: dict) -> str:
    """The pooled result as the tables an experiment README shows."""
    def ci(d: dict) -> str:
        return f"{d['value']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"

    names = {"gap": "frontier gap", "same_temperature": "same temperature", "matched": "equal pass@1 (control's)",
             "matched_other": "equal pass@1 (treatment's)", "pass@1": "pass@1"}
    lines = [f"Pooled over {len(pooled['upstream'])} upstream seeds ({', '.join(pooled['upstream'])}); Student-t "
             "interval over them.", "", "| comparison | reading | Δ [95% CI] | per upstream seed | p | MDE |",
             "|---|---|---:|---|---:|---:|"]
    for comp, r in pooled["comparisons"].items():
        for k in (*READINGS, "pass@1"):
            if k in r:
                d = r[k]
                call = (f" (Holm {d['p_holm']:.3f}{', **called**' if d['called'] else ''})" if "p_holm" in d else "")
                lines.append(f"| {comp} | {names[k]}{' (primary)' if k == r['primary'] else ''} | {ci(d)} | "
                             f"{', '.join(f'{v:+.3f}' for v in d['per_upstream'])} | {d['p']:.3f}{call} | "
                             f"{d['mde']:.3f} |")
        if "two_way" in r.get("same_temperature", {}):
            w = r["same_temperature"]["two_way"]
            lines.append(f"| {comp} | same temperature, bootstrap over upstream models and items ({w['n_boot']}) | "
                         f"{ci(w)} | SE {w['widening']:.2f}x the t interval's | {w['p']:.3f} | |")
        lines.append(f"| {comp} | range of the coverage readings | {r['range']['low']:+.3f} to "
                     f"{r['range']['high']:+.3f} | | | |")
    lines += ["", "| arm | gap below the envelope [95% CI] | per upstream seed | gap − shuffled's [95% CI] |",
              "|---|---:|---|---:|"]
    for arm, a in pooled["arms"].items():
        mc = a.get("minus_control")
        lines.append(f"| {arm} | {ci(a['gap'])} | {', '.join(f'{v:+.3f}' for v in a['gap']['per_upstream'])} | "
                     f"{ci(mc) if mc else '—'} |")
    return "\n".join(lines) + "\n"


@app.command(help=__doc__.splitlines()[0])
def command(root: Annotated[Path, typer.Argument(help="the experiment folder holding sft_<seed>/ sub-runs")]) -> None:
    pooled = pool(root, two_way=True)
    kept.write_json(root / "metrics/task.json", pooled)
    print(markdown(pooled))


def main(argv: list[str] | None = None) -> None:
    run_app(app, argv, "python -m speedrun.eval.upstream")


if __name__ == "__main__":
    main()
