"""Wall time of each stage of a `dvc repro`, from DVC's own "Running stage" lines.

    python bench/stage_times.py            # dvc repro (only the stale stages)
    python bench/stage_times.py -f         # dvc repro -f: the whole default run, every stage
    python bench/stage_times.py -f --log /tmp/repro.log

Streams DVC's output, then prints one line per stage (seconds, share of the total) and the stages grouped by
name before '@' (the adversarial cycles' adv_rm@<i> as one line). A stage's time includes its Python start-up
and DVC's bookkeeping after it, i.e. what a user waits for.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import defaultdict

import typer

from speedrun.typer_app import new_app

STAGE = re.compile(r"^Running stage '([^']+)'")


app = new_app()


@app.command(help=__doc__)
def main(force: bool = typer.Option(False, "-f", "--force", help="rerun every stage (dvc repro -f)"),
         log: str = typer.Option("", help="also write DVC's output to this file")) -> None:
    cmd = ["dvc", "repro"] + (["-f"] if force else [])
    times: dict[str, float] = {}
    current, t_stage = "(dvc start-up)", time.perf_counter()
    t0 = t_stage
    out = open(log, "w", encoding="utf-8") if log else None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        if out:
            out.write(line)
        m = STAGE.match(line)
        if m:
            now = time.perf_counter()
            times[current] = times.get(current, 0.0) + now - t_stage
            current, t_stage = m.group(1), now
    rc = proc.wait()
    end = time.perf_counter()
    times[current] = times.get(current, 0.0) + end - t_stage
    total = end - t0
    if out:
        out.close()
    print(f"\n{' '.join(cmd)}: exit {rc}, {total:,.0f} s ({total / 60:.1f} min) on {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.2f}")
    for name, s in times.items():
        print(f"  {name:<24} {s:7.1f} s  {s / total:6.1%}")
    grouped: dict[str, float] = defaultdict(float)
    for name, s in times.items():
        grouped[name.split("@")[0]] += s
    print("by stage family: " + ", ".join(f"{k} {v:.0f} s" for k, v in sorted(grouped.items(), key=lambda kv: -kv[1])))
    raise SystemExit(rc)


if __name__ == "__main__":
    app()
