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
import typer

from speedrun import kept
from speedrun.eval.stats import t_ppf
from speedrun.eval.upstream import cluster_interval, pool
from speedrun.typer_app import new_app, run_app

SECONDARY = ("pass@1", "coverage", "pass@16", "entropy", "top_phrasing_share")
app = new_app()


def upstream_needed(sd: float, target: float, power: float = 0.8, most: int = 500) -> int | None:
    """The fewest upstream models whose mean has an MDE ((t(0.975) + t(power)) x sd / sqrt(U)) of at most target."""
    for u in range(3, most + 1):
        if (t_ppf(0.975, u - 1) + t_ppf(power, u - 1)) * sd / math.sqrt(u) <= target:
            return u
    return None


def sub_runs(root: Path) -> dict[str, dict]:
    paths = sorted(kept.glob(root, "sft_*/metrics/task.json"), key=lambda p: int(p.parent.parent.name[4:]))
    return {p.parent.parent.name: kept.read_json(p) for p in paths}


def rows(root: Path, collapse_by_upstream: dict[str, float], collapse: float, label: str) -> list[str]:
    """One table row per `<arm>:rm` comparison of the experiment at root."""
    pooled, subs = pool(root), sub_runs(root)
    out = []
    for comp, c in pooled["comparisons"].items():
        arm, control = c["treatment"], c["control"]
        if control != "rm":
            continue
        g, p1 = c["gap"], c.get("pass@1", {})
        share = cluster_interval([subs[u]["comparisons"][comp]["gap"]["value"] / collapse_by_upstream[u]
                                  for u in subs]) if all(u in collapse_by_upstream for u in subs) else None
        spent = [np.mean([x for x in subs[u]["training"][arm]["rollouts"] if x is not None] or [np.nan])
                 for u in subs]
        base = [np.mean([x for x in subs[u]["training"]["rm"]["rollouts"] if x is not None] or [np.nan]) for u in subs]
        kl = [np.mean(subs[u]["training"][a]["kl_end"]) for a in (arm, "rm") for u in subs]  # how far it moved
        sd = g["se"] * math.sqrt(len(subs))
        need = upstream_needed(sd, 0.3 * collapse)
        sec = {k: np.mean([subs[u]["arms"][arm]["mean"]["all"][k] - subs[u]["arms"]["rm"]["mean"]["all"][k]
                           for u in subs]) for k in SECONDARY[2:]}
        out.append(f"| {arm}{label} | {g['value']:+.3f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}] | "
                   f"{c['range']['low']:+.3f} to {c['range']['high']:+.3f} | {g['mde']:.2f} | "
                   + (f"{share['value']:+.2f} [{share['ci_low']:+.2f}, {share['ci_high']:+.2f}]" if share else "-")
                   + f" | {p1.get('value', float('nan')):+.3f} | {np.nanmean(spent) / np.nanmean(base):.2f} | "
                   f"{sec['pass@16']:+.3f} | {sec['entropy']:+.2f} | {sec['top_phrasing_share']:+.3f} | "
                   f"{np.mean(kl[:len(subs)]):.2f} ({np.mean(kl[len(subs):]):.2f}) | {need if need else '> 500'} |")
    return out


@app.command()
def command(root: Annotated[Path, typer.Argument(help="the experiment with sft_<seed>/ sub-runs, rm:shuffled among "
                                                      "its comparisons")],
            part_b: Annotated[Optional[Path], typer.Option(help="an experiment on the same upstream seeds whose "
                                                                "arms are compared with rm at other settings")] = None
            ) -> None:
    subs = sub_runs(root)
    by_u = {u: -r["comparisons"]["rm:shuffled"]["gap"]["value"] for u, r in subs.items()}
    col = pool(root)["comparisons"]["rm:shuffled"]
    collapse = -col["gap"]["value"]
    print(f"{root.name}: {len(subs)} upstream models ({', '.join(subs)}); the collapse rm − shuffled, Δ gap "
          f"{col['gap']['value']:+.3f} [{col['gap']['ci_low']:+.3f}, {col['gap']['ci_high']:+.3f}] "
          f"(per upstream {', '.join(f'{-v:+.2f}' for v in by_u.values())}); 30% of it: {0.3 * collapse:.2f}\n")
    print("| arm − rm | Δ gap [95% CI, t over upstream] | range of readings | MDE | share of the collapse recovered "
          "| Δ gold pass@1 | rollouts / rm's | Δ pass@16 | Δ entropy | Δ top-phrasing share | KL end (rm's) | "
          "upstream models for MDE 30% |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows(root, by_u, collapse, "")))
    if part_b is not None:
        b = {u: v for u, v in by_u.items()}
        print("\n".join(rows(part_b, b, collapse, " (inner_updates 2, against rm at 2)")))
    print("\nThe share recovered: (arm − rm) / (shuffled − rm) per upstream model, its mean and t interval; upstream "
          "models for MDE 30%: from the spread between upstream models of the Δ gap (at these GRPO seeds per model).")


if __name__ == "__main__":
    run_app(app, None, "analysis/task_selection.py")
