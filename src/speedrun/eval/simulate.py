"""Synthetic per-run evaluations, to check the calibration of the comparison in stats.py.

A metric that is a mean over prompts: run r of a variant scores prompt p as
    x[r, p] = effect + i_p (variant a only) + u_r + e_p + ε[r, p]
u_r ~ N(0, run_sd²) is the training seed, e_p ~ N(0, prompt_sd²) the prompt (shared by every run), i_p ~
N(0, interaction_sd²) how differently variant a does on prompt p (zero on average over prompts: a prompt set
of finite size still shows a difference), ε the run's own sampling noise ~ N(0, noise_sd²). Each run's value is
its mean over prompts; the bootstrap resamples prompts, the same draws for every run (as compare.py does).
"""
from __future__ import annotations

import numpy as np

from speedrun.eval.stats import pooled_delta


def simulate_runs(rng: np.random.Generator, runs_a: int, runs_b: int, n_prompts: int = 64, effect: float = 0.0,
                  run_sd: float = 1.0, prompt_sd: float = 1.0, noise_sd: float = 1.0, interaction_sd: float = 0.0,
                  n_boot: int = 200
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """point_a [R_a], point_b [R_b], boot_a [n_boot, R_a], boot_b [n_boot, R_b] of one synthetic evaluation."""
    n_runs = runs_a + runs_b
    x = (rng.normal(0, run_sd, (n_runs, 1)) + rng.normal(0, prompt_sd, (1, n_prompts))
         + rng.normal(0, noise_sd, (n_runs, n_prompts)))
    x[:runs_a] += effect + rng.normal(0, interaction_sd, (1, n_prompts))
    picks = rng.integers(0, n_prompts, (n_boot, n_prompts))
    boot = x[:, picks].mean(-1).T  # [n_boot, n_runs]
    point = x.mean(1)
    return point[:runs_a], point[runs_a:], boot[:, :runs_a], boot[:, runs_a:]


def pooled_interval(point_a, point_b, boot_a, boot_b) -> tuple[float, float]:
    d = pooled_delta(point_a, point_b, boot_a, boot_b)
    return d["ci_low"], d["ci_high"]


def welch_interval(point_a, point_b, boot_a, boot_b) -> tuple[float, float]:
    """Welch's t interval on the runs' values alone (conditional on the prompt set)."""
    d = pooled_delta(point_a, point_b, boot_a[:1] * 0, boot_b[:1] * 0)
    return d["ci_low"], d["ci_high"]


def prompt_only_interval(point_a, point_b, boot_a, boot_b) -> tuple[float, float]:
    """The old report's interval: bootstrap over prompts only (training seed left out)."""
    d = boot_a.mean(1) - boot_b.mean(1)
    return float(np.quantile(d, 0.025)), float(np.quantile(d, 0.975))


def two_level_bootstrap_interval(point_a, point_b, boot_a, boot_b, rng: np.random.Generator | None = None
                                 ) -> tuple[float, float]:
    """Runs with replacement within each variant, then the shared prompt draw: percentile interval."""
    rng = rng or np.random.default_rng(0)
    n_boot, ra, rb = boot_a.shape[0], boot_a.shape[1], boot_b.shape[1]
    ia, ib = rng.integers(0, ra, (n_boot, ra)), rng.integers(0, rb, (n_boot, rb))
    rows = np.arange(n_boot)[:, None]
    d = boot_a[rows, ia].mean(1) - boot_b[rows, ib].mean(1)
    return float(np.quantile(d, 0.025)), float(np.quantile(d, 0.975))


METHODS = {"pooled (stats.py)": pooled_interval, "Welch on runs": welch_interval,
           "prompt bootstrap only": prompt_only_interval,
           "two-level bootstrap": two_level_bootstrap_interval}


def rejection_rate(method, n_sims: int, seed: int, **kwargs) -> float:
    """Share of simulated evaluations whose 95% interval excludes zero."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(n_sims):
        lo, hi = method(*simulate_runs(rng, **kwargs))
        hits += lo > 0 or hi < 0
    return hits / n_sims
