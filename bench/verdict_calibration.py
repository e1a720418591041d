"""Calibration of the density-vs-baseline interval: false-positive rate with no variant effect, and power.

Simulates evaluations of R runs per variant (speedrun.eval.simulate) and counts how often each method's 95%
interval excludes zero. A calibrated method reads ~5% under "effect 0". Spreads are in units of the
per-prompt noise; run_sd 0.15 makes the training seed's spread about twice the prompt-level standard error
of one run (64 prompts), the regime of reports/gpu where seeds flipped verdicts.

    python bench/verdict_calibration.py [--sims 2000]
"""
import typer

from speedrun.typer_app import new_app

from speedrun.eval.simulate import METHODS, rejection_rate

app = new_app()


@app.command(help=__doc__)
def main(sims: int = typer.Option(2000)) -> None:
    settings = [("runs 3+3, effect 0, run_sd 0.15", dict(runs_a=3, runs_b=3, run_sd=0.15)),
                ("runs 3+3, effect 0, run_sd 0.05", dict(runs_a=3, runs_b=3, run_sd=0.05)),
                ("runs 3+3, effect 0, run_sd 0", dict(runs_a=3, runs_b=3, run_sd=0.0)),
                ("runs 3+3, effect 0, interaction 2", dict(runs_a=3, runs_b=3, run_sd=0.15, interaction_sd=2.0)),
                ("runs 5+5, effect 0, run_sd 0.15", dict(runs_a=5, runs_b=5, run_sd=0.15)),
                ("runs 2+2, effect 0, run_sd 0.15", dict(runs_a=2, runs_b=2, run_sd=0.15)),
                ("runs 3+3, effect 0.5, run_sd 0.15", dict(runs_a=3, runs_b=3, run_sd=0.15, effect=0.5)),
                ("runs 3+3, effect 0.3, run_sd 0.15", dict(runs_a=3, runs_b=3, run_sd=0.15, effect=0.3))]
    names = list(METHODS)
    print(f"share of {sims} simulated evaluations whose 95% interval excludes 0 (64 prompts, noise_sd 1, "
          "prompt_sd 1)")
    print(f"{'setting':36s}" + "".join(f"{n:>24s}" for n in names))
    for label, kw in settings:
        rates = [rejection_rate(METHODS[n], sims, seed=1, **kw) for n in names]
        print(f"{label:36s}" + "".join(f"{r:>24.3f}" for r in rates))


if __name__ == "__main__":
    app()
