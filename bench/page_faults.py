"""Page faults a decode loop's large temporaries cost, with glibc's default malloc and with keep_freed_memory (what
every stage applies): the figure behind speedrun.common.keep_freed_memory. Machine-dependent, so a bench, not a test
(tests/test_train.py checks the mechanism).

    python bench/page_faults.py            # minor page faults of 10 steps, default against kept, 3 rounds, alternating
"""
from __future__ import annotations

import subprocess
import sys

import typer

from speedrun.typer_app import new_app

LOOP = """
import resource, sys, torch
from speedrun.common import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
x = torch.zeros(2048, 4096)  # 32 MB: the logits of a sampling batch
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):  # a decode loop's work: large temporaries of one size, made and freed every step
    y = x.log_softmax(-1).exp().cumsum(-1)
    del y
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

app = new_app()


@app.command(help=__doc__)
def main(rounds: int = typer.Option(3, help="rounds of default then kept")) -> None:
    rows = {"default": [], "keep": []}
    for _ in range(rounds):
        for mode in rows:
            out = subprocess.run([sys.executable, "-c", LOOP, mode], capture_output=True, text=True, check=True)
            rows[mode].append(int(out.stdout))
    for mode, faults in rows.items():
        print(f"{mode:8s} minor page faults per 10 steps: {', '.join(f'{f:,}' for f in faults)}")
    print(f"kept / default: {sum(rows['keep']) / max(1, sum(rows['default'])):.2f}")


if __name__ == "__main__":
    app()
