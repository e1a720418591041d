"""Wall time of DVC's no-op commands on an up-to-date workspace: `dvc status` and `dvc repro` (nothing to run).

    python bench/noop_repro.py            # 5 runs of each, in the repository root
    python bench/noop_repro.py --runs 9

Prints every run, then the median and min per command, the stages a "no-op" `dvc repro` still ran (an
always-changed stage runs, and DVC then rewrites dvc.lock), and whether ruamel.yaml's C parser is installed (DVC
reads params.yaml once per stage and dvc.yaml/dvc.lock with ruamel.yaml: the pure-Python parser is most of the time).
Compare before/after in one session: machines of one kind differ, and so do runs of one machine.
"""
from __future__ import annotations

import statistics
import subprocess
import time

import typer

from speedrun.typer_app import new_app


def has_c_yaml() -> bool:
    try:
        import _ruamel_yaml  # noqa: F401  (the C extension ruamel.yaml.clib ships)
        return True
    except ImportError:
        return False


def time_command(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return time.perf_counter() - t0, out


app = new_app()


@app.command(help=__doc__)
def main(runs: int = typer.Option(5, help="runs of each command")) -> None:
    print(f"ruamel.yaml C parser: {'yes' if has_c_yaml() else 'no'}")
    for cmd in (["dvc", "status"], ["dvc", "repro"]):
        seconds, ran = [], set()
        for _ in range(runs):
            s, out = time_command(cmd)
            ran |= {line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage '")}
            seconds.append(s)
        print(f"{' '.join(cmd):<12} median {statistics.median(seconds):.2f} s  min {min(seconds):.2f} s  "
              f"(runs: {', '.join(f'{s:.2f}' for s in seconds)}; stages run: {', '.join(sorted(ran)) or 'none'})")


if __name__ == "__main__":
    app()
