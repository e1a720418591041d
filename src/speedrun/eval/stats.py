"""A variant comparison over GRPO training seeds: Δ of run means, an interval that includes the seed.

Each variant is trained R times (one run per training seed); every run, and the reference model, is
sampled on the same held-out prompts and sampling seeds, and the bootstrap draws over prompts are shared
by all of them (compare.py). For one metric:

    Δ = mean over variant a's runs - mean over variant b's runs
    Var(Δ) = s_a² / R_a + s_b² / R_b      between runs: the training seed and each run's own sampling noise
           + max(0, V_prompt - V_noise)   prompts: variant x prompt interaction, the held-out set being a sample
    95% interval: Δ ± t(0.975, ν) √Var(Δ), ν by Welch-Satterthwaite with the prompt term as known

V_prompt is the variance of Δ over bootstrap draws of prompts (shared by every run, so paired). It also
holds each run's sampling noise, which the between-run term already counts: V_noise, that noise's share,
is estimated from the draws of each run's deviation from its variant's mean, var(v_r - v̄) R / (R - 1),
and removed (a method-of-moments estimate, floored at zero). Why not a two-level bootstrap (runs, then
prompts)? With three runs per variant a bootstrap over runs has 10 distinct draws and shrinks the run
variance by (R-1)/R; bench/verdict_calibration.py compares the methods on simulated evaluations with no
variant effect, a variant x prompt interaction, and a known effect.

A variant with a single run has no between-run variance to estimate: its comparison gets an interval
over prompts only and no verdict. A fixed reference (the SFT model: one model, no training seed) adds no
between-run term.

Robustness: a permutation test on the runs' values (relabellings of the a and b runs; no distribution
assumed, prompts ignored): exact, every relabelling, while they number at most 200,000 (up to 10 runs per
variant), else Monte Carlo over 100,000 seeded relabellings. Its smallest attainable p is 2 / C(R_a + R_b, R_a):
0.1 at three runs per variant, so it can only confirm a call where there are six or more.

Multiplicity: the primary metrics (params `eval.primary`) are tested under Holm's step-down correction
at level 0.05; every other metric is secondary, reported with its unadjusted interval and verdict, never
counted as independent evidence. "Without losing reward" is a non-inferiority test: a's reward is not
worse than b's by more than `margin` when the interval's lower bound lies above -margin.
"""
from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pandas as pd

ALPHA = 0.05
MAX_RUNS = 64  # the most runs per variant a power analysis considers
PAIRED_MIN_RUNS, PAIRED_MIN_R = 6, 0.5  # a paired analysis only where the coupling is shown: enough pairs, r this high


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function; df = inf is the standard normal."""
    if math.isinf(df):
        return 0.5 * (1.0 + math.erf(t / math.sqrt(2.0)))
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_ppf(q: float, df: float) -> float:
    """Quantile of Student's t (bisection on t_cdf)."""
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        step = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
        if step == (lo, hi):  # a fixed point in float64 (after ~60 halvings): the rest would not move it
            break
        lo, hi = step
    return 0.5 * (lo + hi)


def pooled_delta(point_a: np.ndarray, point_b: np.ndarray, boot_a: np.ndarray, boot_b: np.ndarray,
                 fixed_b: bool = False, level: float = 1 - ALPHA, paired: bool = False) -> dict:
    """Δ = mean(point_a) - mean(point_b) for one metric, with the interval of the module doc.

    point_a [R_a], point_b [R_b]: each run's value on the whole evaluation; boot_a [n_boot, R_a] and
    boot_b [n_boot, R_b]: the same runs on shared bootstrap draws over prompts. fixed_b: b is one fixed
    model (no training seed to vary). paired: run i of a and run i of b share a training seed's random streams,
    so the between-run term is the variance of their differences over R (R_a = R_b = R; df R - 1). Returns value,
    ci_low, ci_high, se, df, p (two-sided, H0: Δ = 0), between_var, prompt_var and seed_variance (False when a side
    has one run: then no verdict).
    """
    point_a, point_b = np.asarray(point_a, float), np.asarray(point_b, float)
    boot_a, boot_b = np.asarray(boot_a, float), np.asarray(boot_b, float)
    value = float(point_a.mean() - point_b.mean())
    prompt_var = float(np.var(boot_a.mean(1) - boot_b.mean(1)))
    terms, seed_variance, noise_var = [], True, 0.0
    for point, boot, fixed in ((point_a, boot_a, False), (point_b, boot_b, fixed_b)):
        if fixed:
            continue
        r = point.size
        if r < 2:
            seed_variance = False
            continue
        terms.append((float(np.var(point, ddof=1)) / r, r - 1))
        # one run's sampling noise over the prompt draws, from its deviation from the variant mean
        per_run = float(np.var(boot - boot.mean(1, keepdims=True), axis=0).mean()) * r / (r - 1)
        noise_var += per_run / r
    if paired and seed_variance and not fixed_b:
        if point_a.size != point_b.size:
            raise ValueError(f"a paired comparison needs as many runs per side, got {point_a.size} and {point_b.size}")
        terms = [(float(np.var(point_a - point_b, ddof=1)) / point_a.size, point_a.size - 1)]
    between_var = sum(v for v, _ in terms)
    prompt_var = max(0.0, prompt_var - noise_var) if seed_variance else prompt_var
    var = between_var + prompt_var
    denom = sum(v * v / dof for v, dof in terms)
    df = var * var / denom if denom > 0 else math.inf
    se = math.sqrt(var)
    if se == 0.0:
        lo = hi = value
        p = 1.0 if value == 0.0 else 0.0
    else:
        half = t_ppf(0.5 + level / 2.0, df) * se
        lo, hi = value - half, value + half
        p = 2.0 * (1.0 - t_cdf(abs(value) / se, df))
    return {"value": value, "ci_low": float(lo), "ci_high": float(hi), "se": se, "df": df, "p": float(min(p, 1.0)),
            "between_var": between_var, "prompt_var": prompt_var, "seed_variance": seed_variance}


def permutation_p(point_a: np.ndarray, point_b: np.ndarray, max_splits: int = 200_000,
                  draws: int = 100_000, seed: int = 0) -> dict:
    """Two-sided permutation test of mean(a) - mean(b): p = share of splits of the pooled runs into groups of R_a
    and R_b with |Δ| at least the observed one (ties count). Exact (every split) up to `max_splits` splits; beyond,
    Monte Carlo over `draws` seeded random splits with the observed one counted, p = (1 + hits) / (1 + draws)
    (never 0, valid at any number of draws). p_min is the smallest p the design can give; None values where a
    side has one run."""
    a, b = np.asarray(point_a, float), np.asarray(point_b, float)
    n, na = a.size + b.size, a.size
    splits = math.comb(n, na)
    if min(a.size, b.size) < 2:
        return {"p": None, "p_min": None, "splits": splits, "method": None}
    pooled = np.concatenate([a, b])
    observed = abs(a.mean() - b.mean())
    tol = 1e-12 * max(1.0, float(np.abs(pooled).max()))  # float sums of the same runs in another order

    def extreme(in_a: np.ndarray) -> int:  # splits (rows of a boolean mask: True = in a) at least as extreme
        return int(np.sum(np.abs((in_a @ pooled) / na - (~in_a @ pooled) / b.size) >= observed - tol))

    if splits <= max_splits:
        idx = np.asarray(list(combinations(range(n), na)))
        in_a = np.zeros((len(idx), n), bool)
        in_a[np.arange(len(idx))[:, None], idx] = True
        return {"p": extreme(in_a) / splits, "p_min": 2.0 / splits if na == b.size else 1.0 / splits,
                "splits": splits, "method": "exact"}
    rng = np.random.default_rng(seed)
    # chunks: a draws x n matrix of random keys would not fit at scale; the first R_a of a random order go to a
    hits = sum(extreme(np.argsort(rng.random((min(10_000, draws - start), n)), axis=1) < na)
               for start in range(0, draws, 10_000))
    return {"p": (1 + hits) / (1 + draws), "p_min": 1.0 / (1 + draws), "splits": splits, "method": "monte carlo",
            "draws": draws}


def holm(pvalues: dict[str, float], alpha: float = ALPHA) -> dict[str, float]:
    """Holm-adjusted p-values (reject where adjusted p <= alpha): step-down, monotone, capped at 1."""
    order = sorted(pvalues, key=lambda k: (pvalues[k], k))
    m, running, out = len(order), 0.0, {}
    for i, k in enumerate(order):
        running = max(running, min(1.0, (m - i) * pvalues[k]))
        out[k] = running
    return out


def non_inferiority(ci_low: float, ci_high: float, margin: float) -> str:
    """non-inferior: the interval's lower bound lies above -margin; inferior: its upper bound lies below
    -margin; inconclusive otherwise."""
    if margin < 0:
        raise ValueError(f"non-inferiority margin must be >= 0, got {margin}")
    if ci_low > -margin:
        return "non-inferior"
    if ci_high < -margin:
        return "inferior"
    return "inconclusive"


def replication(first: float, value: float, ci_low: float, ci_high: float) -> str:
    """The lab's replication rule for a call: "replicates" when the rerun's estimate has the first's sign and its
    interval covers half the first's estimate; "beyond half the first" when it has the sign but its interval lies
    wholly farther from 0 than half the first (the rule's letter fails on the far side: an effect as small as half
    the first is excluded); "not replicated" otherwise (the other sign, or an interval wholly nearer 0 than half the
    first)."""
    if first == 0:
        raise ValueError("a call's estimate is not 0; nothing to replicate")
    half = first / 2
    if value * first <= 0:
        return "not replicated"
    if ci_low <= half <= ci_high:
        return "replicates"
    return "beyond half the first" if (ci_low > half if first > 0 else ci_high < half) else "not replicated"


def mde(between_var: float, prompt_var: float, runs: int, new_runs: int, m: int = 1, power: float = 0.8,
        alpha: float = ALPHA) -> float:
    """Minimum detectable |Δ| at `new_runs` runs per variant, two-sided at alpha / m (Holm's first step over m
    primaries) with the given power, from a comparison measured at `runs` runs per variant: the between-run term
    scales as 1 / runs, the prompt term stays; df = 2 new_runs - 2."""
    var = between_var * runs / new_runs + prompt_var
    df = max(2 * new_runs - 2, 1)
    return (t_ppf(1 - alpha / (2 * m), df) + t_ppf(power, df)) * math.sqrt(var)


def runs_needed(between_var: float, prompt_var: float, runs: int, target: float, m: int = 1,
                max_runs: int = MAX_RUNS) -> int | None:
    """The fewest runs per variant whose MDE is at most `target` (None: not within max_runs)."""
    return next((r for r in range(2, max_runs + 1) if mde(between_var, prompt_var, runs, r, m) <= target), None)


# the temperature control's bar: a diversity metric must order the SFT model's temperatures this well to be read
MIN_RHO = 0.9


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rho (average ranks for ties); 0 when either side is constant."""
    rx, ry = pd.Series(x).rank().to_numpy(), pd.Series(y).rank().to_numpy()
    if rx.std() == 0 or ry.std() == 0:
        return 0.0
    return float(np.corrcoef(rx, ry)[0, 1])
