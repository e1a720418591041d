"""What the evaluation can see. Can a metric see diversity at all? The SFT model sampled at several temperatures is a
planted, known ordering (a higher temperature spreads every next-token distribution): a diversity metric must order
the temperatures (Spearman's rho >= MIN_RHO in its good direction) before it may serve as a primary outcome. How
small a difference can the design detect? The MDE of each primary, as a share of GRPO's own collapse."""
from __future__ import annotations

import numpy as np
import pandas as pd

from speedrun.eval import stats
from speedrun.eval.compare import METRIC_BY_NAME, evaluate

MIN_RHO = 0.9


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rho (average ranks for ties); 0 when either side is constant."""
    rx, ry = pd.Series(x).rank().to_numpy(), pd.Series(y).rank().to_numpy()
    if rx.std() == 0 or ry.std() == 0:
        return 0.0
    return float(np.corrcoef(rx, ry)[0, 1])


def temperature_ordering(samples: pd.DataFrame, temperatures: dict[str, float], metrics: list[str],
                         vocab: list[int], seed: int) -> dict:
    """samples: one model name per temperature ({name: T}). Per metric: its value at each temperature and rho of
    (metric signed so that higher = more diverse) against temperature; passes when rho >= MIN_RHO."""
    res = evaluate(samples, {}, [], reference=None, n_boot=1, seed=seed, ead_vocab_size=vocab,
                   where="temperature control samples")
    names = sorted(temperatures, key=temperatures.get)
    out = {"temperatures": [temperatures[n] for n in names], "min_rho": MIN_RHO, "metrics": {}}
    for m in metrics:
        values = [res["values"][n][m] for n in names]
        sign = -1.0 if METRIC_BY_NAME[m].good == "lower" else 1.0
        rho = spearman([sign * v for v in values], out["temperatures"])
        out["metrics"][m] = {"values": values, "rho": rho, "passes": rho >= MIN_RHO}
    return out


def ordering_section(control: dict, configured: list[str], kept: list[str]) -> str:
    temps = control["temperatures"]
    lines = ["## Can the metrics see diversity? (temperature control)", "",
             f"The SFT model sampled on the same held-out prompts at temperatures {', '.join(map(str, temps))}: a "
             f"higher temperature is more diverse by construction. A primary metric must order them (Spearman "
             f"rho >= {control['min_rho']} in its good direction); one that fails leaves the primary list.", "",
             "| metric | " + " | ".join(f"T={t}" for t in temps) + " | rho | role |",
             "|---|" + "---:|" * len(temps) + "---:|---|"]
    for m, d in control["metrics"].items():
        role = ("primary" if m in kept else "**dropped from primary**") if m in configured else "secondary"
        lines.append(f"| {METRIC_BY_NAME[m].label} | " + " | ".join(f"{v:.4f}" for v in d["values"])
                     + f" | {d['rho']:.2f} | {role} |")
    return "\n".join(lines)


def power_table(result: dict, comparison: dict, collapse_variant: str, targets: tuple[float, ...] = (0.5, 0.3)
                ) -> dict:
    """Per primary: GRPO's own collapse (collapse_variant − reference), the comparison's MDE at its seeds as a share
    of that collapse, and the seeds per variant each target share needs."""
    runs = len(comparison["runs_a"])
    m = max(1, len(result["primary"]))
    out = {}
    for name in result["primary"]:
        d = comparison["delta"][name]
        collapse = abs(result["vs_reference"][collapse_variant][name]["value"])
        mde = stats.mde(d["between_var"], d["prompt_var"], runs, runs, m)
        out[name] = {"collapse": collapse, "mde": mde, "mde_share": mde / collapse if collapse else None,
                     "runs": runs, **{f"runs_for_{int(t * 100)}pct": stats.runs_needed(
                         d["between_var"], d["prompt_var"], runs, t * collapse, m) for t in targets}}
    return out


def power_section(power: dict, comparison: dict, collapse_variant: str, reference: str) -> str:
    lines = ["## Power: the smallest difference this design detects", "",
             f"MDE of {comparison['a']} − {comparison['b']} at 80% power, two-sided at 0.05 / {len(power)} "
             f"(Holm's first step), from the measured between-seed and prompt variances; as a share of GRPO's own "
             f"collapse ({collapse_variant} − {reference}). A null below is evidence only against effects larger "
             "than its MDE.", "",
             "| primary | collapse | MDE | MDE / collapse | seeds per arm for ≤ 50% | for ≤ 30% |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, d in power.items():
        lines.append(f"| {METRIC_BY_NAME[name].label} | {d['collapse']:.4f} | {d['mde']:.4f} | "
                     f"{'no collapse' if d['mde_share'] is None else format(d['mde_share'], '.0%')} | "
                     f"{d['runs_for_50pct'] or '> 64'} | {d['runs_for_30pct'] or '> 64'} |")
    return "\n".join(lines)


def _tv(p: pd.Series, q: pd.Series) -> float:
    """Total variation distance of two distributions given as (unnormalised) series over labels."""
    p, q = p / p.sum(), q / q.sum()
    return float(0.5 * p.sub(q, fill_value=0.0).abs().sum())


def manipulation_check(runs: dict[str, dict[int, pd.DataFrame]], treated: str, control: str, top: int = 4) -> dict:
    """Does the treatment change what GRPO trains on? runs: {variant: {seed: weights.parquet frame (prompt_id,
    group, weight, draws)}}. TV between the variants' weights over prompts and over groups, each one's top-`top`
    group share (groups ranked by their uniform share), the correlation of a prompt's weight with its group's size,
    and the realised draws: TV between the arms' drawn group mixes at one seed against TV between two seeds of one
    arm."""
    seeds = sorted(set(runs[treated]) & set(runs[control]))
    a, b = runs[treated][seeds[0]], runs[control][seeds[0]]
    if not a["prompt_id"].equals(b["prompt_id"]):
        raise ValueError(f"weights of {treated} and {control} list different prompts")
    groups_a, groups_b = a.groupby("group")["weight"].sum(), b.groupby("group")["weight"].sum()
    biggest = groups_b.sort_values(ascending=False).index[:top]
    size = a["group"].map(a["group"].value_counts())
    drawn = {v: {s: f.groupby("group")["draws"].sum() for s, f in runs[v].items()} for v in (treated, control)}
    between_arms = [_tv(drawn[treated][s], drawn[control][s]) for s in seeds]
    within = [_tv(d[s1], d[s2]) for d in drawn.values() for i, s1 in enumerate(sorted(d)) for s2 in sorted(d)[i + 1:]]
    out = {"prompt_tv": _tv(a["weight"], b["weight"]), "group_tv": _tv(groups_a, groups_b),
           "top_groups": list(biggest),
           f"top{top}_share": {treated: float(groups_a[biggest].sum() / groups_a.sum()),
                               control: float(groups_b[biggest].sum() / groups_b.sum())},
           "weight_vs_group_size_corr": float(np.corrcoef(a["weight"], size)[0, 1]) if a["weight"].std() > 0 else 0.0,
           "drawn_tv_between_arms": float(np.mean(between_arms)),
           "drawn_tv_between_seeds": float(np.mean(within)) if within else None,
           "draws_per_prompt_max": int(max(f["draws"].max() for d in runs.values() for f in d.values()))}
    return out


def manipulation_section(check: dict, treated: str, control: str) -> str:
    top = [k for k in check if k.startswith("top") and k.endswith("_share")][0]
    seeds = check["drawn_tv_between_seeds"]
    return "\n".join([
        "## Manipulation check: does the treatment change the prompt mix?", "",
        "From the runs' sampling weights and realised draws (`outs/grpo/*/weights.parquet`), before any outcome.", "",
        "| check | value |", "|---|---:|",
        f"| TV({treated}, {control}) over prompts | {check['prompt_tv']:.3f} |",
        f"| TV over groups (modules) | {check['group_tv']:.3f} |",
        f"| share of the {len(check['top_groups'])} largest groups ({', '.join(check['top_groups'])}): {treated} / "
        f"{control} | {check[top][treated]:.3f} / {check[top][control]:.3f} |",
        f"| corr(weight, group size) under {treated} | {check['weight_vs_group_size_corr']:+.3f} |",
        f"| realised drawn group mix: TV between arms (same seed) | {check['drawn_tv_between_arms']:.3f} |",
        f"| realised drawn group mix: TV between seeds of one arm | "
        f"{'n/a' if seeds is None else format(seeds, '.3f')} |",
        f"| most draws of one prompt in a run | {check['draws_per_prompt_max']} |"])
