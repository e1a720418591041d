"""Independent GRPO runs one after another on every core, or side by side on one core each: wall time and bytes.

    python bench/parallel_runs.py                       # 4 task GRPO runs of 30 steps, fp32, 2 rounds alternating
    python bench/parallel_runs.py --steps 100 --dtype auto --rounds 1

A `dvc repro` runs its stages one at a time. A track's GRPO runs are independent of each other, so the first stale
run's stage trains the track's stale runs side by side (speedrun.runs), compute.run_threads intra-op threads each.
This times that against the runs one after another on every core, on the committed run's inputs (outs/task_sft,
outs/task_rm, data/task), alternating the modes within one session, and checks whether a run's model and log come out
the same bytes whatever its thread count. Needs the default run's task SFT and task RM outputs (`dvc repro task_rm`).
"""
import filecmp
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Literal

import typer

from speedrun.typer_app import new_app

RUNS = [("checker", 1), ("checker", 2), ("shuffled", 1), ("shuffled", 2)]


def launch(arm: str, seed: int, out: Path, threads: int, steps: int, dtype: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = ["python", "-m", "stages.task_grpo", "--arm", arm, "--seed", str(seed), "-S", f"task.train.steps={steps}",
           "-S", f"compute.dtype={dtype}", "-S", f"compute.run_threads={threads}",
           "--out-dir", str(out / f"{arm}_s{seed}"), "--metrics", str(out / f"{arm}_s{seed}.json")]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def run_mode(mode: str, out: Path, steps: int, dtype: str) -> float:
    """Wall seconds for every run of RUNS: "serial" (one at a time, all cores) or "side" (one per core at a time)."""
    cores = os.cpu_count() or 1
    width, threads = (1, cores) if mode == "serial" else (cores, 1)
    t0 = time.perf_counter()
    for i in range(0, len(RUNS), width):
        procs = [launch(arm, seed, out, threads, steps, dtype) for arm, seed in RUNS[i:i + width]]
        for p in procs:
            if p.wait() != 0:
                raise SystemExit(f"{mode}: a task_grpo run failed (exit {p.returncode}); rerun it by hand to see why")
    return time.perf_counter() - t0


def same_bytes(a: Path, b: Path) -> bool:
    return all(filecmp.cmp(a / f"{arm}_s{seed}" / name, b / f"{arm}_s{seed}" / name, shallow=False)
               for arm, seed in RUNS for name in ("model.pt", "log.csv"))


app = new_app()


@app.command(help=__doc__)
def main(steps: int = typer.Option(30, help="GRPO steps per run (the default run's: 100)"),
         dtype: Literal["fp32", "bf16", "auto"] = typer.Option("fp32", help="compute.dtype of the runs"),
         rounds: int = typer.Option(2, help="rounds of serial then side by side, alternating")) -> None:
    times: dict[str, list[float]] = {"serial": [], "side": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for mode in ("serial", "side") if r % 2 == 0 else ("side", "serial"):
                out = Path(tmp) / mode
                times[mode].append(run_mode(mode, out, steps, dtype))
                print(f"round {r + 1} {mode:<6}: {times[mode][-1]:6.1f} s for {len(RUNS)} runs", flush=True)
        same = same_bytes(Path(tmp) / "serial", Path(tmp) / "side")
    s, d = (sum(times[m]) / len(times[m]) for m in ("serial", "side"))
    print(f"{len(RUNS)} task GRPO runs of {steps} steps ({dtype}, {os.cpu_count()} CPUs): one at a time "
          f"{s:.1f} s, side by side {d:.1f} s ({s / d:.2f}x); models and logs the same bytes: {same}")


if __name__ == "__main__":
    app()
