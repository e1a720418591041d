"""What a forked GRPO run pays before its first step, with torch._dynamo imported by the runner or not.

    python bench/forked_run_startup.py                # 6 children per round, 5 rounds alternating the two modes
    python bench/forked_run_startup.py --children 10 --rounds 3

speedrun.runs trains a track's stale runs as forks of the stage's runner, which imports the stage module once. The
first torch.optim optimizer a process builds imports torch._dynamo (torch._disable_dynamo on its methods): about a
second on a 2-core CPU, paid in every fork unless the runner imported it first. Each round starts a fresh runner
process per mode (imports are per process), which imports stages.task_grpo, optionally torch._dynamo, then forks its
children one after another; each child builds an AdamW over a small model and exits. Prints the mean time per child
and the runner's own extra import time, per mode and round."""
from __future__ import annotations

import subprocess
import sys

import typer

from speedrun.typer_app import new_app

app = new_app()

RUNNER = """
import os, sys, time
t = time.perf_counter()
import stages.task_grpo, torch
if sys.argv[1] == "preimport":
    import torch._dynamo
pre = time.perf_counter() - t
t = time.perf_counter()
for _ in range(int(sys.argv[2])):
    pid = os.fork()
    if pid == 0:
        torch.optim.AdamW(torch.nn.Linear(64, 64).parameters(), lr=1e-3)
        os._exit(0)
    os.waitpid(pid, 0)
print(f"{pre:.3f} {(time.perf_counter() - t) / int(sys.argv[2]):.3f}")
"""


@app.command(help=__doc__)
def main(children: int = typer.Option(6, help="forked children per runner"),
         rounds: int = typer.Option(5, help="rounds, each running both modes (alternating which goes first)")) -> None:
    times: dict[str, list[float]] = {"lazy": [], "preimport": []}
    for r in range(rounds):
        for mode in (("lazy", "preimport") if r % 2 == 0 else ("preimport", "lazy")):
            out = subprocess.run([sys.executable, "-c", RUNNER, mode, str(children)], capture_output=True, text=True,
                                 check=True).stdout.split()
            pre, child = float(out[0]), float(out[1])
            times[mode].append(child)
            print(f"round {r + 1} {mode:9s}: runner imports {pre:.2f} s, per forked child {child * 1000:.0f} ms")
    for mode, ts in times.items():
        print(f"{mode:9s}: per child mean {sum(ts) / len(ts) * 1000:.0f} ms, min {min(ts) * 1000:.0f} ms")


if __name__ == "__main__":
    app()
