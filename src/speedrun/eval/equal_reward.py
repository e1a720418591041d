"""Diversity at an equal reward: each GRPO run read against the SFT model's temperature envelope.

Sampling the SFT model colder raises its reward and narrows its answers (sharpening); GRPO has narrowed them beyond
that only where a run is less diverse than the SFT model at the same reward. The SFT model sampled at the control
temperatures gives points (reward, diversity) per metric; the envelope at reward r is the most diversity it reaches
at reward r or higher, interpolated in temperature (eval/envelope.py, the task track's frontier with reward for
pass@1). A run's gap = its value - the envelope at its own reward, signed so that > 0 reads "more diverse than the
SFT model at that reward" (for a lower-is-better metric, less of it). Above the highest reward any temperature
reaches there is no curve: the reading is extended along the envelope's two highest-reward points and flagged;
`outside` is the share of bootstrap draws in which a run lies there. Every model and temperature is scored on the
same bootstrap draws (compare.py); a variant's gap pools its runs (stats.pooled_delta against 0, the SFT model
fixed), and a comparison a - b is the difference of the arms' gaps, each read at its own reward: diversity at matched
reward."""
from __future__ import annotations

import numpy as np

from speedrun.eval import stats
from speedrun.eval.envelope import envelope_at

NOT_DIVERSITY = ("reward", "ref_loglik", "prompt_gain")  # directed metrics that are not read at an equal reward


def read_names(names: list[str], metric_by_name: dict) -> list[str]:
    """The metrics read against the envelope: every directed one but the reward and the capability checks."""
    return [n for n in names if metric_by_name[n].good != "neutral" and n not in NOT_DIVERSITY]


def run_gaps(values: dict, boot: dict, temperatures: dict[str, float], runs: list[str], names: list[str],
             all_names: list[str], sign: dict[str, float]) -> tuple[dict, dict, dict]:
    """Per run: its gap per metric on the whole pool, [n_boot, metric] on the shared draws, and the share of draws
    (and the whole pool, as 'point') in which its reward lies above every temperature's."""
    r_col = all_names.index("reward")
    temps = sorted(temperatures, key=temperatures.get)
    t = np.asarray([temperatures[m] for m in temps])
    n_boot = next(iter(boot.values())).shape[0]
    point = {r: {} for r in runs}
    gap_boot = {r: np.zeros((n_boot, len(names))) for r in runs}
    outside = {r: {"point": False, "share": 0.0} for r in runs}
    for j, n in enumerate(names):
        col, s = all_names.index(n), sign[n]
        pts = np.stack([t, [values[m]["reward"] for m in temps], [s * values[m][n] for m in temps]], 1)
        env, out = envelope_at(pts, np.asarray([values[r]["reward"] for r in runs]), extend=True)
        for i, r in enumerate(runs):
            point[r][n] = float(s * values[r][n] - env[i])
            outside[r]["point"] = bool(out[i])
        for b in range(n_boot):
            pts = np.stack([t, [boot[m][b, r_col] for m in temps], [s * boot[m][b, col] for m in temps]], 1)
            env, out = envelope_at(pts, np.asarray([boot[r][b, r_col] for r in runs]), extend=True)
            for i, r in enumerate(runs):
                gap_boot[r][b, j] = s * boot[r][b, col] - env[i]
                if j == 0:
                    outside[r]["share"] += float(out[i]) / n_boot
    return point, gap_boot, outside


def equal_reward(values: dict, boot: dict, temperatures: dict[str, float], variants: dict[str, list[str]],
                 comparisons: list[tuple[str, str]], all_names: list[str], metric_by_name: dict) -> dict:
    """values/boot: every model's metrics (the temperature models too) on the whole pool and the shared draws, boot
    [n_boot, metric] in all_names order. JSON-ready: the envelope's points, each run's gap, each variant's pooled gap
    against 0 and each comparison's difference of gaps."""
    names = read_names(all_names, metric_by_name)
    sign = {n: -1.0 if metric_by_name[n].good == "lower" else 1.0 for n in names}
    runs = [r for rs in variants.values() for r in rs]
    point, gap_boot, outside = run_gaps(values, boot, temperatures, runs, names, all_names, sign)
    temps = sorted(temperatures, key=temperatures.get)
    envelope = {n: [[temperatures[m], values[m]["reward"], values[m][n]] for m in temps] for n in ["reward"] + names}

    def pooled(a: list[str], b: list[str] | None) -> dict:
        out = {}
        for j, n in enumerate(names):
            pa, ba = np.asarray([point[r][n] for r in a]), np.stack([gap_boot[r][:, j] for r in a], 1)
            if b is None:
                d = stats.pooled_delta(pa, np.zeros(1), ba, np.zeros((ba.shape[0], 1)), fixed_b=True)
            else:
                d = stats.pooled_delta(pa, np.asarray([point[r][n] for r in b]), ba,
                                       np.stack([gap_boot[r][:, j] for r in b], 1))
            out[n] = {k: d[k] for k in ("value", "ci_low", "ci_high", "p", "seed_variance")}
        return out

    return {"temperatures": [temperatures[m] for m in temps], "metrics": names, "envelope": envelope,
            "runs": {r: {"gap": point[r], "outside": outside[r]} for r in runs},
            "variants": {v: pooled(rs, None) for v, rs in variants.items()},
            "comparisons": {f"{a} - {b}": pooled(variants[a], variants[b]) for a, b in comparisons}}


def _cell(d: dict, fmt: str) -> str:
    return f"{fmt.format(d['value'])} [{fmt.format(d['ci_low'])}, {fmt.format(d['ci_high'])}]"


def equal_reward_section(er: dict, shown: list[str], metric_by_name: dict) -> str:
    """The report's section: each variant's gap and each comparison's difference of gaps on the shown metrics (those
    the temperature control passed), and on how many of them each interval lies below or above 0."""
    shown = [n for n in shown if n in er["metrics"]]
    temps = ", ".join(f"{t:g}" for t in er["temperatures"])
    lines = ["## Diversity at an equal reward (the SFT model's temperature envelope)", "",
             f"Each run against the most diversity the SFT model reaches, sampled at T = {temps}, at the run's own "
             "reward or higher (eval/equal_reward.py). Gap > 0: more diverse than the SFT model at that reward (for "
             "a lower-is-better metric, less of it); < 0 with its interval: narrowed beyond sharpening. A comparison "
             "a − b is the difference of the gaps: the arms read at matched reward.", ""]
    above = [f"{r} ({o['outside']['share']:.0%} of draws)" for r, o in er["runs"].items() if o["outside"]["share"] > 0]
    if above:
        lines += ["Above every temperature's reward (read on the line through the envelope's two highest-reward "
                  "points, an extrapolation that decides these readings): " + ", ".join(above) + ".", ""]
    rows = list(er["variants"].items()) + list(er["comparisons"].items())
    lines += ["| metric | " + " | ".join(name for name, _ in rows) + " |", "|---|" + "---|" * len(rows)]
    for n in shown:
        fmt = metric_by_name[n].fmt
        lines.append(f"| {metric_by_name[n].label} | " + " | ".join(_cell(d[n], fmt) for _, d in rows) + " |")
    if shown:
        lines.append("")
        for name, d in rows:
            below, above = sum(d[n]["ci_high"] < 0 for n in shown), sum(d[n]["ci_low"] > 0 for n in shown)
            lines.append(f"- {name}: interval below 0 on {below} of these {len(shown)} metrics, above 0 on {above}.")
    return "\n".join(lines)
