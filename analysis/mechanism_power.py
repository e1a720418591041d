"""Power of the mechanism control before it runs: whether a tic paid only on the densest modules takes hold is close to
all-or-nothing per GRPO seed (reports/experiments/mechanism-lr1e-3-120), so the held-out tic share of a run is drawn
from a mixture: with probability q the tic took hold (share ~ N(60, 15) %, clipped to [10, 100]), else it did not
(~ N(2, 1) %, the SFT model's base rate). Prints, per seeds per arm and per (q_uniform, q_density), the share of
simulated experiments whose exact permutation test (the report's robustness check) gives p <= 0.05.

    python analysis/mechanism_power.py [--sims 300] [--seeds 4,6,8]
The mixture's parameters are read off the 120-step experiment's runs (took hold: 62.5%; not: 0.3-3.9%).
"""
from __future__ import annotations

import numpy as np
import typer

from speedrun.typer_app import new_app

from speedrun.eval.stats import ALPHA, permutation_p

SCENARIOS = ((0.9, 0.1), (0.8, 0.2), (0.7, 0.2), (0.7, 0.3), (0.33, 0.0))  # (q_uniform, q_density)


def tic_shares(rng: np.random.Generator, q: float, n: int) -> np.ndarray:
    """n runs' held-out tic share (%): took hold with probability q."""
    hold = rng.random(n) < q
    return np.where(hold, np.clip(rng.normal(60, 15, n), 10, 100), np.clip(rng.normal(2, 1, n), 0, 10))


app = new_app()


@app.command(help=__doc__)
def main(sims: int = typer.Option(300, help="simulated experiments per cell"),
         seeds: str = typer.Option("4,6,8", help="comma list of seeds per arm")) -> None:
    rng = np.random.default_rng(0)
    ns = [int(s) for s in seeds.split(",")]
    print(f"power of the exact permutation test at p <= {ALPHA} ({sims} simulated experiments per cell)")
    print("| q_uniform | q_density | " + " | ".join(f"{n} seeds/arm" for n in ns) + " |")
    print("|---:|---:|" + "---:|" * len(ns))
    for qu, qd in SCENARIOS:
        cells = []
        for n in ns:
            ps = [permutation_p(tic_shares(rng, qu, n), tic_shares(rng, qd, n))["p"] for _ in range(sims)]
            cells.append(f"{np.mean(np.asarray(ps) <= ALPHA):.2f}")
        print(f"| {qu} | {qd} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    app()
