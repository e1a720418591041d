"""What the evaluation can see. Can a metric see diversity at all? The SFT model sampled at several temperatures is a
planted, known ordering (a higher temperature spreads every next-token distribution): a diversity metric must order
the temperatures (Spearman's rho >= MIN_RHO in its good direction) before it may serve as a primary outcome. How
small a difference can the design detect? The MDE of each primary, as a share of GRPO's own collapse."""
from __future__ import annotations

import numpy as np
import pandas as pd

from speedrun.eval import stats
from speedrun.eval.stats import MIN_RHO, spearman
from speedrun.eval.compare import METRIC_BY_NAME, evaluate

# the manipulation check's bar (issue 26): the weights move the module mix by TV >= MIN_GROUP_TV, and the realised
# draws differ between arms more than MIN_ARM_RATIO x between seeds of one arm
MIN_GROUP_TV, MIN_ARM_RATIO = 0.3, 2.0
# a run's few hundred draws cannot resolve ~170 modules (seed noise alone moves the drawn module mix by TV ~0.3),
# so the realised mix is also compared over this many crowding bins: modules by size, equal prompt counts per bin
CROWDING_BINS = 5


def temperature_ordering(samples: pd.DataFrame, temperatures: dict[str, float], metrics: list[str],
                         vocab: list[int], seed: int, match_words: int = 0) -> dict:
    """samples: one model name per temperature ({name: T}). Per metric: its value at each temperature and rho of
    (metric signed so that higher = more diverse) against temperature; passes when rho >= MIN_RHO."""
    res = evaluate(samples, {}, [], reference=None, n_boot=1, seed=seed, ead_vocab_size=vocab,
                   match_words=match_words, where="temperature control samples")
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
        role = (("primary" if m in kept else "**dropped from primary**") if m in configured
                else "secondary" if d["passes"] else "secondary, fails the control")
        lines.append(f"| {METRIC_BY_NAME[m].label} | " + " | ".join(f"{v:.4f}" for v in d["values"])
                     + f" | {d['rho']:.2f} | {role} |")
    return "\n".join(lines)


def power_table(result: dict, comparison: dict, collapse_variant: str, targets: tuple[float, ...] = (0.5, 0.3)
                ) -> dict:
    """Per primary: GRPO's own collapse (collapse_variant − reference, signed so that > 0 is a loss of diversity),
    the comparison's MDE at its seeds as a share of that collapse, the share of Var(Δ) the training seeds make, the
    MDE share at stats.MAX_RUNS seeds, and the seeds per variant each target share needs. Where GRPO made the metric
    more diverse (collapse ≤ 0) there is no collapse to take a share of: the shares and seed counts are None."""
    runs = len(comparison["runs_a"])
    m = max(1, len(result["primary"]))
    out = {}
    for name in result["primary"]:
        d = comparison["delta"][name]
        moved = result["vs_reference"][collapse_variant][name]["value"]
        collapse = -moved if METRIC_BY_NAME[name].good == "higher" else moved
        lost = collapse > 0  # GRPO lost diversity on this metric: a collapse to take shares of
        mde = stats.mde(d["between_var"], d["prompt_var"], runs, runs, m)
        mde_max = stats.mde(d["between_var"], d["prompt_var"], runs, stats.MAX_RUNS, m)
        var = d["between_var"] + d["prompt_var"]
        out[name] = {"collapse": collapse, "mde": mde, "mde_share": mde / collapse if lost else None,
                     "seed_var_share": d["between_var"] / var if var else None,
                     "mde_share_max_runs": mde_max / collapse if lost else None, "runs": runs}
        for t in targets:
            out[name][f"runs_for_{int(t * 100)}pct"] = stats.runs_needed(
                d["between_var"], d["prompt_var"], runs, t * collapse, m) if lost else None
    return out


def power_section(power: dict, comparison: dict, collapse_variant: str, reference: str) -> str:
    lines = ["## Power: the smallest difference this design detects", "",
             f"MDE of {comparison['a']} − {comparison['b']} at 80% power, two-sided at 0.05 / {len(power)} "
             f"(Holm's first step), from the measured between-seed and prompt variances; as a share of GRPO's own "
             f"collapse ({collapse_variant} − {reference}). A null below is evidence only against effects larger "
             "than its MDE. Where the training seeds make most of Var(Δ), more held-out prompts cannot help; only "
             "more seeds (or a larger collapse) can. Collapse is signed: a negative one means GRPO made the metric "
             "*more* diverse, so there is no collapse to measure the MDE against.", "",
             f"| primary | collapse | MDE | MDE / collapse | Var(Δ) from seeds | MDE / collapse at {stats.MAX_RUNS} "
             f"seeds | seeds per arm for ≤ 50% | for ≤ 30% |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    pct = lambda x: "no collapse" if x is None else format(x, ".0%")  # noqa: E731
    for name, d in power.items():
        need = lambda r: "—" if d["mde_share"] is None else (r or f"> {stats.MAX_RUNS}")  # noqa: E731
        lines.append(f"| {METRIC_BY_NAME[name].label} | {d['collapse']:+.4f} | {d['mde']:.4f} | "
                     f"{pct(d['mde_share'])} | "
                     f"{'—' if d['seed_var_share'] is None else format(d['seed_var_share'], '.0%')} | "
                     f"{pct(d['mde_share_max_runs'])} | {need(d['runs_for_50pct'])} | {need(d['runs_for_30pct'])} |")
    return "\n".join(lines)


def _tv(p: pd.Series, q: pd.Series) -> float:
    """Total variation distance of two distributions given as (unnormalised) series over labels."""
    p, q = p / p.sum(), q / q.sum()
    return float(0.5 * p.sub(q, fill_value=0.0).abs().sum())


def crowding_bins(groups: pd.Series, n_bins: int = CROWDING_BINS) -> pd.Series:
    """Each group's crowding bin (0 = the smallest modules): groups sorted by prompt count (then name), cut where the
    running prompt count crosses each 1/n_bins of the total, so bins hold about equal numbers of prompts."""
    sizes = groups.value_counts()
    sizes = sizes.sort_index().sort_values(kind="stable")
    mid = sizes.cumsum() - sizes / 2  # a group's bin: where its middle prompt falls
    return (mid / sizes.sum() * n_bins).astype(int).clip(upper=n_bins - 1)


def noise_floor_tv(frame: pd.DataFrame, labels: pd.Series, sims: int = 200, seed: int = 0) -> float:
    """Expected TV between the drawn label mixes of two runs with the SAME weights (as many draws as `frame`'s run,
    multinomial over prompts): the seed-to-seed spread that sampling alone makes."""
    rng = np.random.default_rng(seed)
    n, p = int(frame["draws"].sum()), (frame["weight"] / frame["weight"].sum()).to_numpy()
    lab = frame["group"].map(labels).to_numpy()
    codes, uniq = pd.factorize(lab)

    def mix() -> np.ndarray:
        return np.bincount(codes, weights=rng.multinomial(n, p), minlength=len(uniq)) / n
    return float(np.mean([0.5 * np.abs(mix() - mix()).sum() for _ in range(sims)]))


def manipulation_check(runs: dict[str, dict[int, pd.DataFrame]], treated: str, control: str, top: int = 4) -> dict:
    """Does the treatment change what GRPO trains on? runs: {variant: {seed: weights.parquet frame (prompt_id,
    group, weight, draws)}}. TV between the variants' weights over prompts and over groups, each one's top-`top`
    group share (groups ranked by their uniform share), the correlation of a prompt's weight with its group's size,
    and the realised draws: TV between the arms' drawn mixes at one seed against TV between two seeds of one arm,
    over groups and over crowding bins, each beside the spread sampling noise alone makes (noise_floor_tv);
    `passes`: group TV >= MIN_GROUP_TV and the arms' crowding-bin difference > MIN_ARM_RATIO x the seeds'."""
    seeds = sorted(set(runs[treated]) & set(runs[control]))
    a, b = runs[treated][seeds[0]], runs[control][seeds[0]]
    if not a["prompt_id"].equals(b["prompt_id"]):
        raise ValueError(f"weights of {treated} and {control} list different prompts")
    groups_a, groups_b = a.groupby("group")["weight"].sum(), b.groupby("group")["weight"].sum()
    biggest = groups_b.sort_values(ascending=False).index[:top]
    size = a["group"].map(a["group"].value_counts())
    bins = crowding_bins(a["group"])

    def realised(label) -> tuple[float, float | None]:  # mean TV of drawn mixes: arms at one seed, seeds of one arm
        drawn = {v: {s: f.groupby(label(f))["draws"].sum() for s, f in runs[v].items()} for v in (treated, control)}
        arms = [_tv(drawn[treated][s], drawn[control][s]) for s in seeds]
        within = [_tv(d[s1], d[s2]) for d in drawn.values() for i, s1 in enumerate(sorted(d))
                  for s2 in sorted(d)[i + 1:]]
        return float(np.mean(arms)), float(np.mean(within)) if within else None

    arms_g, seeds_g = realised(lambda f: f["group"])
    arms_b, seeds_b = realised(lambda f: f["group"].map(bins))
    ratio = arms_b / seeds_b if seeds_b else None
    group_tv = _tv(groups_a, groups_b)
    out = {"prompt_tv": _tv(a["weight"], b["weight"]), "group_tv": group_tv,
           "top_groups": list(biggest),
           f"top{top}_share": {treated: float(groups_a[biggest].sum() / groups_a.sum()),
                               control: float(groups_b[biggest].sum() / groups_b.sum())},
           "weight_vs_group_size_corr": float(np.corrcoef(a["weight"], size)[0, 1]) if a["weight"].std() > 0 else 0.0,
           "drawn_tv_between_arms": arms_g, "drawn_tv_between_seeds": seeds_g,
           "drawn_tv_noise_floor": noise_floor_tv(b, pd.Series(b["group"].unique(), index=b["group"].unique())),
           "crowding_bins": len(bins.unique()),
           "bin_share": {treated: _shares(a, bins), control: _shares(b, bins)},
           "bin_tv_between_arms": arms_b, "bin_tv_between_seeds": seeds_b,
           "bin_tv_noise_floor": noise_floor_tv(b, bins),
           "bin_arm_to_seed_ratio": ratio,
           "passes": bool(group_tv >= MIN_GROUP_TV and ratio is not None and ratio > MIN_ARM_RATIO),
           "draws_per_prompt_max": int(max(f["draws"].max() for d in runs.values() for f in d.values()))}
    return out


def _shares(frame: pd.DataFrame, bins: pd.Series) -> list[float]:
    """Each crowding bin's share of the sampling weight (bin 0 first)."""
    w = frame.groupby(frame["group"].map(bins))["weight"].sum()
    return [round(float(v), 4) for v in (w / w.sum()).sort_index()]


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
        f"| realised drawn group mix: TV between seeds of one arm (sampling noise alone: "
        f"{check['drawn_tv_noise_floor']:.3f}) | {fmt(seeds)} |",
        f"| weight share of the {check['crowding_bins']} crowding bins, smallest modules first: {treated} / "
        f"{control} | {' '.join(f'{x:.2f}' for x in check['bin_share'][treated])} / "
        f"{' '.join(f'{x:.2f}' for x in check['bin_share'][control])} |",
        f"| realised drawn crowding-bin mix: TV between arms (same seed) | {check['bin_tv_between_arms']:.3f} |",
        f"| realised drawn crowding-bin mix: TV between seeds of one arm (sampling noise alone: "
        f"{check['bin_tv_noise_floor']:.3f}) | {fmt(check['bin_tv_between_seeds'])} |",
        f"| most draws of one prompt in a run | {check['draws_per_prompt_max']} |", "",
        f"**Manipulation check {'passes' if check['passes'] else 'FAILS'}** (bar: TV over groups ≥ {MIN_GROUP_TV}, "
        f"and the arms' realised crowding-bin mixes differ more than {MIN_ARM_RATIO:g}× as much as two seeds' of one "
        f"arm: {fmt(check['bin_arm_to_seed_ratio'], '.1f')}×). Over single modules the arms differ "
        f"{fmt(None if not seeds else check['drawn_tv_between_arms'] / seeds, '.1f')}× as much as two seeds: a "
        "run's draws are too few to resolve every module, so there the seed spread is mostly sampling noise (its "
        "floor above); crowding bins (modules by size, equal prompt counts per bin) are the scale a run resolves."])


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)
