"""A pre-registered matched run and its replication read as one design (density by default; group-balanced too).

task-density-matched (seeds 701-740 per arm) and task-density-matched-replication (801-840) ran the same command on
the same 609 held-out items and task SFT model, differing only in their training seeds; so did task-balanced-matched
(901-936) and its replication (941-976), read at balanced's pass@1. Each was analysed alone, as its plan fixed. This
script reads a pair from their committed answers (every run's answers at T = 0.75, 1, 1.25 and the SFT model's at
seven temperatures), first recomputes each run's own primary with task_compare.compare_arms, the function task_eval
called (it equalled the committed metrics until the envelope frontier (docs/LOG.md, 2026-11-29) changed the reading; the
script prints where today's reading differs), then the two together: every run of both per arm, read at the pooled
control's (or treatment's) pass@1, with the same interval over seeds and items, MDE and pass@1 non-inferiority. A
post-hoc summary of two reported runs, not a new test: the family's call stays the first run's (reports/experiments).

    python analysis/task_pooled.py      # about 5 minutes on a 2-core CPU (bootstraps over 160 runs)
    python analysis/task_pooled.py --runs task-balanced-matched task-balanced-matched-replication \
        --comparison balanced:checker --matched-at treatment
"""
from pathlib import Path
from typing import Literal

import typer

from speedrun import kept
from speedrun.typer_app import new_app

from speedrun import params
from speedrun.eval.task_compare import compare_arms
from speedrun.eval.task_track import pass_k_values

ROOT = Path("reports/experiments")


def load(folder: Path) -> tuple[dict, dict]:
    """(SFT answers per temperature, per arm the runs' answers per temperature in seed order) of one experiment."""
    answers = kept.read_parquet(folder / "answers.parquet", columns=["model", "temperature", "item_id", "cluster",
                                                                   "answer"])
    sft = {float(t): a for t, a in answers[answers.model == "task_sft"].groupby("temperature")}
    curves: dict[str, list[dict]] = {}
    for model, a in answers[answers.model != "task_sft"].groupby("model"):
        arm, seed = model.rsplit("_s", 1)
        curves.setdefault(arm, []).append((int(seed), {float(t): x for t, x in a.groupby("temperature")}))
    return sft, {arm: [c for _, c in sorted(runs, key=lambda r: r[0])] for arm, runs in curves.items()}


def compare(sft: dict, curves: dict, comparison: str, matched_at: str) -> dict:
    """compare_arms as task_eval calls it with the experiments' params (matched primary, the GRPO temperature 1)."""
    p = params.load(Path("params.yaml"))
    c = p.task.eval
    arms = {arm: [run[1.0] for run in runs] for arm, runs in curves.items()}
    return compare_arms(sft, arms, [comparison], c.n_boot, p.seed, pass_k_values(c.samples), c.pass1_margin,
                        c.mde_share, curves, 1.0, "matched", matched_at)[comparison]


def line(name: str, r: dict, runs: int) -> str:
    m, p1 = r["matched"], r["pass@1"]
    return (f"| {name} | {runs} | {m['value']:+.3f} [{m['ci_low']:+.3f}, {m['ci_high']:+.3f}] | {m['collapse']:.3f} | "
            f"{m['mde']:.3f} ({m['mde'] / m['collapse']:.0%}) | {m['between_var']:.6f} | {m['prompt_var']:.6f} | "
            f"{p1['value']:+.3f} [{p1['ci_low']:+.3f}, {p1['ci_high']:+.3f}] vs −{p1['margin']:.3f}: {p1['verdict']} |")


app = new_app()


@app.command(help=__doc__)
def main(runs: tuple[str, str] = typer.Option(("task-density-matched", "task-density-matched-replication"),
                                               help="the first run's and its replication's folders under "
                                                    "reports/experiments"),
         comparison: str = typer.Option("density:checker", help="treatment:control, as the runs compared them"),
         matched_at: Literal["control", "treatment"] = typer.Option("control", help="whose pass@1 the runs were read "
                                                                   "at (task.eval.matched_at)")) -> None:
    control = comparison.split(":")[1]
    rows = ["| runs | seeds per arm | Δ coverage at equal pass@1 [95% CI] | collapse | MDE (of the collapse) | "
            "between-seed var | item var | Δ pass@1 [95% CI] vs margin |", "|---|---:|---|---:|---:|---:|---:|---|"]
    loaded = {name: load(ROOT / name) for name in runs}
    for name, (sft, curves) in loaded.items():
        r = compare(sft, curves, comparison, matched_at)
        committed = kept.read_json(ROOT / name / "metrics/task.json")["comparisons"][comparison]
        moved = {k: (committed["matched"][k], r["matched"][k]) for k in ("value", "ci_low", "ci_high", "mde")
                 if abs(r["matched"][k] - committed["matched"][k]) >= 1e-4}
        if moved:  # the committed metrics are their run's instrument's; the frontier has changed since (docs/LOG.md)
            print(f"{name}: today's compare_arms reads {comparison} otherwise than the committed metrics "
                  f"(committed, today): {moved}")
        rows.append(line(name, r, len(curves[control])))
    first, second = (loaded[n] for n in runs)
    assert all(first[0][t].equals(second[0][t]) for t in first[0]), "the two runs' task SFT answers differ"
    both = {arm: first[1][arm] + second[1][arm] for arm in first[1]}
    pooled = compare(first[0], both, comparison, matched_at)
    rows.append(line("both, pooled (post hoc)", pooled, len(both[control])))
    print("\n".join(rows))


if __name__ == "__main__":
    app()
