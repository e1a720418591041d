"""Prompt selection and mitigations against the RM's collapse (issue 70): each arm against `rm` over upstream models,
read from an experiment of sft_<seed>/ sub-runs (speedrun.eval.upstream pools them), with the share of the collapse
each arm recovers, its gold pass@1, the rollouts it spent, its secondaries (pass@16, answer entropy, top-phrasing
share), how far it moved from the task SFT model (KL at the end of training, beside rm's: an arm that optimises the
proxy less may lose less for that reason alone) and the upstream models a design needs for an MDE of 30% of the
collapse. First the plan's manipulation checks, then, for an experiment that is a member of a declared family
(reports/experiments/families.yaml), the plan's calls (Holm over the family's members; a pilot gets none).

    python analysis/task_selection.py reports/experiments/task-selection-rm-pilot \
        --part-b reports/experiments/task-selection-rm-pilot/clip
    python analysis/task_selection.py reports/experiments/task-selection-rm \
        --slow reports/experiments/task-selection-rm/slow
    python analysis/task_selection.py reports/experiments/task-selection-rm-replication \
        --first reports/experiments/task-selection-rm

The collapse is `rm:shuffled`'s Δ gap in the first experiment (the regime where the shuffled control ran); a part B
arm's recovery is read against the same upstream model's collapse from it, though part B trains at another
inner_updates (said beside its rows)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import torch
import typer

import yaml

from speedrun import kept
from speedrun.eval.stats import ALPHA, holm, non_inferiority, replication, t_ppf
from speedrun.eval.upstream import READINGS, cluster_interval, pool
from speedrun.typer_app import new_app, run_app

SECONDARY = ("pass@1", "coverage", "pass@16", "entropy", "top_phrasing_share")
FAMILIES = Path("reports/experiments/families.yaml")
PAID = ("rm", "rm_passk", "rm_density")  # arms whose RM reward must rise (the plan's first manipulation check)
KL_FACTOR = 1.5  # part B's rm matches rm_passk's step when their pooled end KL lie within this factor
app = new_app()


def upstream_needed(sd: float, target: float, power: float = 0.8, most: int = 500) -> int | None:
    """The fewest upstream models whose mean has an MDE ((t(0.975) + t(power)) x sd / sqrt(U)) of at most target."""
    for u in range(2, most + 1):
        if (t_ppf(0.975, u - 1) + t_ppf(power, u - 1)) * sd / math.sqrt(u) <= target:
            return u
    return None


def chi2_ppf(q: float, df: int) -> float:
    """The q-quantile of chi-square with df degrees of freedom: bisection on its CDF, gammainc(df/2, x/2)."""
    lo, hi = 0.0, 10.0 * df + 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if float(torch.special.gammainc(torch.tensor(df / 2, dtype=torch.float64),
                                        torch.tensor(mid / 2, dtype=torch.float64))) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def sub_runs(root: Path) -> dict[str, dict]:
    paths = sorted(kept.glob(root, "sft_*/metrics/task.json"), key=lambda p: int(p.parent.parent.name[4:]))
    return {p.parent.parent.name: kept.read_json(p) for p in paths}


def rows(root: Path, collapse_by_upstream: dict[str, float], label: str, bar: float) -> tuple[list[str], list[str]]:
    """Per `<arm>:rm` comparison of the experiment at root: its row of the effects table and of the power table."""
    pooled, subs = pool(root), sub_runs(root)
    out, power = [], []
    for comp, c in pooled["comparisons"].items():
        arm, control = c["treatment"], c["control"]
        if control != "rm":
            continue
        g, p1 = c["gap"], c.get("pass@1", {})
        share = _share([subs[u]["comparisons"][comp]["gap"]["value"] for u in subs],
                       [collapse_by_upstream[u] for u in subs]) if all(u in collapse_by_upstream for u in subs) else "-"
        spent = [np.mean([x for x in subs[u]["training"][a]["rollouts"] if x is not None] or [np.nan])
                 for a in (arm, "rm") for u in subs]
        kl = [np.mean(subs[u]["training"][a]["kl_end"]) for a in (arm, "rm") for u in subs]  # how far it moved
        sec = {k: np.mean([subs[u]["arms"][arm]["mean"]["all"][k] - subs[u]["arms"]["rm"]["mean"]["all"][k]
                           for u in subs]) for k in SECONDARY[2:]}
        clusters = sorted(set.intersection(*(set(subs[u]["arms"][arm]["mean"]) - {"all"} for u in subs)))
        cov = {k: cluster_interval([subs[u]["arms"][arm]["mean"][k]["coverage"]
                                    - subs[u]["arms"]["rm"]["mean"][k]["coverage"] for u in subs]) for k in clusters}
        cov["equal weight"] = cluster_interval([np.mean([subs[u]["arms"][arm]["mean"][k]["coverage"]
                                                         - subs[u]["arms"]["rm"]["mean"][k]["coverage"]
                                                         for k in clusters]) for u in subs])
        n = len(subs)
        out.append(f"| {arm}{label} | {g['value']:+.3f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}] | "
                   f"{c['range']['low']:+.3f} to {c['range']['high']:+.3f} | {g['mde']:.2f} | "
                   + share + f" | {p1.get('value', float('nan')):+.3f} [{p1.get('ci_low', float('nan')):+.3f}, "
                   f"{p1.get('ci_high', float('nan')):+.3f}] | {np.nanmean(spent[:n]) / np.nanmean(spent[n:]):.2f} | "
                   f"{sec['pass@16']:+.3f} | {sec['entropy']:+.2f} | {sec['top_phrasing_share']:+.3f} | "
                   + ", ".join(f"{k} {v['value']:+.2f} [{v['ci_low']:+.2f}, {v['ci_high']:+.2f}]"
                               for k, v in cov.items())
                   + f" | {np.mean(kl[:n]):.2f} ({np.mean(kl[n:]):.2f}) |")
        needs = []
        for reading in READINGS:
            if reading in c:
                sd = c[reading]["se"] * math.sqrt(n)
                # the SD's one-sided 80% upper bound from n values: sd * sqrt((n - 1) / chi2(0.2, n - 1))
                high = sd * math.sqrt((n - 1) / chi2_ppf(0.2, n - 1))
                needs.append(f"{upstream_needed(sd, bar) or '> 500'} ({upstream_needed(high, bar) or '> 500'})")
        power.append(f"| {arm}{label} | " + " | ".join(needs) + " |")
    return out, power


def _rises(runs: dict[str, dict], arm: str) -> list[tuple[str, bool]]:
    """(upstream, the RM's reward rose) for every run of `arm` in sub-runs `runs`."""
    return [(u, e > s) for u, r in runs.items() if arm in r["training"]
            for s, e in zip(r["training"][arm]["reward_start"], r["training"][arm]["reward_end"])]


def checks(subs: dict[str, dict], slow: dict[str, dict] | None) -> tuple[list[str], bool]:
    """The plan's manipulation checks, read before any outcome: the RM's reward rises in every run of the arms it pays
    (part B's rm too), each task SFT model reads the trained clusters (reported, kept either way), rm_band trains fewer
    groups than it generates, part B's rm moves as far as rm_passk (pooled end KL within KL_FACTOR) and rm_density moves
    the draws (the report's check, on every upstream model, or its row is not read; returned)."""
    lines = []
    for arm, runs, label in [(a, subs, "") for a in PAID] + ([("rm", slow, " (part B)")] if slow else []):
        rose = _rises(runs, arm)
        fell = sorted({u for u, ok in rose if not ok})
        lines.append(f"- {arm}{label}: the RM's reward rose in {sum(ok for _, ok in rose)} of {len(rose)} runs"
                     + (f" (not in every run of {', '.join(fell)})" if fell else ""))
    unread = {u: [c for c in r["blind"]["trained"] if not r["blind"]["sft"][c]["reads_prompt"]]
              for u, r in subs.items()}
    unread = {u: c for u, c in unread.items() if c}
    lines.append(f"- task SFT models reading every trained cluster: {len(subs) - len(unread)} of {len(subs)}"
                 + ("; not: " + "; ".join(f"{u} {', '.join(c)}" for u, c in unread.items()) + " (kept)"
                    if unread else ""))
    band = [(u, n * r["training"]["rm"]["rollouts"][i] / r["training"]["rm"]["groups_trained"][i], x)
            for u, r in subs.items() if "rm_band" in r["training"]
            for i, (n, x) in enumerate(zip(r["training"]["rm_band"]["groups_trained"],
                                            r["training"]["rm_band"]["rollouts"]))]
    if band:
        lines.append(f"- rm_band trained fewer rollouts than it generated in {sum(t < x for _, t, x in band)} of "
                     f"{len(band)} runs (trained {np.mean([t / x for _, t, x in band]):.0%} of them on average)")
    dens = {u: r.get("manipulation", {}).get("rm_density") for u, r in subs.items()
            if "rm_density" in r["training"]}
    density_read = bool(dens) and all(m is not None and m.get("passed") is True for m in dens.values())
    if dens:
        tv = [m["weights_tv"] for m in dens.values() if m and m.get("weights_tv") is not None]
        lines.append(f"- rm_density's check (weights TV ≥ 0.3, draws between arms > 2x between seeds) passed on "
                     f"{sum(bool(m and m.get('passed') is True) for m in dens.values())} of {len(dens)} upstream "
                     f"models" + (f" (weights TV {min(tv):.3f}–{max(tv):.3f})" if tv else "") + ": its row is "
                     + ("read" if density_read else "**not read**"))
    if slow:
        kl = step_kl(subs, slow)
        lines.append(f"- part B's rm (the smaller step) ends at KL {kl['slow']:.2f}, rm_passk at {kl['fast']:.2f} "
                     f"(pooled over {len(kl['per_upstream'])} upstream models; per model rm_passk/rm: "
                     + ", ".join(f"{u[4:]} {f:.2f}/{s:.2f}" for u, (f, s) in kl["per_upstream"].items())
                     + f"): the step comparison is {'matched' if kl['matched'] else '**not matched**'} "
                     f"(within a factor {KL_FACTOR:g})")
    return lines, density_read


def step_kl(fast: dict[str, dict], slow: dict[str, dict]) -> dict:
    """Part A's rm_passk and part B's rm: each upstream model's mean end KL, their pooled means, and whether those
    lie within KL_FACTOR of each other (the plan's check that the smaller step moves the model as far)."""
    per = {u: (float(np.mean(fast[u]["training"]["rm_passk"]["kl_end"])),
               float(np.mean(slow[u]["training"]["rm"]["kl_end"]))) for u in fast if u in slow}
    f, s = np.mean([v[0] for v in per.values()]), np.mean([v[1] for v in per.values()])
    return {"per_upstream": per, "fast": f, "slow": s, "matched": bool(1 / KL_FACTOR <= s / f <= KL_FACTOR)}


def holm_mde(g: dict, m: int, power: float = 0.8) -> float:
    """The MDE at Holm's strictest level over m tests (two-sided alpha / m), from a pooled reading's SE and df."""
    df = g["upstream"] - 1
    return (t_ppf(1 - ALPHA / (2 * m), df) + t_ppf(power, df)) * g["se"]


def family_members(experiment: str) -> list[str]:
    """The comparisons of `experiment` declared as members of a family in FAMILIES (its calls)."""
    return [m["comparison"] for fam in yaml.safe_load(FAMILIES.read_text()).values() for m in fam["members"]
            if m["experiment"] == experiment]


def gold_pass1(pooled: dict, m: str) -> str:
    """Comparison m's gold pass@1 Δ, non-inferior within half of shuffled's pass@1 lead over rm (the plan's margin)."""
    p1 = pooled["comparisons"][m]["pass@1"]
    margin = max(-pooled["comparisons"]["rm:shuffled"]["pass@1"]["value"] / 2, 0)
    return (f"gold pass@1 {p1['value']:+.3f} [{p1['ci_low']:+.3f}, {p1['ci_high']:+.3f}], "
            f"{non_inferiority(p1['ci_low'], p1['ci_high'], margin)} at margin {margin:.3f}")


def calls(root: Path, pooled: dict, density_read: bool) -> list[str]:
    """The plan's readings: the collapse rm:shuffled must be called below 0; each family member (families.yaml) is
    called by Holm over the family's members at ALPHA; a call above 0 reduces the collapse when its MDE is at most 30%
    of the collapse measured here; the design counts only if the positive control (rm_passk:rm) is called above 0;
    gold pass@1 is non-inferior within half of shuffled's pass@1 lead over rm. A null is worded with the MDE at Holm's
    strictest level (the plan's bar uses the unadjusted one, as its power figures did)."""
    members = family_members(root.name)
    if not members:
        return [f"- {root.name} is a member of no family in {FAMILIES}: no call (a pilot)"]
    if any(pooled["comparisons"][m]["primary"] != "gap" for m in members):
        raise SystemExit(f"{root}: the plan's primary is the gap; a member's is not")
    col = pooled["comparisons"]["rm:shuffled"]
    collapse = -col["gap"]["value"]
    substrate = col["gap"]["ci_high"] < 0
    lines = [f"- the collapse rm − shuffled: {col['gap']['value']:+.3f} [{col['gap']['ci_low']:+.3f}, "
             f"{col['gap']['ci_high']:+.3f}]: " + ("called below 0 (the substrate holds)" if substrate
                                                   else "**not called below 0: no reduction is read**")]
    adjusted = holm({m: pooled["comparisons"][m]["gap"]["p"] for m in members})
    up = {m: adjusted[m] <= ALPHA and pooled["comparisons"][m]["gap"]["value"] > 0 for m in members}
    positive = up.get("rm_passk:rm", False)
    for m in members:
        g = pooled["comparisons"][m]["gap"]
        strict = holm_mde(g, len(members))
        verdict = ("reduces the collapse" if up[m] and g["mde"] <= 0.3 * collapse else
                   "a reduction, not measured to the plan's MDE" if up[m] else
                   "called below 0: adds to the collapse" if adjusted[m] <= ALPHA else
                   f"no reduction as large as {strict:.2f} ({strict / collapse:.0%} of the collapse) seen")
        if m == "rm_density:rm" and not density_read:
            verdict = "not read (its manipulation check failed)"
        elif not substrate:
            verdict = f"not read (no collapse to reduce): {verdict}"
        elif not positive and m != "rm_passk:rm":
            verdict = f"not read (the positive control is not called, so the design does not count): {verdict}"
        lines.append(f"- {m}: Δ gap {g['value']:+.3f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}], p {g['p']:.4f}, Holm "
                     f"{adjusted[m]:.4f}, MDE {g['mde']:.3f} ({g['mde'] / collapse:.0%} of the collapse; at Holm's "
                     f"level {strict:.3f}): {verdict}; {gold_pass1(pooled, m)}")
    lines.append("- the positive control (rm_passk:rm) is " + (
        "not read (no collapse)" if not substrate else "called: the design counts" if positive else
        "**not called: the design does not count, and no null of the other arms is read**"))
    lines.append("- each call is to be replicated on upstream seeds 47–66, GRPO seeds 1203 and 1204 (the plan's rule: "
                 "same sign, interval covering half the first): read with --first")
    return lines


def replications(root: Path, pooled: dict, first: Path, density_read: bool) -> list[str]:
    """The first run's replication rule on this run (never pooled with it): each comparison the first run called (Holm
    over its family's members) against this run's unadjusted interval (speedrun.eval.stats.replication); the collapse
    must be called below 0 here for a reduction to be read, and rm_density's row needs its check on every model here;
    gold pass@1 is read as in the first run, against this run's margin."""
    members = family_members(first.name)
    if not members:
        raise SystemExit(f"{first}: a member of no family in {FAMILIES}: it made no call to replicate")
    before = pool(first)["comparisons"]
    adjusted = holm({m: before[m]["gap"]["p"] for m in members})
    col = pooled["comparisons"]["rm:shuffled"]["gap"]
    substrate = col["ci_high"] < 0
    lines = [f"- the collapse rm − shuffled here: {col['value']:+.3f} [{col['ci_low']:+.3f}, {col['ci_high']:+.3f}] "
             f"(first {before['rm:shuffled']['gap']['value']:+.3f}): "
             + ("called below 0 (the substrate holds)" if substrate else "**not called below 0: none is read**")]
    for m in members:
        f, g = before[m]["gap"], pooled["comparisons"][m]["gap"]
        head = (f"- {m}: first {f['value']:+.3f} [{f['ci_low']:+.3f}, {f['ci_high']:+.3f}] (Holm {adjusted[m]:.4f}); "
                f"here {g['value']:+.3f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}], p {g['p']:.4f}, MDE {g['mde']:.3f}")
        if adjusted[m] > ALPHA:
            lines.append(f"{head}: no call to replicate")
            continue
        verdict = replication(f["value"], g["value"], g["ci_low"], g["ci_high"])
        if m == "rm_density:rm" and not density_read:
            verdict = f"not read (its manipulation check failed here): {verdict}"
        elif not substrate:
            verdict = f"not read (no collapse here to reduce): {verdict}"
        # Added after the read (a description, not a change of verdict): the rule's near side passes an interval
        # that also covers 0, which fits the first's effect and none alike.
        covers_0 = g["ci_low"] <= 0 <= g["ci_high"]
        alone = "; its interval also covers 0: this run alone does not find it" if covers_0 else ""
        lines.append(f"{head}; half the first {f['value'] / 2:+.3f}: **{verdict}**{alone}; {gold_pass1(pooled, m)}")
    return lines


def _share(diffs: list[float], collapses: list[float]) -> str:
    """The share of the collapse recovered: the mean of per-model ratios [t interval], and the ratio of the means (a
    model with a small collapse of its own does not dominate it)."""
    r = cluster_interval([d / c for d, c in zip(diffs, collapses)])
    return f"{r['value']:+.2f} [{r['ci_low']:+.2f}, {r['ci_high']:+.2f}] (of means {sum(diffs) / sum(collapses):+.2f})"


def step_row(fast: dict[str, dict], slow: dict[str, dict], collapse_by_upstream: dict[str, float]) -> str:
    """rm_passk of the first experiment against rm of `slow` (a smaller step), per upstream model the difference of
    their gaps below the envelope, and their KL at the end: does pass@k keep more than a step that moves as far?"""
    kl = step_kl(fast, slow)
    ups = list(kl["per_upstream"])
    diffs = [fast[u]["frontier_gap"]["rm_passk"]["gap"] - slow[u]["frontier_gap"]["rm"]["gap"] for u in ups]
    d = cluster_interval(diffs)
    p1 = cluster_interval([fast[u]["arms"]["rm_passk"]["mean"]["all"]["pass@1"] -
                           slow[u]["arms"]["rm"]["mean"]["all"]["pass@1"] for u in ups])
    spent = [np.mean(r[u]["training"][a]["rollouts"]) for r, a in ((fast, "rm_passk"), (slow, "rm")) for u in ups]
    n, matched = len(ups), "matched" if kl["matched"] else "not matched"
    return (f"| rm_passk − rm at the smaller step ({n} upstream models; KL {matched}) | {d['value']:+.3f} "
            f"[{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] | gap only | {d['mde']:.2f} | "
            f"{_share(diffs, [collapse_by_upstream[u] for u in ups])} | {p1['value']:+.3f} [{p1['ci_low']:+.3f}, "
            f"{p1['ci_high']:+.3f}] | {np.mean(spent[:n]) / np.mean(spent[n:]):.2f} | | | "
            f"| | {kl['fast']:.2f} ({kl['slow']:.2f}) |")


@app.command()
def command(root: Annotated[Path, typer.Argument(help="the experiment with sft_<seed>/ sub-runs, rm:shuffled among "
                                                      "its comparisons")],
            part_b: Annotated[Optional[Path], typer.Option(help="an experiment on the same upstream seeds whose "
                                                                "arms are compared with rm at other settings")] = None,
            bar: Annotated[float, typer.Option(help="the MDE a powered design must reach: 30% of the collapse the "
                                                    "ten-model experiments measured (1.52), as the pilot's plan says")
                           ] = 0.456,
            slow: Annotated[Optional[Path], typer.Option(help="an experiment on the same upstream and GRPO seeds with "
                                                             "rm at a smaller step: rm_passk is read against it")
                            ] = None,
            first: Annotated[Optional[Path], typer.Option(help="the first run this experiment replicates: its calls "
                                                              "are checked by the replication rule instead")
                             ] = None) -> None:
    subs = sub_runs(root)
    by_u = {u: -r["comparisons"]["rm:shuffled"]["gap"]["value"] for u, r in subs.items()}
    pooled = pool(root)
    col = pooled["comparisons"]["rm:shuffled"]["gap"]
    print(f"{root.name}: {len(subs)} upstream models ({', '.join(subs)}); the collapse rm − shuffled, Δ gap "
          f"{col['value']:+.3f} [{col['ci_low']:+.3f}, {col['ci_high']:+.3f}] "
          f"(per upstream {', '.join(f'{-v:+.2f}' for v in by_u.values())})\n")
    slow_subs = sub_runs(slow) if slow is not None else None
    found, density_read = checks(subs, slow_subs)
    print("Manipulation checks (read first):\n\n" + "\n".join(found) + "\n")
    if first is not None:
        print(f"Replication of {first.name}'s calls (its plan's rule):\n\n"
              + "\n".join(replications(root, pooled, first, density_read)) + "\n")
    else:
        print("Calls (the plan's readings):\n\n" + "\n".join(calls(root, pooled, density_read)) + "\n")
    effects, power = rows(root, by_u, "", bar)
    if part_b is not None:
        e, pw = rows(part_b, by_u, " (part B, against rm there)", bar)
        effects, power = effects + e, power + pw
    if slow_subs is not None:
        effects.append(step_row(subs, slow_subs, by_u))
    print("| arm − rm | Δ gap [95% CI, t over upstream] | range of readings | MDE | share of the collapse recovered "
          "| Δ gold pass@1 [95% CI] | rollouts / rm's | Δ pass@16 | Δ entropy | Δ top-phrasing share | Δ coverage "
          "per cluster and with the clusters weighted equally [95% CI] | KL end (rm's) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    print("\n".join(effects))
    print(f"\nUpstream models a design needs for an MDE of {bar:g} (two GRPO seeds each), from the spread between "
          "these upstream models of each reading; in brackets, from the SD's one-sided 80% upper bound:\n")
    print("| arm − rm | " + " | ".join(READINGS) + " |")
    print("|---|" + "---:|" * len(READINGS))
    print("\n".join(power))
    print("\nThe share recovered: (arm − rm) / (shuffled − rm) per upstream model (a part B arm's against part A's "
          "collapse on the same model), its mean and t interval.")


if __name__ == "__main__":
    run_app(app, None, "analysis/task_selection.py")
