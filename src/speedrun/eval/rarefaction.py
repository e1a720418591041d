"""Distinct right answers at an equal number of right answers: narrowing apart from lost skill.

An arm that gives fewer right answers to an item also shows fewer distinct right values, even if it draws them from
the same distribution: coverage mixes skill and narrowing. Rarefaction separates them: per item, both runs' right
answers are thinned to the smaller of their two counts (the expected number of distinct values among that many drawn
without replacement), so the two are compared at one sample size. Thinning both sides of a run pair is unbiased
under the null that the two runs draw their right answers from one distribution, whatever their counts; thinning to a
pool of several control runs is not (a pool mixes runs that differ, so it is wider than any one of them:
`bench/rarefaction_bias.py` measures both).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
from scipy.special import gammaln


def _log_choose(a: int, b: int) -> float:
    return float(gammaln(a + 1) - gammaln(b + 1) - gammaln(a - b + 1))


def expected_distinct(counts: Sequence[int], k: int) -> float:
    """Expected distinct values among k draws without replacement from a multiset with these value counts:
    Σ over values of P(the value is drawn at least once) = 1 − C(n − c, k) / C(n, k)."""
    n = int(sum(counts))
    k = min(int(k), n)
    if k <= 0:
        return 0.0
    return float(sum(1.0 - (np.exp(_log_choose(n - c, k) - _log_choose(n, k)) if n - c >= k else 0.0)
                     for c in counts))


def paired_item(a: Sequence[str], b: Sequence[str]) -> tuple[float, float, int]:
    """One item's right answers (their values) from two runs: each run's expected distinct values at m = the smaller
    count, and m. An item where either run has no right answer gives (0, 0, 0): nothing to compare at m = 0."""
    m = min(len(a), len(b))
    ca, cb = list(Counter(a).values()), list(Counter(b).values())
    return expected_distinct(ca, m), expected_distinct(cb, m), m


def narrowing(a: dict[str, Sequence[str]], b: dict[str, Sequence[str]]) -> dict:
    """Run a against run b, item by item (dicts item → that run's right answers' values; an item missing from one
    counts as no right answers): the mean over items of a's minus b's distinct values at an equal number of right
    answers (negative: a narrower), its standard error over items, the items that enter (both with a right answer)
    and the mean m. Every item counts in the mean, and one where m < 2 adds 0 (nothing to compare), so the value is
    diluted by such items: read it beside items_compared and mean_m."""
    items = sorted(set(a) | set(b))
    if not items:
        raise ValueError("narrowing: no items")
    pairs = [paired_item(a.get(i, ()), b.get(i, ())) for i in items]
    d = np.array([x - y for x, y, _ in pairs])
    se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")  # over items, within this run pair
    return {"value": float(d.mean()), "se": se, "items": len(items),
            "items_compared": sum(m > 0 for _, _, m in pairs), "mean_m": float(np.mean([m for _, _, m in pairs]))}


def right_answers(answers: "pd.DataFrame") -> dict[str, dict[str, list[str]]]:  # noqa: F821
    """Model -> item -> the values of its right answers, from an answers.parquet frame (model, item_id, answer; a
    wrong answer's value is missing): what narrowing compares. Filter the frame to one temperature first."""
    return {model: {i: list(g["answer"].dropna().astype(str)) for i, g in rows.groupby("item_id")}
            for model, rows in answers.groupby("model")}
