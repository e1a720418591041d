"""A comparison's result as numbers only, for `dvc metrics` (reports/metrics/diversity.json; eval/replot.py reads it
back): compare.evaluate's values per model, each comparison's pooled Δ with its interval and verdict, each variant
against the reference and at an equal reward, and the evaluation stage's checks."""
from __future__ import annotations

from speedrun.eval.compare import FAIL, PASS, UNSURE


def flat_metrics(result: dict) -> dict[str, dict[str, float]]:
    """Numbers only, for `dvc metrics`: values per model; per comparison the pooled Δ with its interval and
    verdict (+1 better / -1 worse / 0 not significant); each variant's reward gain over the reference."""
    code = {PASS: 1, FAIL: -1, UNSURE: 0}
    out: dict[str, dict[str, float]] = {m: dict(result["values"][m]) for m in result["models"]}
    for c in result["comparisons"]:
        d = c["delta"]
        out[f"{c['a']}_vs_{c['b']}"] = {
            "delta": {n: x["value"] for n, x in d.items()},
            "ci_low": {n: x["ci_low"] for n, x in d.items()},
            "ci_high": {n: x["ci_high"] for n, x in d.items()},
            "verdict": {n: code[x["verdict"]] for n, x in d.items() if x["verdict"] is not None},
            "reward_noninferior": int((c["noninferiority"] or {}).get("verdict") == "non-inferior")}
    # the frontier's axes and capability kept: every configured primary, also one the temperature control dropped
    shown = ["reward", "ref_loglik", "prompt_gain"] + list(result.get("configured_primary", result.get("primary", [])))
    bounds = (("", "value"), ("_ci_low", "ci_low"), ("_ci_high", "ci_high"))
    for v, by_metric in result.get("vs_reference", {}).items():
        out[f"{v}_vs_{result['reference']}"] = {f"{n}{suffix}": by_metric[n][key] for n in shown if n in by_metric
                                                 for suffix, key in bounds}
    er = result.get("equal_reward")  # each variant's gap below the SFT envelope, each comparison's at matched reward
    for name, d in (list(er["variants"].items()) + list(er["comparisons"].items())) if er else []:
        out[f"{name.replace(' - ', '_vs_')}_at_equal_reward"] = {f"{n}{suffix}": d[n][key] for n in shown if n in d
                                                                 for suffix, key in bounds}
    # the evaluation stage's checks and the gold task, where the result holds them
    if result["comparisons"]:
        first = out[f"{result['comparisons'][0]['a']}_vs_{result['comparisons'][0]['b']}"]
        first |= {f"manipulation_{k}": v for k, v in result.get("manipulation", {}).items()
                  if isinstance(v, (int, float))}
        first |= {f"mde_share_{n}": d["mde_share"] for n, d in result.get("power", {}).items()
                  if d["mde_share"] is not None}
    task = result.get("task")
    if task:
        for m, v in task["values"].items():
            out[m] |= {f"task_{k}": x for k, x in v.items()}
        for v, d in task["vs_reference"].items():
            out[f"{v}_vs_{result['reference']}"] |= {f"task_{k}{suffix}": d[k][key] for k in task["metrics"]
                                                     for suffix, key in bounds}
    return out
