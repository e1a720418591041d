"""The task track's arm comparisons (task.eval.comparisons): does a sampling arm keep more right answers than uniform
sampling with the same reward? Each comparison is read several ways, each with stats.pooled_delta's interval over
seeds and items, and the effect is reported as the range over the readings, not the one that reads best:
- gap: Δ of the frontier gap (coverage beyond the task SFT model's envelope at each run's own pass@1,
  task_track.gap_draws);
- same_temperature: Δ coverage at the GRPO temperature (no frontier, no interpolation; it leaves any pass@1
  difference in);
- matched (at task.eval.matched_at's arm's pass@1) and matched_other (at the other arm's): Δ coverage at equal pass@1,
  each run read on its own temperature curve (task_track.matched_draws; runs sampled at task.eval.run_temperatures).
task.eval.primary names the one that is Holm-corrected and called: where the SFT frontier is steep, the gap moves
with an arm's pass@1 difference times the frontier's slope on every resample of the items; the matched reading has
no frontier in the difference."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from speedrun.eval.stats import ALPHA, holm, mde, non_inferiority, permutation_p, pooled_delta, runs_needed
from speedrun.eval.task_track import column_mean, curve_columns, gap_draws, item_draws, matched_draws, per_item


def compare_arms(sft: dict[float, pd.DataFrame], arms: dict[str, list[pd.DataFrame]], comparisons: list[str],
                 n_boot: int, seed: int, k_values: tuple[int, ...], margin_share: float, mde_share: float,
                 curves: dict[str, list[dict[float, pd.DataFrame]]] | None = None, arm_temperature: float = 1.0,
                 primary: str = "gap", matched_at: str = "control") -> dict:
    """Each "a:b" of `comparisons` (a treatment against b, its uniform-sampling arm): Δ of the frontier gap overall
    (the primary unless `primary` is "matched": Holm over the comparisons) and per cluster (each cluster's own
    frontier; secondary), with stats.pooled_delta's interval (seeds + items), a permutation p over runs, the MDE at
    these seeds and the seeds per arm for an MDE of `mde_share` x b's collapse (its gap below the frontier). pass@1
    under non-inferiority: margin = margin_share x b's pass@1 gain over the SFT model at T = 1 (0 where there is no
    gain). With `curves` (per arm and run, its answers at each temperature, arm_temperature among them): the matched
    reading too, read at the mean pass@1 at arm_temperature of b (matched_at "control") or a ("treatment"), and
    `primary` ("gap" or "matched") is the one Holm-corrected and called."""
    if primary == "matched" and not curves:
        raise ValueError("the matched primary needs every run sampled at several temperatures "
                         "(task.eval.run_temperatures)")
    tables = {t: per_item(a, k_values) for t, a in sft.items()}
    runs = {arm: [per_item(a, k_values) for a in frames] for arm, frames in arms.items()}
    first = next(iter(tables.values()))
    groups = {"all": np.arange(len(first))} | {c: np.flatnonzero(first["cluster"].to_numpy() == c)
                                                for c in sorted(first["cluster"].unique())}
    sft1 = column_mean(tables.get(1.0, first), groups["all"], "pass@1")
    tabs = curves and {x: [{t: per_item(a, k_values) for t, a in run.items()} for run in runs_]
                       for x, runs_ in curves.items()}
    out = {}
    for comp in comparisons:
        a, b = comp.split(":")
        res = {"treatment": a, "control": b, "clusters": {}}
        for name, rows in groups.items():
            draws = [rows[d] for d in item_draws(len(rows), n_boot, seed, f"task_compare/{name}")]
            ga, gb = (gap_draws(tables, runs[x], draws) for x in (a, b))
            d = _delta(ga, gb)
            if name != "all":
                res["clusters"][name] = d
                continue
            collapse = -float(gb[0].mean())
            m = len(comparisons)
            res["gap"] = _reading(d, ga[0], gb[0], collapse, m, mde_share, seed)
            cols = {x: curve_columns(runs[x]) for x in (a, b)}
            pa, pb = (np.array([[float(c[0][r].mean()) for c in cols[x]] for r in draws]) for x in (a, b))
            ca, cb = (np.array([[float(c[1][r].mean()) for c in cols[x]] for r in draws]) for x in (a, b))
            res["same_temperature"] = _reading(_delta(ca, cb), ca[0], cb[0], collapse, m, mde_share, seed)
            if tabs:
                for at in (matched_at, "treatment" if matched_at == "control" else "control"):
                    ma, ext = matched_draws({a: tabs[a], b: tabs[b]}, a if at == "treatment" else b, arm_temperature,
                                            draws)
                    res["matched" if at == matched_at else "matched_other"] = _reading(
                        _delta(ma[a], ma[b]), ma[a][0], ma[b][0], collapse, m, mde_share, seed) | {
                        "extended_share": round(ext, 4), "at": at}
            readings = {k: res[k]["value"] for k in ("gap", "same_temperature", "matched", "matched_other") if k in res}
            res["range"] = {"low": min(readings.values()), "high": max(readings.values()), "readings": readings}
            gain = float(pb[0].mean()) - sft1
            margin = margin_share * max(gain, 0.0)
            p1 = _delta(pa, pb)
            res["pass@1"] = p1 | {"gain": round(gain, 4), "margin": round(margin, 4),
                                  "verdict": non_inferiority(p1["ci_low"], p1["ci_high"], margin)}
        out[comp] = res
    adjusted = holm({c: r[primary]["p"] for c, r in out.items()})
    for c, r in out.items():
        r["primary"] = primary
        r[primary]["p_holm"] = round(adjusted[c], 4)
        r[primary]["called"] = bool(adjusted[c] <= ALPHA)
    return out


def _reading(d: dict, point_a: np.ndarray, point_b: np.ndarray, collapse: float, m: int, mde_share: float,
             seed: int) -> dict:
    """One reading's Δ with its permutation p over runs, the MDE at these seeds (Holm's first step over m) and the
    seeds per arm for an MDE of mde_share x the control's collapse."""
    r = len(point_a)
    return d | {"collapse": round(collapse, 4), "permutation": permutation_p(point_a, point_b, seed=seed),
                "mde": round(mde(d["between_var"], d["prompt_var"], r, r, m), 4),
                "seeds_needed": runs_needed(d["between_var"], d["prompt_var"], r, mde_share * collapse, m)
                if collapse > 0 else None}


def _delta(a: np.ndarray, b: np.ndarray) -> dict:
    """stats.pooled_delta of two [draw, run] matrices (row 0 the full item set), rounded for the JSON."""
    d = pooled_delta(a[0], b[0], a[1:], b[1:])
    return {k: ((round(v, 6) if math.isfinite(v) else None) if isinstance(v, float) else v) for k, v in d.items()}
