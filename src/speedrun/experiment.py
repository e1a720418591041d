"""Keep a finished `dvc exp run` as two files under reports/experiments/<name>/: its README (with the plan, written
and committed before the run) and results.zip (speedrun.kept), holding everything else.

    python -m speedrun.experiment reports/experiments/task-control-20-seeds --track task

Run in the workspace the experiment ran in, before anything else changes it. Copies the track's report and metrics
JSON as the evaluation stage wrote them, every GRPO run's metrics as one JSON (one key per run), and the
evaluation's samples (task: every answer with its checker mark; chat: every response), so a per-answer analysis
reruns without models or the DVC cache; appends to the README the params as the -S overrides against the commit's
params.yaml (no copy of it) and how to draw the figures.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Annotated, Literal

import typer
import yaml

from speedrun.typer_app import new_app, run_app
from speedrun.common import read_json, write_bytes, write_parquet, write_text
from speedrun.kept import BUNDLE, pack

Track = Literal["chat", "task"]
MAX_BYTES = 2_000_000  # the most an experiment should add to git (its results.zip)
SECTION = {"task": "task", "chat": "grpo"}  # where each track's params name its arms (run) and seeds
# what each track's evaluation writes: report, metrics, per-run metrics folder, samples
TRACKS: dict[Track, tuple[str, str, str, str]] = {
    "task": ("reports/task.md", "reports/metrics/task.json", "reports/metrics/task_grpo",
             "outs/task_eval/answers.parquet"),
    "chat": ("reports/report.md", "reports/metrics/diversity.json", "reports/metrics/grpo",
             "outs/eval/samples.parquet"),
}
app = new_app()


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out |= _flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v}
    return out


def overrides(base: dict, run: dict) -> dict:
    """The dotted keys whose value differs between two params files (a key only one of them has included)."""
    fb, fr = _flat(base), _flat(run)
    gone = "<absent>"
    return {k: fr.get(k, gone) for k in sorted(set(fb) | set(fr)) if fb.get(k, gone) != fr.get(k, gone)}


def override_args(diff: dict) -> str:
    """The -S arguments that set `diff` (lists in DVC's YAML list form)."""
    fmt = lambda v: "[" + ",".join(str(x) for x in v) + "]" if isinstance(v, list) else str(v)  # noqa: E731
    return " ".join(f"-S '{k}={fmt(v)}'" for k, v in diff.items())


def keep(folder: Path, track: str, root: Path = Path(".")) -> list[Path]:
    """Copy the track's outputs from the workspace `root` into `folder`, packed into its results.zip; returns the
    paths written (members of the zip, read with speedrun.kept)."""
    readme = folder / "README.md"
    if not readme.exists():
        raise SystemExit(f"{readme}: no such file (commit the experiment's plan there before the run)")
    report, metrics, runs_dir, samples = (root / p for p in TRACKS[track])
    for p in (report, metrics, runs_dir, samples):
        if not p.exists():
            raise SystemExit(f"{p}: no such file or folder (run the experiment's `dvc exp run` in {root} first)")
    written = [folder / report.name, folder / "metrics" / metrics.name, folder / "metrics" / f"{runs_dir.name}.json",
               folder / samples.name]
    for src, dst in ((report, written[0]), (metrics, written[1]), (samples, written[3])):
        write_bytes(dst, src.read_bytes())
    params = yaml.safe_load((root / "params.yaml").read_text())
    names = [f"{arm}_s{seed}" for arm in params[SECTION[track]]["run"] for seed in params[SECTION[track]]["seeds"]]
    missing = [n for n in names if not (runs_dir / f"{n}.json").exists()]
    if missing:
        raise SystemExit(f"{runs_dir}: no metrics of the experiment's runs {missing} (did the run finish?)")
    runs = {n: read_json(runs_dir / f"{n}.json") for n in names}  # only this experiment's runs
    write_text(written[2], json.dumps(runs, indent=1, sort_keys=True) + "\n")
    if track == "chat":
        written += _chat_extras(folder, root, names)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                            check=True).stdout.strip()
    base = yaml.safe_load(subprocess.run(["git", "show", "HEAD:params.yaml"], cwd=root, capture_output=True,
                                         text=True, check=True).stdout)
    diff = overrides(base, params)
    notes = [f"params: the repository's `params.yaml` at commit `{commit}` with `{override_args(diff)}`",
             f"everything but this README is in `{BUNDLE}`: `python -m speedrun.kept {folder / report.name}` prints "
             f"the report (any member likewise), `unzip` extracts them; analyses read the members by these paths",
             f"`{report.name}`: the evaluation's report; `{written[1].relative_to(folder)}`: its metrics",
             f"`{written[2].relative_to(folder)}`: every GRPO run's metrics, one key per run (`<arm>_s<seed>`)",
             f"`{samples.name}`: every {'answer' if track == 'task' else 'response'} the evaluation sampled"]
    if track == "chat":
        notes += ["`result.json`: the evaluation's whole result (each comparison's variance parts, for power and any "
                  "pair's checks); `weights.parquet`: each run's prompt weights and realised draws (`run` column); "
                  "`metrics/rm.json`: the RM's held-out accuracy by kind beside the base's likelihood and word overlap",
                  f"figures: `python -m speedrun.eval.replot {folder}` draws them into `figures/` (not committed)"]
    old = readme.read_bytes().decode("utf-8")
    old = old[:old.index("\n## Files\n")] if "\n## Files\n" in old else old  # kept again: the section replaced
    old = old.rstrip("\n")
    write_text(readme, old + "\n\n## Files\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")
    size = pack(folder).stat().st_size
    print(f"{folder / BUNDLE}: {size / 1e6:.2f} MB")
    if size > MAX_BYTES:  # what git grows by; parquet is compressed already, so only fewer answers make it smaller
        print(f"warning: {folder / BUNDLE} is above {MAX_BYTES / 1e6:.0f} MB: commit the README and track the zip "
              f"with DVC instead (`dvc add {folder / BUNDLE}`, then `dvc push` to the team's remote)")
    return written


def _chat_extras(folder: Path, root: Path, names: list[str]) -> list[Path]:
    """The chat evaluation's full result, the RM's metrics (held-out accuracy by kind beside its baselines) and every
    run's prompt weights and draws (outs/grpo/<run>/weights.parquet, one frame with a `run` column): the readings of
    any pair of arms (manipulation, power) recompute from them."""
    import pandas as pd

    result, rm = root / "outs/eval/result.json", root / "reports/metrics/rm.json"
    weights = [root / "outs/grpo" / n / "weights.parquet" for n in names]
    for path in (result, rm, *weights):
        if not path.exists():
            raise SystemExit(f"{path}: no such file (run the experiment's `dvc exp run` in {root} first)")
    frame = pd.concat([pd.read_parquet(w).assign(run=n) for n, w in zip(names, weights)], ignore_index=True)
    out = [folder / "result.json", folder / "weights.parquet", folder / "metrics/rm.json"]
    write_bytes(out[0], result.read_bytes())
    write_parquet(out[1], frame)
    write_bytes(out[2], rm.read_bytes())
    return out


@app.command(help=__doc__.splitlines()[0])
def command(folder: Annotated[Path, typer.Argument(
                metavar="FOLDER", help="reports/experiments/<name>, holding the committed plan (README.md)")],
            track: Annotated[Track, typer.Option(help="which evaluation the experiment ran")]) -> None:
    """Keep the workspace's run of `track` in `folder`; prints the files written."""
    for p in keep(folder, track):
        print(p)


def main(argv: list[str] | None = None) -> None:
    """`python -m speedrun.experiment` (argv: default sys.argv[1:]): returns on success, exits non-zero otherwise."""
    run_app(app, argv, "python -m speedrun.experiment")


if __name__ == "__main__":
    main()
