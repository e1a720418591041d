"""How much of the RM arm's coverage loss beyond drift is fewer right answers, and how much is narrowing? (post hoc,
not a reading any plan fixed; docs/LOG.md 2026-11-29). Per upstream seed of an experiment with rm and shuffled arms
(sub-runs sft_<s>/answers.parquet, T = 1, the trained clusters): the shuffled arm's coverage; the coverage the shuffled
arm's own right answers would give if thinned, per item, to as many right answers as each rm run gave (expected
distinct values drawn without replacement: a pure loss of right answers, no narrowing); and the rm arm's coverage. The
thinned-minus-shuffled part is the loss that fewer right answers explain; rm minus thinned is the narrowing at equal
right answers (thinning to the pooled shuffled runs inflates it: bench/rarefaction_bias.py), and beside it the symmetric
reading, each rm run against the shuffled run of its seed, both thinned to the smaller count
(speedrun.eval.rarefaction.narrowing). Then Δgap against Δpass@1 across upstream seeds.

    python analysis/task_rm_decomposition.py reports/experiments/task-rm-collapse-10-upstream"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import typer
from scipy import stats

from speedrun import kept
from speedrun.eval.rarefaction import expected_distinct, narrowing, right_answers
from speedrun.typer_app import new_app

app = new_app()


@app.command(help=__doc__)
def main(experiment: Path = typer.Argument(..., help="an experiment folder with sft_<s>/ sub-runs"),
         treatment: str = typer.Option("rm"), control: str = typer.Option("shuffled")) -> None:
    rows, gaps, pass1, symmetric = [], [], [], []
    subs = [p.parent.parent for p in kept.glob(experiment, "sft_*/metrics/task.json")]  # files or zip members
    for sub in sorted(subs, key=lambda p: int(p.name.split("_")[1])):
        m = kept.read_json(sub / "metrics/task.json")
        c = m["comparisons"][f"{treatment}:{control}"]
        gaps.append(c["gap"]["value"])
        pass1.append(c["pass@1"]["value"])
        a = kept.read_parquet(sub / "answers.parquet", columns=["model", "temperature", "item_id", "cluster", "answer"])
        a = a[a["cluster"].isin(m["blind"]["trained"]) & (a["temperature"] == m["arm_temperature"])]
        ctrl = a[a["model"].str.startswith(f"{control}_s")]
        counts = ctrl.dropna(subset=["answer"]).groupby("item_id")["answer"].apply(lambda x: list(x.value_counts()))
        thinned, actual = [], []
        for run, t in a[a["model"].str.startswith(f"{treatment}_s")].groupby("model"):
            for item, g in t.groupby("item_id"):
                thinned.append(expected_distinct(counts.get(item, []), int(g["answer"].notna().sum())))
                actual.append(g["answer"].dropna().nunique())
        ctrl_cov = ctrl.groupby(["model", "item_id"])["answer"].nunique().groupby("model").mean().mean()
        right = right_answers(a)
        pairs = [(model, f"{control}_s{model.rsplit('_s', 1)[1]}") for model in right
                 if model.startswith(f"{treatment}_s")]  # each treatment run against the control run of its seed
        symmetric.append(np.mean([narrowing(right[t], right[c])["value"] for t, c in pairs if c in right]))
        rows.append((sub.name, ctrl_cov, np.mean(thinned), np.mean(actual)))
    print(f"{'upstream':>9} {control:>9} {'thinned':>8} {treatment:>8} {'total':>7} {'fewer':>7} {'narrower':>8}")
    for name, c, t, r in rows:
        print(f"{name:>9} {c:9.3f} {t:8.3f} {r:8.3f} {r - c:+7.3f} {t - c:+7.3f} {r - t:+8.3f}")
    r = np.array([row[1:] for row in rows])
    parts = {"total": r[:, 2] - r[:, 0], "fewer right answers": r[:, 1] - r[:, 0], "narrower": r[:, 2] - r[:, 1],
             "narrower, symmetric (each run pair thinned to its smaller count)": np.array(symmetric)}
    q = stats.t.ppf(0.975, len(rows) - 1)
    for name, x in parts.items():
        se = x.std(ddof=1) / np.sqrt(len(x))
        print(f"{name}: {x.mean():+.3f} [{x.mean() - q * se:+.3f}, {x.mean() + q * se:+.3f}] (t({len(x) - 1}))")
    rho = stats.pearsonr(pass1, gaps)
    print(f"Δgap against Δpass@1 across upstream seeds: r {rho.statistic:.2f} (p {rho.pvalue:.3f})")


if __name__ == "__main__":
    app()
