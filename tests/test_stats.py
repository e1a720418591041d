"""The variant comparison's statistics: t quantiles, Holm, non-inferiority, and calibration on simulated runs."""
import math

import numpy as np
import pytest

from speedrun.eval import stats
from speedrun.eval.simulate import (pooled_interval, prompt_only_interval, rejection_rate, simulate_runs,
                                    welch_interval)


def test_t_distribution_matches_tables():
    assert stats.t_ppf(0.975, math.inf) == pytest.approx(1.959964, abs=1e-5)
    assert stats.t_ppf(0.975, 2) == pytest.approx(4.302653, abs=1e-5)
    assert stats.t_ppf(0.975, 4) == pytest.approx(2.776445, abs=1e-5)
    assert stats.t_cdf(0.0, 3.3) == pytest.approx(0.5)
    assert stats.t_cdf(-2.0, 7.5) == pytest.approx(1 - stats.t_cdf(2.0, 7.5))
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (1.0, 2.7, 12.0):
        for t in (-4.0, -0.3, 1.1, 6.0):
            assert stats.t_cdf(t, df) == pytest.approx(scipy_stats.t.cdf(t, df), abs=1e-10)


def test_holm_step_down():
    adj = stats.holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert adj == pytest.approx({"a": 0.03, "c": 0.06, "b": 0.06})  # 3 x 0.01, 2 x 0.03, max(1 x 0.04, 0.06)
    assert stats.holm({"a": 0.6, "b": 0.9}) == pytest.approx({"a": 1.0, "b": 1.0})
    assert stats.holm({}) == {}


def test_replication_needs_the_sign_and_an_interval_covering_half_the_first():
    assert stats.replication(0.674, 0.40, 0.20, 0.60) == "replicates"  # covers +0.337
    assert stats.replication(0.674, 0.20, 0.05, 0.30) == "not replicated"  # wholly nearer 0 than half the first
    assert stats.replication(0.674, 0.60, 0.45, 0.75) == "beyond half the first"  # the letter fails on the far side
    assert stats.replication(0.674, -0.10, -0.30, 0.40) == "not replicated"  # the other sign, though it covers +0.337
    assert stats.replication(-1.518, -1.2, -1.5, -0.7) == "replicates"  # a call below 0: half of it is -0.759
    assert stats.replication(-1.519, -1.486, -1.850, -1.123) == "beyond half the first"  # the collapse's rerun
    with pytest.raises(ValueError):
        stats.replication(0.0, 0.1, -0.1, 0.3)


def test_non_inferiority():
    assert stats.non_inferiority(-0.05, 0.2, 0.1) == "non-inferior"
    assert stats.non_inferiority(-0.15, 0.2, 0.1) == "inconclusive"
    assert stats.non_inferiority(-0.4, -0.2, 0.1) == "inferior"
    with pytest.raises(ValueError, match="margin"):
        stats.non_inferiority(0.0, 1.0, -0.1)


def test_permutation_p_is_exact():
    # fully separated arms: only the observed split and its mirror are as extreme
    sep = stats.permutation_p([5.0, 6.0, 7.0], [1.0, 2.0, 3.0])
    assert sep["splits"] == 20 and sep["p"] == pytest.approx(0.1) and sep["p_min"] == pytest.approx(0.1)
    six = stats.permutation_p(np.arange(6) + 10.0, np.arange(6) * 1.0)
    assert six["p"] == pytest.approx(2 / 924) and six["p"] <= 0.05  # six runs per arm can back a call
    same = stats.permutation_p([1.0, 2.0, 3.0], [3.0, 2.0, 1.0])
    assert same["p"] == 1.0  # no difference: every split is at least as extreme
    # against a brute-force count over labels, with unequal arms
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=4), rng.normal(size=3)
    pooled, obs, hits, total = np.concatenate([a, b]), abs(a.mean() - b.mean()), 0, 0
    for mask in range(1 << 7):
        if bin(mask).count("1") == 4:
            ia = np.array([(mask >> i) & 1 for i in range(7)], bool)
            hits += abs(pooled[ia].mean() - pooled[~ia].mean()) >= obs - 1e-12
            total += 1
    assert stats.permutation_p(a, b)["p"] == pytest.approx(hits / total)
    assert stats.permutation_p([1.0], [2.0, 3.0])["p"] is None  # one run: nothing to permute


def test_permutation_p_monte_carlo_beyond_max_splits():
    # too many splits to enumerate: seeded random splits agree with the exact p and repeat byte for byte
    rng = np.random.default_rng(5)
    a, b = rng.normal(0.4, 1.0, 7), rng.normal(0.0, 1.0, 7)
    exact = stats.permutation_p(a, b)
    mc = stats.permutation_p(a, b, max_splits=100, draws=20_000)
    assert exact["method"] == "exact" and mc["method"] == "monte carlo" and mc["splits"] == exact["splits"]
    assert abs(mc["p"] - exact["p"]) < 4 * np.sqrt(exact["p"] * (1 - exact["p"]) / 20_000) + 1e-4
    assert mc == stats.permutation_p(a, b, max_splits=100, draws=20_000)
    # 16 runs per arm, fully separated: exact enumeration is out of reach; p sits at the draws' floor, never 0
    sep = stats.permutation_p(np.arange(16) + 100.0, np.arange(16) * 1.0, draws=1_000)
    assert sep["method"] == "monte carlo" and sep["p"] == sep["p_min"] == pytest.approx(1 / 1_001)
    same = stats.permutation_p(np.ones(16), np.ones(16), draws=1_000)
    assert same["p"] == 1.0  # no difference: every split ties the observed one


def test_a_paired_analysis_removes_the_shared_seed_effect():
    rng = np.random.default_rng(1)
    seed_effect = rng.normal(0, 1.0, 6)  # what run i of both arms share
    a, b = seed_effect + 0.5 + rng.normal(0, 0.1, 6), seed_effect + rng.normal(0, 0.1, 6)
    boot = lambda x: np.tile(x, (50, 1)) + rng.normal(0, 1e-3, (50, x.size))  # noqa: E731
    unpaired = stats.pooled_delta(a, b, boot(a), boot(b))
    paired = stats.pooled_delta(a, b, boot(a), boot(b), paired=True)
    assert paired["value"] == unpaired["value"] and paired["between_var"] < unpaired["between_var"] / 20
    assert paired["ci_low"] > 0 > unpaired["ci_low"] and paired["df"] == pytest.approx(5, rel=0.05)
    with pytest.raises(ValueError, match="as many runs"):
        stats.pooled_delta(a, b[:5], boot(a), boot(b[:5]), paired=True)


def test_pooled_delta_terms():
    rng = np.random.default_rng(0)
    pa, pb, ba, bb = simulate_runs(rng, 3, 3, run_sd=0.3)
    d = stats.pooled_delta(pa, pb, ba, bb)
    assert d["value"] == pytest.approx(pa.mean() - pb.mean())
    assert d["between_var"] == pytest.approx(np.var(pa, ddof=1) / 3 + np.var(pb, ddof=1) / 3)
    assert d["se"] ** 2 == pytest.approx(d["between_var"] + d["prompt_var"])
    assert d["seed_variance"] and 2 <= d["df"] < math.inf and d["ci_low"] < d["value"] < d["ci_high"]
    one = stats.pooled_delta(pa[:1], pb, ba[:, :1], bb)
    assert not one["seed_variance"]
    fixed = stats.pooled_delta(pa, pb[:1], ba, bb[:, :1], fixed_b=True)  # a variant against the SFT model
    assert fixed["seed_variance"] and fixed["between_var"] == pytest.approx(np.var(pa, ddof=1) / 3)


@pytest.mark.parametrize("kw", [dict(run_sd=0.15), dict(run_sd=0.0), dict(run_sd=0.15, interaction_sd=2.0)],
                         ids=["seed-spread", "no-seed-spread", "variant-x-prompt"])
def test_calibrated_under_no_effect(kw):
    """No variant effect, three runs per variant: the 95% interval excludes zero in at most ~5% of evaluations
    (the training seed's spread, or a variant x prompt interaction, included)."""
    assert rejection_rate(pooled_interval, 1500, seed=7, runs_a=3, runs_b=3, **kw) <= 0.06


def test_what_the_old_interval_and_welch_alone_get_wrong():
    """The prompt-only bootstrap (one run per variant's interval) ignores the seed; Welch on run values ignores
    the prompt sample. Each is far above 5% where its blind spot matters."""
    assert rejection_rate(prompt_only_interval, 500, seed=7, runs_a=3, runs_b=3, run_sd=0.15) > 0.15
    assert rejection_rate(welch_interval, 500, seed=7, runs_a=3, runs_b=3, run_sd=0.15, interaction_sd=2.0) > 0.1


def test_a_known_effect_is_detected():
    assert rejection_rate(pooled_interval, 300, seed=7, runs_a=3, runs_b=3, run_sd=0.15, effect=1.0) >= 0.9
