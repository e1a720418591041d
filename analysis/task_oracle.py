"""The oracle bracket (reports/experiments/task-oracle-rm, its plan's readings in code): the trained clusters balanced
by their labels (`rm_balanced`) against uniform GRPO (`rm`) under the task RM's reward, over upstream models; and the
readings that pair it with the committed arms of task-selection-rm on the same upstream models (GRPO seed 1201):
the collapse (`shuffled`), the oracle against `rm_density`, and the oracle at `rm`'s KL (the line through `rm`'s two
steps, part B at lr 1e-4). First the rebuild check and the manipulation checks, then the call, then the secondaries.

    python analysis/task_oracle.py reports/experiments/task-oracle-rm
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import pandas as pd
import typer
import yaml

from speedrun import kept
from speedrun.eval.matched_kl import at_control_kl
from speedrun.eval.rarefaction import narrowing, right_answers
from speedrun.eval.stats import ALPHA, holm
from speedrun.eval.upstream import READINGS, cluster_interval, pool
from speedrun.typer_app import new_app, run_app

from task_selection import FAMILIES, sub_runs  # analysis/ is the script's directory: on sys.path

ORACLE, RM, SEED = "rm_balanced", "rm", 1201
COLS = ["model", "temperature", "item_id", "cluster", "sample_idx", "text", "answer"]
KEY = ["model", "temperature", "item_id", "sample_idx"]
app = new_app()


def _answers(sub: Path, models: list[str]) -> pd.DataFrame:
    a = kept.read_parquet(sub / "answers.parquet", columns=COLS)
    return a[a["model"].isin(models)].sort_values(KEY).reset_index(drop=True)


def rebuilt(root: Path, first: Path, ups: list[str]) -> dict[str, bool]:
    """Per upstream model: rm_s1201's answers here equal the committed sub-run's exactly, and so do the task SFT
    model's (its answers where this sub-run keeps them; its temperature curves in the metrics otherwise: once
    checked, the kept sub-runs drop those answers, which task-selection-rm keeps)."""
    out = {}
    for u in ups:
        here, there = _answers(root / u, ["task_sft", f"{RM}_s{SEED}"]), _answers(first / u, [f"{RM}_s{SEED}"])
        sft = here[here["model"] == "task_sft"]
        rm = here[here["model"] != "task_sft"].reset_index(drop=True)
        same_sft = (sft.reset_index(drop=True).equals(_answers(first / u, ["task_sft"])) if len(sft) else
                    kept.read_json(root / u / "metrics/task.json")["sft"]
                    == kept.read_json(first / u / "metrics/task.json")["sft"])
        out[u] = len(rm) > 0 and rm.equals(there) and same_sft
    return out


def _run(sub: dict, arm: str, seed_index: int = 0) -> dict:
    """One run's coverage at T = 1 (all items and per cluster), its KL at the end, its RM reward start and end."""
    t = sub["training"][arm]
    return {"cov": {k: v["coverage"] for k, v in sub["arms"][arm]["runs"][seed_index].items() if isinstance(v, dict)},
            "kl": t["kl_end"][seed_index], "rose": t["reward_end"][seed_index] > t["reward_start"][seed_index],
            "gold": t["gold_pass_end"][seed_index]}


def checks(subs: dict, grpo: dict, first: dict, ok: dict[str, bool]) -> tuple[list[str], bool]:
    """The rebuild, the oracle's realised draws (evens in [0.4, 0.6] in every run; TV from rm's ≥ 0.2 pooled), the
    RM's reward rising in every run, and the collapse (rm here − shuffled there at T = 1) called below 0."""
    failed = ", ".join(u for u, v in ok.items() if not v)
    lines = [f"- rebuild: the task SFT model's and rm_s{SEED}'s answers (or curves) equal task-selection-rm's on "
             f"{sum(ok.values())} of {len(ok)} upstream models" + (f" (not: {failed})" if failed else "")]
    evens = {u: g[f"{ORACLE}_s{SEED}"]["cluster_share_draws"]["evens"] for u, g in grpo.items()}
    tv = [abs(evens[u] - g[f"{RM}_s{SEED}"]["cluster_share_draws"]["evens"]) for u, g in grpo.items()]
    inside = sum(0.4 <= e <= 0.6 for e in evens.values())
    lines.append(f"- {ORACLE}'s realised draws on evens: {min(evens.values()):.3f}–{max(evens.values()):.3f}, within "
                 f"[0.4, 0.6] in {inside} of {len(evens)} runs; TV from rm's draws {np.mean(tv):.3f} pooled (bar 0.2)")
    rose = {a: sum(_run(s, a)["rose"] for s in subs.values()) for a in (RM, ORACLE)}
    lines.append("- the RM's reward rose in " + ", ".join(f"{n} of {len(subs)} {a} runs" for a, n in rose.items()))
    ups = [u for u in subs if ok[u]]
    col = cluster_interval([_run(subs[u], RM)["cov"]["all"] - _run(first[u], "shuffled")["cov"]["all"] for u in ups])
    substrate = col["ci_high"] < 0
    lines.append(f"- the collapse rm − shuffled at T = 1 ({len(ups)} upstream models): {_ci(col)}: "
                 + ("called below 0" if substrate else "**not called below 0: no reduction is read**"))
    manipulated = inside == len(evens) and np.mean(tv) >= 0.2 and all(n == len(subs) for n in rose.values())
    return lines, substrate and manipulated


def _ci(d: dict) -> str:
    return f"{d['value']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"


def family_holm(experiment: str, comparison: str, p: float) -> tuple[float, int]:
    """Holm over the family that declares this member (its own p given; the others' read from their committed pooled
    results): its adjusted p and the number of members read."""
    for fam in yaml.safe_load(FAMILIES.read_text()).values():
        members = fam["members"]
        if any(m["experiment"] == experiment and m["comparison"] == comparison for m in members):
            ps = {f"{experiment}/{comparison}": p}
            for m in members:
                if m["experiment"] == experiment:
                    continue
                path = FAMILIES.parent / m["experiment"] / "metrics/task.json"
                if kept.exists(path):
                    c = kept.read_json(path)["comparisons"][m["comparison"]]
                    ps[f"{m['experiment']}/{m['comparison']}"] = c[m.get("reading", c.get("primary", "gap"))]["p"]
            return holm(ps)[f"{experiment}/{comparison}"], len(ps)
    raise SystemExit(f"{experiment} {comparison}: a member of no family in {FAMILIES}")


def call(root: Path, pooled: dict, collapse: float, read: bool) -> list[str]:
    """The plan's reading of the primary (Δ coverage at T = 1, Holm over the family)."""
    g = pooled["comparisons"][f"{ORACLE}:{RM}"]["same_temperature"]
    p_holm, n = family_holm(root.name, f"{ORACLE}:{RM}", g["p"])
    called = p_holm <= ALPHA
    verdict = ("balancing the clusters by label reduces the RM's loss of right answers" if called and g["value"] > 0
               and g["mde"] <= 0.3 * collapse else "a reduction, not measured to the plan's MDE" if called and
               g["value"] > 0 else "called below 0: balancing adds to the loss" if called else
               f"no re-weighting between the trained clusters reduces the loss by as much as the MDE ({g['mde']:.3f})")
    if not read:
        verdict = f"not read (a check above failed): {verdict}"
    r = pooled["comparisons"][f"{ORACLE}:{RM}"]["range"]
    return [f"- {ORACLE}:{RM}, Δ coverage at T = 1: {_ci(g)}, p {g['p']:.4f}, Holm over {n} members {p_holm:.4f}, "
            f"MDE {g['mde']:.3f} ({g['mde'] / collapse:.0%} of the collapse {collapse:.3f}): **{verdict}**",
            "- the same reading's interval from the bootstrap over upstream models and items (a secondary): "
            + (_ci(g["two_way"]) + f", SE {g['two_way']['widening']:.2f}x the t interval's" if "two_way" in g
               else "not pooled (run `python -m speedrun.eval.upstream` on the experiment)"),
            f"- the range over the four readings: {r['low']:+.3f} to {r['high']:+.3f} ("
            + ", ".join(f"{k} {v:+.3f}" for k, v in r["readings"].items()) + ")"]


def _right(sub: Path, model: str, temperature: float) -> dict[str, list[str]]:
    a = kept.read_parquet(sub / "answers.parquet", columns=["model", "temperature", "item_id", "answer"])
    return right_answers(a[(a["model"] == model) & (a["temperature"] == temperature)]).get(model, {})


def secondaries(root: Path, subs: dict, first: dict, slow: dict, ok: dict[str, bool]) -> list[str]:
    """Each secondary, pooled over upstream models with a t interval (no calls)."""
    runs = {u: (_run(s, ORACLE), _run(s, RM)) for u, s in subs.items()}
    rows = [("Δ gold pass@1 at the end of training", [o["gold"] - r["gold"] for o, r in runs.values()])]
    for k in sorted(set.intersection(*(set(o["cov"]) for o, _ in runs.values())) - {"all"}):
        rows.append((f"Δ coverage at T = 1, {k}", [o["cov"][k] - r["cov"][k] for o, r in runs.values()]))
    clusters = [k for k in next(iter(runs.values()))[0]["cov"] if k != "all"]
    rows.append(("Δ coverage, the clusters weighted equally", [np.mean([o["cov"][k] - r["cov"][k] for k in clusters])
                                                              for o, r in runs.values()]))
    rows.append(("KL at the end: oracle − rm", [o["kl"] - r["kl"] for o, r in runs.values()]))
    ups = [u for u in subs if ok[u]]
    at_kl = [at_control_kl(runs[u][0]["kl"], runs[u][0]["cov"]["all"], (runs[u][1]["kl"], runs[u][1]["cov"]["all"]),
                           (_run(slow[u], RM)["kl"], _run(slow[u], RM)["cov"]["all"]))["value"]
             for u in ups if u in slow]
    rows.append((f"Δ coverage at the oracle's KL (rm's line through lr 3e-4 and 1e-4; {len(at_kl)} models)", at_kl))
    rows.append(("oracle − rm_density (committed), Δ coverage at T = 1",
                 [runs[u][0]["cov"]["all"] - _run(first[u], "rm_density")["cov"]["all"] for u in ups]))
    shares = [(runs[u][0]["cov"]["all"] - runs[u][1]["cov"]["all"])
              / (_run(first[u], "shuffled")["cov"]["all"] - runs[u][1]["cov"]["all"]) for u in ups]
    rows.append(("share of the collapse recovered (per model)", shares))
    temperature = next(iter(subs.values()))["arm_temperature"]
    narrow = [narrowing(_right(root / u, f"{ORACLE}_s{SEED}", temperature),
                        _right(root / u, f"{RM}_s{SEED}", temperature))["value"] for u in subs]
    rows.append(("Δ distinct values at an equal number of right answers (symmetric rarefaction)", narrow))
    out = ["| secondary | Δ [95% CI, t over upstream] | MDE |", "|---|---:|---:|"]
    return out + [f"| {name} | {_ci(d := cluster_interval(v))} | {d['mde']:.3f} |" for name, v in rows]


@app.command(help=__doc__.splitlines()[0])
def main(root: Annotated[Path, typer.Argument(help="task-oracle-rm: sft_<seed>/ sub-runs with rm and rm_balanced")],
         first: Annotated[Path, typer.Option(help="the committed arms on the same upstream models")] = Path(
             "reports/experiments/task-selection-rm"),
         slow: Annotated[Path, typer.Option(help="rm at lr 1e-4 on the same upstream models")] = Path(
             "reports/experiments/task-selection-rm/slow"),
         rebuild_only: Annotated[bool, typer.Option(help="only the rebuild check, which reads no outcome (on the "
                                                         "sub-runs kept so far, before their SFT answers drop)")
                                 ] = False) -> None:
    if rebuild_only:
        ok = rebuilt(root, first, list(sub_runs(root)))
        print(f"rebuild: equal on {sum(ok.values())} of {len(ok)} upstream models"
              + "".join(f"\n- {u}: {'equal' if v else '**differs**'}" for u, v in ok.items()))
        raise typer.Exit(0 if all(ok.values()) else 1)
    subs, earlier, smaller = sub_runs(root), sub_runs(first), sub_runs(slow)
    grpo = {u: kept.read_json(root / u / "metrics/task_grpo.json") for u in subs}
    for u, s in earlier.items():  # the committed arms' first run must be seed 1201 for the pairing
        if u in subs and kept.read_json(first / u / "metrics/task_grpo.json")[f"{RM}_s{SEED}"]["kl_end"] != \
                s["training"][RM]["kl_end"][0]:
            raise SystemExit(f"{first / u}: its first rm run is not seed {SEED}")
    ok = rebuilt(root, first, list(subs))
    lines, read = checks(subs, grpo, earlier, ok)
    print(f"{root.name}: {len(subs)} upstream models ({', '.join(subs)})\n\nChecks (read first):\n")
    print("\n".join(lines))
    pooled = pool(root, two_way=True)
    ups = [u for u in subs if ok[u]]
    collapse = -cluster_interval([_run(subs[u], RM)["cov"]["all"] - _run(earlier[u], "shuffled")["cov"]["all"]
                                  for u in ups])["value"]
    print("\nThe call (the plan's primary):\n\n" + "\n".join(call(root, pooled, collapse, read)))
    print("\nSecondaries (no calls):\n\n" + "\n".join(secondaries(root, subs, earlier, smaller, ok)))
    print("\nEvery reading of rm_balanced:rm, pooled (speedrun.eval.upstream):\n")
    for k in READINGS:
        if k in pooled["comparisons"][f"{ORACLE}:{RM}"]:
            print(f"- {k}: {_ci(pooled['comparisons'][f'{ORACLE}:{RM}'][k])}")


if __name__ == "__main__":
    run_app(app, None, "analysis/task_oracle.py")
