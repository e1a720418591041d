"""Distinct right answers at an equal number of right answers (speedrun.eval.rarefaction): the exact expectation,
and the reading's controls: no narrowing read where two runs draw from one distribution at different counts of right
answers (where raw distinct values differ a lot), narrowing read where one run draws from fewer values."""
from itertools import combinations

import numpy as np
import pytest

from speedrun.eval.rarefaction import expected_distinct, narrowing, paired_item, right_answers


@pytest.mark.parametrize("values,k", [("aaabbc", 2), ("aaabbc", 4), ("abcd", 3), ("aaaa", 2), ("ab", 5), ("abc", 0)])
def test_expected_distinct_is_the_mean_over_every_draw(values: str, k: int) -> None:
    counts = [values.count(v) for v in sorted(set(values))]
    draws = list(combinations(range(len(values)), min(k, len(values))))
    brute = np.mean([len({values[i] for i in d}) for d in draws]) if k else 0.0
    assert expected_distinct(counts, k) == pytest.approx(brute)


def test_paired_item_compares_at_the_smaller_count() -> None:
    a, b, m = paired_item(["1", "2", "3", "4"], ["5", "5"])
    assert m == 2 and a == pytest.approx(2.0) and b == pytest.approx(1.0)
    assert paired_item([], ["1"]) == (0.0, 0.0, 0)


def _runs(rng: np.random.Generator, probs_a: np.ndarray, probs_b: np.ndarray, n_a: int, n_b: int,
          items: int = 400) -> tuple[dict, dict]:
    values = np.array([str(v) for v in range(len(probs_a))])
    a = {f"i{i}": list(rng.choice(values, size=n_a, p=probs_a)) for i in range(items)}
    b = {f"i{i}": list(rng.choice(values, size=n_b, p=probs_b)) for i in range(items)}
    return a, b


def test_narrowing_reads_nothing_from_fewer_right_answers_alone() -> None:
    rng = np.random.default_rng(0)
    p = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    a, b = _runs(rng, p, p, n_a=3, n_b=12)  # a: a quarter of b's right answers, the same values
    raw = np.mean([len(set(a[i])) - len(set(b[i])) for i in a])
    assert raw < -1.0  # coverage would call a narrower
    r = narrowing(a, b)
    assert abs(r["value"]) < 3 * r["se"] and r["se"] < 0.05


def test_narrowing_reads_fewer_values_at_equal_right_answers() -> None:
    rng = np.random.default_rng(1)
    wide, narrow = np.array([0.3, 0.25, 0.2, 0.15, 0.1]), np.array([0.9, 0.1, 0.0, 0.0, 0.0])
    a, b = _runs(rng, narrow, wide, n_a=8, n_b=8)
    r = narrowing(a, b)
    assert r["value"] < -1.0 < -10 * r["se"] and r["items_compared"] == r["items"] == 400 and r["mean_m"] == 8


def test_right_answers_groups_each_models_right_values_by_item() -> None:
    import pandas as pd
    frame = pd.DataFrame({"model": ["rm_s1", "rm_s1", "rm_s1", "x_s1"], "item_id": ["i1", "i1", "i2", "i1"],
                          "answer": ["4", None, None, "6"]})
    got = right_answers(frame)
    assert got == {"rm_s1": {"i1": ["4"], "i2": []}, "x_s1": {"i1": ["6"]}}
    assert narrowing(got["rm_s1"], got["x_s1"])["items_compared"] == 1
