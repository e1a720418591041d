"""The task track's evaluation: every model answers every held-out item n times; the checker (data/task.py) marks
each answer. Per model and cluster: pass@1, pass@k, coverage@n (distinct right answers per item), the entropy of
the right answers, and the share of responses in the model's most common phrasing.

Collapse is not sharpening: the task SFT model sampled at several temperatures traces a pass@1-versus-coverage
frontier. An arm has collapsed when its coverage lies below that frontier at its own pass@1 (`frontier_gap` < 0,
with an interval that excludes zero), not when it merely moves along it.
"""
from __future__ import annotations

import math
from collections import Counter
import numpy as np
import pandas as pd
import torch

from speedrun.common import stable_seed
from speedrun.data.gold import pass_at_k
from speedrun.data.task import TaskItem, check, phrasing
from speedrun.engine import completion_texts, generate
from speedrun.tokenizer import Tokenizer

COLUMNS = ["model", "temperature", "item_id", "cluster", "sample_idx", "text", "answer"]


@torch.no_grad()
def sample_answers(model: torch.nn.Module, name: str, tok: Tokenizer, task_items: list[TaskItem], n: int,
                   max_new_tokens: int, temperature: float, seed: int, device: str) -> pd.DataFrame:
    """One row per answer (COLUMNS): each item's fixed question, n samples, the same draws for every model."""
    model.eval()
    ids = [tok.render_prompt([{"role": "user", "content": i.prompt()}]) for i in task_items]
    g = torch.Generator(device=device).manual_seed(stable_seed(seed, "task_eval"))
    out = generate(model, ids, n, max_new_tokens, temperature=temperature, stop_id=tok.assistant_end_id,
                   pad_id=tok.bos_id, generator=g)
    rows = []
    for r, text in enumerate(completion_texts(out, tok)):
        item = task_items[r // n]
        rows.append({"model": name, "temperature": temperature, "item_id": item.item_id, "cluster": item.cluster,
                     "sample_idx": r % n, "text": text, "answer": check(item, text)})
    return pd.DataFrame(rows, columns=COLUMNS)


def entropy_bits(values: list[str]) -> float:
    """Shannon entropy (bits) of the empirical distribution of `values` (0 for fewer than two)."""
    counts = np.array(list(Counter(values).values()), dtype=float)
    if counts.sum() < 2:
        return 0.0
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def pass_k_values(samples: int) -> tuple[int, ...]:
    """The k of pass@k the task track reports for `samples` answers per item: powers of two below it, then it."""
    return tuple(k for k in (1, 2, 4, 8, 16) if k < samples) + (samples,)


def per_item(answers: pd.DataFrame, k_values: tuple[int, ...]) -> pd.DataFrame:
    """One row per item of one model's answers (item_id order): cluster, pass@k for each k, coverage (distinct
    right answers), right-answer entropy (bits)."""
    rows = []
    for item_id, a in answers.groupby("item_id", sort=True):
        right = a["answer"].dropna().tolist()
        rows.append({"item_id": item_id, "cluster": a["cluster"].iloc[0],
                     **{f"pass@{k}": pass_at_k(len(a), len(right), k) for k in k_values},
                     "coverage": len(set(right)), "entropy": entropy_bits(right)})
    return pd.DataFrame(rows).set_index("item_id")


def summary(answers: pd.DataFrame, k_values: tuple[int, ...]) -> dict:
    """A model's metrics overall and per cluster (means over items), plus its top-phrasing share."""
    table = per_item(answers, k_values)
    cols = [c for c in table.columns if c != "cluster"]
    out = {"all": {c: round(float(table[c].mean()), 4) for c in cols}}
    for cluster, t in table.groupby("cluster", sort=True):
        out[cluster] = {c: round(float(t[c].mean()), 4) for c in cols}
    top = Counter(phrasing(t) for t in answers["text"]).most_common(1)[0]
    out["all"]["top_phrasing_share"] = round(top[1] / len(answers), 4)
    out["top_phrasing"] = top[0]
    return out


def frontier_at(points: np.ndarray, pass1: float) -> float:
    """Coverage of the frontier (rows of (pass@1, coverage), the SFT model at several temperatures) at `pass1`:
    linear between neighbouring points in pass@1 order; beyond the ends, the nearest end's coverage (nan for none)."""
    pts = points[np.argsort(points[:, 0])]
    return float(np.interp(pass1, pts[:, 0], pts[:, 1])) if len(pts) else math.nan


def column_mean(tab: pd.DataFrame, rows: np.ndarray, col: str) -> float:
    """Mean of one column of a per-item table over the item rows `rows` (a bootstrap draw)."""
    return float(tab[col].to_numpy(dtype=float)[rows].mean())


def curve_columns(tabs: list[pd.DataFrame]) -> np.ndarray:
    """[table, 2, item]: the pass@1 and coverage columns of per-item tables, taken out of pandas once (a bootstrap
    reads them thousands of times); `cols[..., rows].mean(-1)` is column_mean's value for each table and column."""
    return np.stack([np.stack([t["pass@1"].to_numpy(dtype=float), t["coverage"].to_numpy(dtype=float)])
                     for t in tabs])


def gap_draws(sft: list[pd.DataFrame], runs: list[pd.DataFrame], draws: list[np.ndarray]) -> np.ndarray:
    """[draw, run] coverage − SFT frontier coverage at the run's pass@1, the frontier and every run on the same item
    rows of each draw (per-item tables of the same items in the same order)."""
    out, sft_cols, run_cols = [], curve_columns(sft), curve_columns(runs)
    for rows in draws:
        front = np.array([(c[0][rows].mean(), c[1][rows].mean()) for c in sft_cols])
        out.append([float(c[1][rows].mean()) - frontier_at(front, float(c[0][rows].mean())) for c in run_cols])
    return np.array(out)


def at_pass1(points: np.ndarray, target: float) -> tuple[float, bool]:
    """Coverage on one run's own curve (rows of (pass@1, coverage), one per temperature) at pass@1 `target`: linear
    between neighbouring points in pass@1 order; beyond the ends, extended linearly from the nearest two (flagged
    True: the reading then leans on the curve's slope outside what was sampled)."""
    pts = points[np.argsort(points[:, 0])]
    x, y = pts[:, 0], pts[:, 1]
    if x[0] <= target <= x[-1]:
        return float(np.interp(target, x, y)), False
    i, j = (0, 1) if target < x[0] else (-2, -1)
    slope = (y[j] - y[i]) / max(x[j] - x[i], 1e-9)
    return float(y[i] + slope * (target - x[i])), True


def matched_draws(curves: dict[str, list[list[pd.DataFrame]]], control: str, t_index: int,
                  draws: list[np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    """Coverage at matched pass@1: per arm a [draw, run] matrix of each run's coverage on its own temperature curve
    (curves[arm][run]: per-item tables, one per temperature) at the control arm's mean pass@1 at temperature index
    t_index, on the same item rows of each draw; and the share of readings that extended a curve."""
    out: dict[str, list[list[float]]] = {arm: [] for arm in curves}
    extended, n = 0, 0
    cols = {arm: [curve_columns(c) for c in runs] for arm, runs in curves.items()}
    for rows in draws:
        target = float(np.mean([float(c[t_index][0][rows].mean()) for c in cols[control]]))
        for arm, runs in cols.items():
            row = []
            for c in runs:
                pts = np.array([(t[0][rows].mean(), t[1][rows].mean()) for t in c])
                value, ext = at_pass1(pts, target)
                row.append(value)
                extended, n = extended + ext, n + 1
            out[arm].append(row)
    return {arm: np.array(v) for arm, v in out.items()}, extended / max(n, 1)


def item_draws(n_items: int, n_boot: int, seed: int, tag: str) -> list[np.ndarray]:
    """The identity, then n_boot seeded bootstrap draws of item rows: shared by every model compared."""
    rng = np.random.default_rng(stable_seed(tag, seed))
    return [np.arange(n_items)] + [rng.integers(0, n_items, n_items) for _ in range(n_boot)]


def frontier_gaps(sft: dict[float, pd.DataFrame], arms: dict[str, list[pd.DataFrame]], n_boot: int, seed: int,
                  k_values: tuple[int, ...], control: str = "shuffled") -> dict:
    """Per arm: mean over its seeds of (coverage − SFT frontier coverage at the run's pass@1), with a 95% interval
    from a bootstrap over eval items (the frontier and every run resampled on the same items) and the spread between
    seeds; collapsed when the interval lies below zero. With a `control` arm (the shuffled reward), each other arm's
    gap minus the control's (minus_control): the part of the coverage loss the reward itself causes."""
    tables = [per_item(a, k_values) for a in sft.values()]
    runs = {arm: [per_item(a, k_values) for a in frames] for arm, frames in arms.items()}
    draws = item_draws(len(tables[0]), n_boot, seed, "task_frontier")
    front = np.array([(column_mean(t, draws[0], "pass@1"), column_mean(t, draws[0], "coverage")) for t in tables])
    out, boots = {}, {}
    for arm, tabs in runs.items():
        g = boots[arm] = gap_draws(tables, tabs, draws)
        out[arm] = _interval(g[0], g[1:].mean(axis=1))
        out[arm]["collapsed"] = bool(out[arm]["ci_high"] < 0)
        lo, hi = front[:, 0].min(), front[:, 0].max()
        out[arm]["outside_frontier"] = [round(column_mean(t, draws[0], "pass@1"), 4) for t in tabs
                                        if not lo <= column_mean(t, draws[0], "pass@1") <= hi]  # compared with an end
    for arm in runs:  # the same gap against the negative control's, on the same item draws
        if control in runs and arm != control:
            diff = boots[arm].mean(axis=1) - boots[control].mean(axis=1)
            out[arm]["minus_control"] = _interval(boots[arm][0], diff[1:], boots[control][0])
    return out


def _interval(point: np.ndarray, boot: np.ndarray, point_b: np.ndarray | None = None) -> dict:
    """Mean over seeds (minus the other arm's mean) with a 95% normal interval whose variance adds the item
    bootstrap's and the seeds' (each arm's standard error of its seed mean)."""
    def seed_var(x: np.ndarray) -> float:
        return float(x.var(ddof=1) / len(x)) if len(x) > 1 else 0.0

    mean = float(point.mean()) - (float(point_b.mean()) if point_b is not None else 0.0)
    seed_se = math.sqrt(seed_var(point) + (seed_var(point_b) if point_b is not None else 0.0))
    item_se = float(boot.std(ddof=1))
    se = math.sqrt(item_se ** 2 + seed_se ** 2)
    return {"gap": round(mean, 4), "ci_low": round(mean - 1.96 * se, 4), "ci_high": round(mean + 1.96 * se, 4),
            "per_seed": [round(float(x), 4) for x in point], "item_se": round(item_se, 4),
            "seed_se": round(seed_se, 4)}



