"""Would pairing the arms' runs by seed shrink a task comparison's variance? From committed experiments' metrics.

stats.pooled_delta(paired=True) reads run i of the treatment against run i of the control when both share a training
seed's random streams; it pays only where the two correlate. Per experiment and comparison this prints the
correlation of the per-seed frontier gaps at the same seed number and the between-seed variance of the difference,
unpaired (each arm's variance of its mean, added) and paired (the variance of the per-seed differences' mean). The
frontier gap stands in for the matched reading, whose per-run values are not committed. Log: docs/LOG.md, 2026-11-28.

    python analysis/task_pairing.py    # the four committed 609-item density experiments
"""

import numpy as np
import typer

from speedrun import kept
from speedrun.typer_app import new_app
from task_clusters import EXPERIMENTS, ROOT  # the same four experiments (analysis/ is on the path when run as a script)


app = new_app()


@app.command(help=__doc__)
def main(experiments: list[str] = typer.Argument(list(EXPERIMENTS), help="folders under reports/experiments")) -> None:
    for name in experiments:
        metrics = kept.read_json(ROOT / name / "metrics" / "task.json")
        gaps = metrics["frontier_gap"]
        for comp in metrics["comparisons"]:
            a, b = comp.split(":")
            x, y = (np.array(gaps[arm]["per_seed"], dtype=float) for arm in (a, b))  # both in task.seeds order
            if len(x) != len(y):
                print(f"{name} {comp}: {len(x)} and {len(y)} runs, no pairs")
                continue
            unpaired = x.var(ddof=1) / len(x) + y.var(ddof=1) / len(y)
            paired = (x - y).var(ddof=1) / len(x)
            print(f"{name} {comp}: {len(x)} pairs, r {np.corrcoef(x, y)[0, 1]:+.2f}; between-seed variance of the "
                  f"difference unpaired {unpaired:.5f}, paired {paired:.5f} ({paired / unpaired - 1:+.0%})")


if __name__ == "__main__":
    app()
