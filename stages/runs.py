"""Stages grpo and task_grpo: every GRPO run of a track, side by side: `python -m stages.runs grpo|task_grpo`.

The runs (grpo.run x grpo.seeds: `python -m stages.grpo --variant V --seed S`; task.run x task.seeds: `python -m
stages.task_grpo --arm A --seed S`) are independent, and DVC runs one stage at a time. At these small shapes a second
thread speeds a run up only 1.3x, so on CPU the runs go side by side, compute.run_threads threads each, cores //
run_threads at a time: 1.4-1.5x sooner than in turn on every core (bench/parallel_runs.py). A run's threads are fixed
by that knob, by hand or here, so its bytes do not depend on what runs beside it. On a GPU, under torchrun (nproc > 1)
or with run_threads 0 the runs go in turn. Each run's lines are printed when it ends; a failed run stops the others
and the stage, naming the run and its command. -S and --params reach every run."""
from __future__ import annotations

import argparse
import importlib
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from speedrun import params as params_lib
from speedrun.common import pick_device, runs_at_once
from speedrun.params import Params

TRACKS = {"grpo": ("grpo", "variant"), "task_grpo": ("task", "arm")}  # stage: (params section, run id option)
READS = ("compute.device", "compute.nproc", "compute.run_threads")  # the runner's own keys


def dag_reads(stage: str) -> list[str]:
    """The keys the DAG stage reads (its dvc.yaml params): the runner's, the track's runs, every run's keys."""
    section = TRACKS[stage][0]
    per_run = [r for r in importlib.import_module(f"stages.{stage}").READS if "{" not in r]
    return list(dict.fromkeys([*per_run, *READS, f"{section}.run", f"{section}.seeds", f"{section}.variants"]))


def run_list(p: Params, stage: str) -> list[tuple[str, int]]:
    """(arm, seed) for every run of the track: arm by arm, so runs side by side are alike in length."""
    section = params_lib.value_at(p, TRACKS[stage][0])
    return [(name, seed) for name in section.run for seed in section.seeds]


def run_command(stage: str, name: str, seed: int, passthrough: list[str]) -> list[str]:
    return [sys.executable, "-m", f"stages.{stage}", f"--{TRACKS[stage][1]}", name, "--seed", str(seed), *passthrough]


def run_all(stage: str, runs: list[tuple[str, int]], width: int, passthrough: list[str], tmp: Path) -> None:
    """Keep `width` runs going until every run has ended; the first failure kills the rest and exits."""
    pending, live, done, t_start = list(runs), {}, 0, time.perf_counter()
    try:
        while pending or live:
            while pending and len(live) < width:
                name, seed = pending.pop(0)
                log = (tmp / f"{name}_s{seed}.log").open("w+")
                cmd = run_command(stage, name, seed, passthrough)
                live[f"{name}_s{seed}"] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log, cmd)
            time.sleep(0.05)
            for key, (proc, log, cmd) in list(live.items()):
                if proc.poll() is None:
                    continue
                del live[key]
                log.seek(0)
                out = log.read().rstrip()
                log.close()
                if proc.returncode != 0:
                    print(out[-6000:], flush=True)
                    sys.exit(f"{stage}: run {key} failed (exit {proc.returncode}); its output is above. Rerun it "
                             f"alone: python {' '.join(cmd[1:])}")
                done += 1
                print(f"--- [{done}/{len(runs)}] {key}, {time.perf_counter() - t_start:.0f} s into the stage\n{out}",
                      flush=True)
    finally:  # a failed run or an interrupt: no run outlives the stage
        for proc, log, _ in live.values():
            proc.kill()
            proc.wait()
            log.close()

def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=sorted(TRACKS), help="the track's GRPO stage")
    ap.add_argument("-S", "--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a params.yaml key in every run, as dvc exp run -S does (repeatable)")
    ap.add_argument("--params", type=Path, default=None, help="params file (default: ./params.yaml)")
    args = ap.parse_args(argv)
    try:
        p = params_lib.load(args.params, args.set)
    except params_lib.ParamsError as e:
        sys.exit(f"error: {e}")
    runs = run_list(p, args.stage)
    device = pick_device(p.compute.device)
    width = min(len(runs), runs_at_once(p.compute.run_threads, p.compute.nproc, device))
    passthrough = [a for kv in args.set for a in ("-S", kv)] + (["--params", str(args.params)] if args.params else [])
    print(f"{args.stage}: {len(runs)} runs on {device}, {width} at a time"
          + (f", {p.compute.run_threads} thread(s) each" if width > 1 else ""), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"{args.stage}: terminated"))  # so its runs are stopped too
    with tempfile.TemporaryDirectory(prefix=f"{args.stage}_runs_") as tmp:
        run_all(args.stage, runs, width, passthrough, Path(tmp))


if __name__ == "__main__":
    main()
