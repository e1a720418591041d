"""Coverage at matched pass@1: a primary for the task track that does not move with an arm's pass@1.

The registered primary compares each run with the task SFT model's temperature frontier at the run's own pass@1.
Where that frontier is steep, a small pass@1 difference between arms becomes a large gap difference, and every
resample of the items moves the frontier between them (the arm x item term of task-density-609-items came out 8x and
23x its projection). Here each GRPO run is also sampled at a few more temperatures, so it traces its own
pass@1-versus-coverage curve; every run is read on its own curve at one pass@1 (the control arm's mean at the GRPO
temperature, on the same item draw), and the arms are compared there: coverage at equal pass@1, no SFT frontier in
the difference (task_track.matched_draws; task_eval's matched primary, task.eval.primary). Printed beside it, for the
same runs: the registered frontier-gap primary. Both with stats.pooled_delta's interval (seeds + items), the MDE at
these seeds (Holm's first step over m) and the seeds per arm for an MDE of 30% of the control's collapse. A pilot for
the design, not a test: its runs' results at the GRPO temperature are already known.

    # from a workspace holding the runs (outs/task_grpo, data/task, outs/tokenizer), answers at T = 1 committed:
    python analysis/task_matched.py reports/experiments/<experiment>/answers.parquet density:checker \
        balanced:checker --temperatures 0.75,1.25 --extra reports/experiments/<experiment>/answers_matched.parquet
    # a run sampled at several temperatures already (task.eval.run_temperatures), a cooler one added, read paired:
    python analysis/task_matched.py F/answers.parquet balanced:checker --extra F/answers.parquet,F/answers_t05.parquet \
        --paired --collapse 0.283 --m 1,6
"""
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import typer

from speedrun import kept
from speedrun.typer_app import new_app

from speedrun import params
from speedrun import tokenizer as tokenizer_lib
from speedrun.common import write_parquet
from speedrun.data import task
from speedrun.eval.stats import mde, pooled_delta, runs_needed
from speedrun.eval.task_track import column_mean, gap_draws, item_draws, matched_draws, per_item, sample_answers
from speedrun.train.checkpoint import load_model

K = (1, 16)


def sample_extra(models: list[str], temperatures: list[float], runs_dir: Path, out: Path) -> pd.DataFrame:
    """Every run's answers at the extra temperatures, as task_eval samples them (same items, seed and draws)."""
    p = params.load()
    tok = tokenizer_lib.load(Path("outs/tokenizer"))
    items = [i for i in task.load_items(Path("data/task/items.parquet")) if i.split == "eval"]
    frames = []
    for name in models:
        model, _ = load_model(runs_dir / name, "cpu", tok.digest)
        for t in temperatures:
            frames.append(sample_answers(model, name, tok, items, p.task.eval.samples, p.task.eval.max_new_tokens,
                                         t, p.seed, "cpu"))
        print(f"sampled {name} at {temperatures}", flush=True)
    extra = pd.concat(frames, ignore_index=True)
    write_parquet(out, extra)
    return extra


def report(name: str, a: np.ndarray, b: np.ndarray, collapse: float, ms: list[int], paired: bool = False) -> None:
    """Δ with its interval, variance terms and MDE; with `paired`, also read with run i of each arm as one pair (the
    same training seed; stats.pooled_delta(paired=True)) and the correlation of the pairs' readings."""
    for pair in (False, True) if paired else (False,):
        d = pooled_delta(a[0], b[0], a[1:], b[1:], paired=pair)
        r = a.shape[1]
        cells = []
        for m in ms:  # stats.mde's df is 2r - 2, the unpaired one: a paired design's (r - 1) makes it slightly larger
            x = mde(d["between_var"], d["prompt_var"], r, r, m)
            need = runs_needed(d["between_var"], d["prompt_var"], r, 0.3 * collapse, m)
            cells.append(f"MDE (Holm over {m}) {x:.3f} = {x / collapse:.0%} of the collapse, seeds/arm for 30%: {need}")
        how = f"paired (r = {np.corrcoef(a[0], b[0])[0, 1]:+.2f})" if pair else "unpaired"
        print(f"  {name}, {how}: Δ {d['value']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]; between-run var "
              f"{d['between_var']:.5f}, item var {d['prompt_var']:.5f}\n    " + "\n    ".join(cells))


app = new_app()


@app.command(help=__doc__)
def main(answers: str = typer.Argument(..., help="an experiment's answers.parquet (the runs at the GRPO temperature, "
                                              "the SFT sweep)"),
         comparisons: list[str] = typer.Argument(..., help="treatment:control arm pairs"),
         temperatures: str = typer.Option("0.75,1.25", help="the extra temperatures each run is sampled at"),
         extra_path: str = typer.Option(..., "--extra", help="parquet of the extra answers: read if it exists, else "
                                        "sampled; or several, comma-separated"),
         runs_dir: str = typer.Option("outs/task_grpo", "--runs", help="the runs' checkpoints (for sampling)"),
         arm_t: float = typer.Option(1.0, "--arm-temperature", help="the GRPO temperature (task.train)"),
         m: str = typer.Option("2,4", help="Holm's first step over this many tests (comma-separated)"),
         n_boot: int = typer.Option(400),
         paired: bool = typer.Option(False, "--paired", help="also read run i of each arm as a pair (same seed)"),
         collapse_at: float = typer.Option(0.0, "--collapse", help="the control's collapse the 30% target is a share "
                                           "of (default: this file's runs)")) -> None:
    torch.set_num_threads(2)
    extra_ts, ms = [float(x) for x in temperatures.split(",")], [int(x) for x in m.split(",")]
    base = kept.read_parquet(answers)
    runs = sorted(m for m in base.model.unique() if m != "task_sft")
    arms_used = {x for c in comparisons for x in c.split(":")}
    runs = [m for m in runs if m.rsplit("_s", 1)[0] in arms_used]
    paths = [Path(x) for x in extra_path.split(",")]  # several files: read them all (each must exist)
    if len(paths) == 1 and not kept.exists(paths[0]):
        extra_df = sample_extra(runs, extra_ts, Path(runs_dir), paths[0])
    else:
        extra_df = pd.concat([kept.read_parquet(x) for x in paths], ignore_index=True)
    extra_df = extra_df[extra_df.model.isin(runs) & (extra_df.temperature != arm_t)]  # the runs' other temperatures
    both = pd.concat([base[base.model.isin(runs) & (base.temperature == arm_t)], extra_df], ignore_index=True)
    temps = sorted(float(t) for t in both.temperature.unique())
    sft = {float(t): per_item(g, K) for t, g in base[base.model == "task_sft"].groupby("temperature")}
    curves: dict[str, list[dict[float, pd.DataFrame]]] = {}
    for m, g in both.groupby("model", sort=True):
        by_t = {float(t): per_item(x, K) for t, x in g.groupby("temperature")}
        curves.setdefault(m.rsplit("_s", 1)[0], []).append(by_t)
    n_items = len(next(iter(sft.values())))
    draws = item_draws(n_items, n_boot, 0, "task_matched")
    print(f"{answers}: {n_items} held-out items, runs at temperatures {temps}")
    for arm, cs in curves.items():
        pts = np.array([[(column_mean(c[t], draws[0], "pass@1"), column_mean(c[t], draws[0], "coverage"))
                         for t in temps] for c in cs])
        mono = int(sum(bool(np.all(np.diff(p[:, 0]) < 0)) for p in pts))
        print(f"  {arm}: {len(cs)} runs; mean (pass@1, coverage@16) by temperature: " + ", ".join(
            f"T {t}: ({pts[:, i, 0].mean():.3f}, {pts[:, i, 1].mean():.2f})" for i, t in enumerate(temps))
              + f"; pass@1 falls with T in {mono} of {len(cs)} runs")
    for comp in comparisons:
        a, b = comp.split(":")
        gaps = {x: gap_draws(sft, [c[arm_t] for c in curves[x]], draws) for x in (a, b)}
        here = -float(gaps[b][0].mean())
        collapse = collapse_at or here
        matched, extended = matched_draws({a: curves[a], b: curves[b]}, b, arm_t, draws)
        print(f"{comp} ({b}'s collapse below the SFT frontier here {here:.3f}; the MDE read against {collapse:.3f}):")
        report("frontier gap (the registered primary)", gaps[a], gaps[b], collapse, ms, paired)
        report(f"coverage at {b}'s pass@1 (each run's own curve; {extended:.1%} of readings extended)",
               matched[a], matched[b], collapse, ms, paired)


if __name__ == "__main__":
    app()
