"""speedrun-frontier: the reward-diversity frontier of a sweep, read from DVC's experiments.

    dvc exp run --queue -S 'beta=0.01,0.04,0.1' && dvc queue start   # one experiment per beta
    dvc exp show --json > exps.json                                   # (or let the command call it)
    speedrun-frontier --out reports/figures/frontier.png

For every experiment (and the workspace), per variant: its held-out RM reward gained over the SFT model
against its gain on a diversity metric (the first primary one by default), each with the 95% interval
over that variant's training seeds (reports/metrics/diversity.json, `<variant>_vs_sft`). A point up and
to the right gains reward and diversity; density against baseline at equal beta is the research question.
A console tool, not a pipeline stage: it reads whatever experiments exist.
"""
from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from matplotlib.figure import Figure

from speedrun.typer_app import new_app, run_app
from speedrun.common import read_json, write_bytes, write_text

METRICS_FILE = "reports/metrics/diversity.json"
app = new_app()


def experiments(show: list[dict], metrics_file: str = METRICS_FILE) -> list[dict[str, Any]]:
    """(name, params, metrics) of every record in `dvc exp show --json` output holding the metrics file,
    the baseline commits included, the workspace too where it differs from them; queued or failed ones (no
    metrics yet) are left out."""
    out: list[dict[str, Any]] = []

    def visit(node: dict) -> None:
        data = node.get("data") or {}
        metrics = ((data.get("metrics") or {}).get(metrics_file) or {}).get("data")
        if metrics:
            params = ((data.get("params") or {}).get("params.yaml") or {}).get("data") or {}
            rev = str(node.get("rev", "?"))
            name = node.get("name") or data.get("name") or (rev if rev == "workspace" else rev[:7])
            out.append({"name": name, "rev": node.get("rev"), "params": params, "metrics": metrics})
        for group in node.get("experiments") or []:
            for rev in group.get("revs") or []:
                visit(rev)

    for node in show:
        visit(node)
    # the workspace of a clean checkout repeats its commit: keep the commit's name
    seen = {json.dumps([e["params"], e["metrics"]], sort_keys=True) for e in out if e["name"] != "workspace"}
    return [e for e in out if e["name"] != "workspace" or json.dumps([e["params"], e["metrics"]], sort_keys=True)
            not in seen]


def _param(params: dict, key: str) -> Any:
    value: Any = params
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def frontier_points(exps: list[dict], metric: str, sweep: str, reference: str = "sft") -> list[dict[str, Any]]:
    """One point per (experiment, variant): Δ metric and Δ reward against the reference, with intervals."""
    points = []
    for e in exps:
        for key, block in e["metrics"].items():
            if not (isinstance(block, dict) and key.endswith(f"_vs_{reference}") and metric in block
                    and "reward" in block):
                continue
            points.append({"experiment": e["name"], "variant": key[: -len(f"_vs_{reference}")],
                           "sweep": _param(e["params"], sweep),
                           **{f"{axis}{s}": block[f"{m}{s}"] for axis, m in (("x", metric), ("y", "reward"))
                              for s in ("", "_ci_low", "_ci_high")}})
    # an arm DVC took from its cache in several experiments scores the same in each: one point, every name kept
    merged: dict[tuple, dict[str, Any]] = {}
    for p in sorted(points, key=lambda p: (p["variant"], str(p["sweep"]), p["experiment"])):
        key = (p["variant"], str(p["sweep"]), *(p[f"{a}{s}"] for a in "xy" for s in ("", "_ci_low", "_ci_high")))
        if key in merged:
            merged[key]["experiment"] += f", {p['experiment']}"
        else:
            merged[key] = dict(p)
    return list(merged.values())


def plot_frontier(points: list[dict], metric: str, sweep: str, path: Path) -> None:
    colors = {"density": "#d62728", "baseline": "#1f77b4"}
    spare = iter(["#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"])
    fig = Figure(figsize=(6.5, 4.8))
    ax = fig.add_subplot(1, 1, 1)
    for k, variant in enumerate(sorted({p["variant"] for p in points})):
        pts = sorted((p for p in points if p["variant"] == variant), key=lambda p: (str(p["sweep"]), p["experiment"]))
        color = colors.get(variant) or next(spare, "#555555")
        xs, ys = [p["x"] for p in pts], [p["y"] for p in pts]
        ax.errorbar(xs, ys, xerr=[[p["x"] - p["x_ci_low"] for p in pts], [p["x_ci_high"] - p["x"] for p in pts]],
                    yerr=[[p["y"] - p["y_ci_low"] for p in pts], [p["y_ci_high"] - p["y"] for p in pts]],
                    fmt="o-", color=color, capsize=3, alpha=0.8, label=variant)
        for p in pts:
            ax.annotate(f"{sweep}={p['sweep']}", (p["x"], p["y"]), fontsize=7, color=color,  # stacked per variant:
                        xytext=(4, 4 + 9 * k), textcoords="offset points")  # points of one sweep value often coincide
    ax.axhline(0, color="black", linewidth=0.6)
    ax.axvline(0, color="black", linewidth=0.6)
    ax.set_xlabel(f"\u0394 {metric} vs SFT (95% interval over training seeds)")
    ax.set_ylabel("\u0394 held-out RM reward vs SFT")
    ax.set_title("reward-diversity frontier: one point per experiment and variant", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    write_bytes(path, buf.getvalue())


def table(points: list[dict], metric: str, sweep: str) -> str:
    lines = [f"| experiment | {sweep} | variant | \u0394 {metric} vs SFT [95% CI] | \u0394 reward vs SFT [95% CI] |",
             "|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p['experiment']} | {p['sweep']} | {p['variant']} | {p['x']:+.4f} [{p['x_ci_low']:+.4f}, "
                     f"{p['x_ci_high']:+.4f}] | {p['y']:+.3f} [{p['y_ci_low']:+.3f}, {p['y_ci_high']:+.3f}] |")
    return "\n".join(lines) + "\n"


@app.command(help=__doc__.splitlines()[0])
def main(show_json: Annotated[Optional[Path], typer.Option(
             metavar="FILE", help="saved `dvc exp show --json` output (default: run it here)")] = None,
         metric: Annotated[str, typer.Option(
             help="diversity metric on the x axis (default: the first of eval.primary)")] = "",
         sweep: Annotated[str, typer.Option(help="the swept param, dotted (labels and orders the points)")] = "beta",
         out: Annotated[Path, typer.Option(metavar="FILE", help="figure")] = Path("reports/figures/frontier.png"),
         table_out: Annotated[Optional[Path], typer.Option(
             metavar="FILE", help="also write the table (markdown) here")] = None) -> None:
    """Read the experiments (from show_json, else `dvc exp show --json`), draw the frontier, print its table."""
    if show_json is not None:
        show = read_json(show_json)
    else:
        res = subprocess.run(["dvc", "exp", "show", "--json"], capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"`dvc exp show --json` failed (run from the repository): {res.stderr.strip()}")
        show = json.loads(res.stdout)
    exps = experiments(show)
    if not exps:
        raise SystemExit(f"no experiment holds {METRICS_FILE} yet: run `dvc repro` or `dvc queue start`")
    if not metric:
        primary = _param(exps[0]["params"], "eval.primary") or ""  # a list; a comma string before lists
        metric = (primary.split(",") if isinstance(primary, str) else primary)[0] if primary else "ead_1"
    points = frontier_points(exps, metric, sweep)
    if not points:
        raise SystemExit(f"no '<variant>_vs_sft' block with {metric!r} and reward in {METRICS_FILE} "
                                 f"(experiments: {[e['name'] for e in exps]})")
    plot_frontier(points, metric, sweep, out)
    md = table(points, metric, sweep)
    if table_out is not None:
        write_text(table_out, md)
    print(md + f"figure: {out}")


def cli(argv: Optional[list[str]] = None) -> None:
    """speedrun-frontier's command line (argv: default sys.argv[1:]): returns on success, exits non-zero otherwise."""
    run_app(app, argv, "speedrun-frontier")


if __name__ == "__main__":
    cli()
