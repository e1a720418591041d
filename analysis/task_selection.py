"""Prompt selection and mitigations against the RM's collapse (issue 70): each arm against `rm` over upstream models,
read from an experiment of sft_<seed>/ sub-runs (speedrun.eval.upstream pools them), with the share of the collapse
each arm recovers, its gold pass@1, the rollouts it spent, its secondaries (pass@16, answer entropy, top-phrasing
share), how far it moved from the task SFT model (KL at the end of training, beside rm's: an arm that optimises the
proxy less may lose less for that reason alone) and the upstream models a design needs for an MDE of 30% of the
collapse.

    python analysis/task_selection.py reports/experiments/task-selection-rm-pilot \
        --part-b reports/experiments/task-selection-rm-pilot/clip

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

from speedrun import kept
from speedrun.eval.stats import t_ppf
from speedrun.eval.upstream import READINGS, cluster_interval, pool
from speedrun.typer_app import new_app, run_app

SECONDARY = ("pass@1", "coverage", "pass@16", "entropy", "top_phrasing_share")
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
        share = cluster_interval([subs[u]["comparisons"][comp]["gap"]["value"] / collapse_by_upstream[u]
                                  for u in subs]) if all(u in collapse_by_upstream for u in subs) else None
        spent = [np.mean([x for x in subs[u]["training"][a]["rollouts"] if x is not None] or [np.nan])
                 for a in (arm, "rm") for u in subs]
        kl = [np.mean(subs[u]["training"][a]["kl_end"]) for a in (arm, "rm") for u in subs]  # how far it moved
        sec = {k: np.mean([subs[u]["arms"][arm]["mean"]["all"][k] - subs[u]["arms"]["rm"]["mean"]["all"][k]
                           for u in subs]) for k in SECONDARY[2:]}
        clusters = sorted(set.intersection(*(set(subs[u]["arms"][arm]["mean"]) - {"all"} for u in subs)))
        cov = {k: np.mean([subs[u]["arms"][arm]["mean"][k]["coverage"] - subs[u]["arms"]["rm"]["mean"][k]["coverage"]
                           for u in subs]) for k in clusters}
        n = len(subs)
        out.append(f"| {arm}{label} | {g['value']:+.3f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}] | "
                   f"{c['range']['low']:+.3f} to {c['range']['high']:+.3f} | {g['mde']:.2f} | "
                   + (f"{share['value']:+.2f} [{share['ci_low']:+.2f}, {share['ci_high']:+.2f}]" if share else "-")
                   + f" | {p1.get('value', float('nan')):+.3f} [{p1.get('ci_low', float('nan')):+.3f}, "
                   f"{p1.get('ci_high', float('nan')):+.3f}] | {np.nanmean(spent[:n]) / np.nanmean(spent[n:]):.2f} | "
                   f"{sec['pass@16']:+.3f} | {sec['entropy']:+.2f} | {sec['top_phrasing_share']:+.3f} | "
                   + ", ".join(f"{k} {v:+.2f}" for k, v in cov.items())
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


def step_row(fast: dict[str, dict], slow: dict[str, dict], collapse_by_upstream: dict[str, float]) -> str:
    """rm_passk of the first experiment against rm of `slow` (a smaller step), per upstream model the difference of
    their gaps below the envelope, and their KL at the end: does pass@k keep more than a step that moves as far?"""
    ups = [u for u in fast if u in slow]
    d = cluster_interval([fast[u]["frontier_gap"]["rm_passk"]["gap"] - slow[u]["frontier_gap"]["rm"]["gap"]
                          for u in ups])
    share = cluster_interval([(fast[u]["frontier_gap"]["rm_passk"]["gap"] - slow[u]["frontier_gap"]["rm"]["gap"])
                              / collapse_by_upstream[u] for u in ups])
    p1 = cluster_interval([fast[u]["arms"]["rm_passk"]["mean"]["all"]["pass@1"] -
                           slow[u]["arms"]["rm"]["mean"]["all"]["pass@1"] for u in ups])
    kl = (np.mean([np.mean(fast[u]["training"]["rm_passk"]["kl_end"]) for u in ups]),
          np.mean([np.mean(slow[u]["training"]["rm"]["kl_end"]) for u in ups]))
    return (f"| rm_passk − rm at the smaller step ({len(ups)} upstream models) | {d['value']:+.3f} "
            f"[{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] | gap only | {d['mde']:.2f} | {share['value']:+.2f} "
            f"[{share['ci_low']:+.2f}, {share['ci_high']:+.2f}] | {p1['value']:+.3f} [{p1['ci_low']:+.3f}, "
            f"{p1['ci_high']:+.3f}] | 1.00 | | | "
            f"| | {kl[0]:.2f} ({kl[1]:.2f}) |")


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
                            ] = None) -> None:
    subs = sub_runs(root)
    by_u = {u: -r["comparisons"]["rm:shuffled"]["gap"]["value"] for u, r in subs.items()}
    col = pool(root)["comparisons"]["rm:shuffled"]["gap"]
    print(f"{root.name}: {len(subs)} upstream models ({', '.join(subs)}); the collapse rm − shuffled, Δ gap "
          f"{col['value']:+.3f} [{col['ci_low']:+.3f}, {col['ci_high']:+.3f}] "
          f"(per upstream {', '.join(f'{-v:+.2f}' for v in by_u.values())})\n")
    effects, power = rows(root, by_u, "", bar)
    if part_b is not None:
        e, pw = rows(part_b, by_u, " (part B, against rm there)", bar)
        effects, power = effects + e, power + pw
    if slow is not None:
        effects.append(step_row(subs, sub_runs(slow), by_u))
    print("| arm − rm | Δ gap [95% CI, t over upstream] | range of readings | MDE | share of the collapse recovered "
          "| Δ gold pass@1 [95% CI] | rollouts / rm's | Δ pass@16 | Δ entropy | Δ top-phrasing share | Δ coverage "
          "per cluster | KL end (rm's) |")
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
