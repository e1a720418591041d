"""Figures of a committed chat-track experiment, drawn on demand from its metrics (no PNG is committed there).

    python -m speedrun.eval.replot reports/experiments/density-16-seeds   # writes <dir>/figures/*.png (ignored)

From `metrics/diversity.json` (flat.flat_metrics' output) it draws what those numbers hold: every model's value
per metric (metrics.png; the per-model intervals are in report.md, not in the metrics), one forest plot per
comparison (forest_<a>_vs_<b>.png: pooled Δ, interval and verdict, each seed's Δ from the per-run values) and
reward against the first primary per run (scatter.png). Training curves and sampling shares need the runs' logs,
which an experiment folder does not keep.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
import yaml

from speedrun import kept
from speedrun.typer_app import new_app, run_app
from speedrun.eval.compare import FAIL, METRIC_BY_NAME, PASS, UNSURE
from speedrun.eval.figures import plot_forest, plot_metrics, plot_scatter

RUN = re.compile(r"^grpo_(.+)_s(\d+)$")
VERDICT = {1: PASS, -1: FAIL, 0: UNSURE}
app = new_app()


def result_from_metrics(flat: dict) -> dict:
    """The parts of compare.evaluate's result that flat.flat_metrics keeps, in the shape figures.py reads. Primaries are
    the metrics with an MDE share (flat_metrics writes one per primary); a model's interval is its value."""
    runs = sorted((k for k in flat if RUN.match(k)), key=lambda k: (RUN.match(k)[1], int(RUN.match(k)[2])))
    variants: dict[str, list[str]] = {}
    for r in runs:
        variants.setdefault(RUN.match(r)[1], []).append(r)
    reference = "sft" if "sft" in flat else None
    models = ([reference] if reference else []) + runs
    names = [n for n in flat[runs[0]] if n in METRIC_BY_NAME and all(n in flat[m] for m in models)]
    values = {m: {n: float(flat[m][n]) for n in names} for m in models}
    comparisons, primary = [], []
    for key, c in flat.items():
        if not isinstance(c, dict) or "delta" not in c:
            continue
        a, b = key.split("_vs_")
        primary = primary or [n[len("mde_share_"):] for n in c if n.startswith("mde_share_")]
        seeds = sorted({int(RUN.match(r)[2]) for r in variants[a]} & {int(RUN.match(r)[2]) for r in variants[b]})
        delta = {n: {"value": c["delta"][n], "ci_low": c["ci_low"][n], "ci_high": c["ci_high"][n],
                     "role": "primary" if n in primary else "secondary",
                     "verdict": VERDICT[c["verdict"][n]] if n in c["verdict"] else None}
                 for n in names if n in c["delta"]}
        per_seed = {s: {n: values[f"grpo_{a}_s{s}"][n] - values[f"grpo_{b}_s{s}"][n] for n in delta} for s in seeds}
        comparisons.append({"a": a, "b": b, "runs_b": variants[b], "delta": delta, "per_seed": per_seed})
    return {"metrics": names, "models": models, "values": values, "reference": reference, "variants": variants,
            "ci": {m: {n: [v, v] for n, v in values[m].items()} for m in models}, "comparisons": comparisons,
            "primary": primary}


def replot(folder: Path) -> list[Path]:
    """Draw the figures of one experiment folder into folder/figures; returns their paths."""
    path = folder / "metrics/diversity.json"
    if not kept.exists(path):
        raise SystemExit(f"{path}: no such file (replot draws a chat-track experiment from its metrics)")
    result = result_from_metrics(kept.read_json(path))
    declared = folder.parent / "families.yaml"  # an experiment older than the MDE shares: its declared primaries
    if not result["primary"] and declared.exists():
        members = [m for f in yaml.safe_load(declared.read_text()).values() for m in f["members"]]
        result["primary"] = next((m["primary"] for m in members
                                  if m["experiment"] == folder.name and "primary" in m), [])
        for c in result["comparisons"]:
            for n, d in c["delta"].items():
                d["role"] = "primary" if n in result["primary"] else d["role"]
    out = folder / "figures"
    written = [out / "metrics.png"]
    plot_metrics(result, written[0])
    for c in result["comparisons"]:
        written.append(out / f"forest_{c['a']}_vs_{c['b']}.png")
        plot_forest(result, c, written[-1])
    if result["primary"] and "reward" in result["metrics"]:
        written.append(out / "scatter.png")
        plot_scatter(result, result["primary"][0], written[-1])
    return written


@app.command(help=__doc__.splitlines()[0])
def command(folders: Annotated[list[Path], typer.Argument(
        metavar="FOLDER", help="experiment folders under reports/experiments")]) -> None:
    """Draw every folder's figures; prints the files written."""
    for folder in folders:
        for p in replot(folder):
            print(p)


def main(argv: list[str] | None = None) -> None:
    """`python -m speedrun.eval.replot` (argv: default sys.argv[1:]): returns on success, exits non-zero otherwise."""
    run_app(app, argv, "python -m speedrun.eval.replot")


if __name__ == "__main__":
    main()
