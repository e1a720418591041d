"""Calibrates how the task frontier is read between temperatures (eval/envelope.py): each interior temperature of the
task SFT model that lies on its envelope is left out in turn, and its coverage is predicted at its own pass@1 from
the others, by the chord between its neighbours in pass@1 (the reading before 2026-11-29) and by the envelope of the
monotone cubic in temperature (the reading now). Printed per temperature: measured coverage, both predictions and
their errors; then the mean error (bias) and mean absolute error of each, over the temperatures and over bootstrap
draws of the items. A chord along a concave curve errs low.

    python bench/frontier_interpolation.py outs/task_eval/answers.parquet
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import pandas as pd
import typer

from speedrun import kept
from speedrun.eval.envelope import dominated, envelope_at
from speedrun.eval.task_track import curve_columns, item_draws, per_item
from speedrun.typer_app import new_app

app = new_app()


def left_out_errors(points: np.ndarray) -> list[tuple[float, float, float, float]]:
    """(temperature, measured coverage, chord prediction, envelope prediction) for each interior point on the
    envelope, predicted from the other points."""
    out = []
    keep = ~dominated(points)
    for i in range(1, len(points) - 1):
        if not keep[i]:
            continue
        rest = np.delete(points, i, axis=0)
        t, p1, cov = points[i]
        by_p = rest[np.argsort(rest[:, 1])]
        chord = float(np.interp(p1, by_p[:, 1], by_p[:, 2]))
        out.append((float(t), float(cov), chord, float(envelope_at(rest, np.array([p1]))[0][0])))
    return out


@app.command(help=__doc__.splitlines()[0])
def main(answers: Annotated[Path, typer.Argument(help="a task_eval answers.parquet")],
         model: str = typer.Option("task_sft", help="the model whose temperature curve is read"),
         n_boot: int = typer.Option(200, help="bootstrap draws of the items")) -> None:
    a = kept.read_parquet(answers)
    runs = a[a["model"] != model]
    if len(runs):  # the items task_eval's frontier uses: those the runs answered (task.train_clusters)
        a = a[a["cluster"].isin(set(runs["cluster"]))]
    a = a[a["model"] == model]
    temps = sorted(a["temperature"].unique())
    tables = [per_item(a[a["temperature"] == t], (1,)) for t in temps]
    cols = curve_columns(tables)
    draws = item_draws(len(tables[0]), n_boot, 0, "frontier_interpolation")
    rows = []
    for d, r in enumerate(draws):
        pts = np.column_stack([temps, cols[:, :, r].mean(-1)])
        for t, cov, chord, env in left_out_errors(pts):
            rows.append({"draw": d, "T": t, "coverage": cov, "chord": chord - cov, "envelope": env - cov})
    df = pd.DataFrame(rows)
    print(f"{answers}: {model} at T = {', '.join(f'{t:g}' for t in temps)}; {len(tables[0])} items")
    full = df[df["draw"] == 0]
    print("| left-out T | coverage | chord error | envelope error |\n|---:|---:|---:|---:|")
    for _, x in full.iterrows():
        print(f"| {x['T']:g} | {x['coverage']:.3f} | {x['chord']:+.3f} | {x['envelope']:+.3f} |")
    boot = df[df["draw"] > 0]
    for name in ("chord", "envelope"):
        print(f"{name}: bias {full[name].mean():+.4f} (bootstrap draws {boot[name].mean():+.4f}), mean |error| "
              f"{full[name].abs().mean():.4f} ({boot[name].abs().mean():.4f})")


if __name__ == "__main__":
    app()
