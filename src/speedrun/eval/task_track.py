"""The task track's evaluation: every model answers every held-out item n times; the checker (data/task.py) marks
each answer. Per model and cluster: pass@1, pass@k, coverage@n (distinct right answers per item), the entropy of
the right answers, and the share of responses in the model's most common phrasing.

Collapse is not sharpening, and not drift: the task SFT model sampled at several temperatures traces a
pass@1-versus-coverage curve whose envelope (eval/envelope.py) is the frontier. An arm lies below it when its coverage
is under the envelope at its own pass@1 (`frontier_gap` < 0, with an interval that excludes zero), not when it merely
moves along it; it has collapsed by its reward only when its gap lies beyond the shuffled-reward arm's.
"""
from __future__ import annotations

import math
from collections import Counter
import numpy as np
import pandas as pd
import torch

from speedrun.common import stable_seed
from speedrun.data.gold import pass_at_k
from speedrun.data.task import TaskItem, check, extract, normalise, phrasing
from speedrun.engine import completion_texts, generate
from speedrun.eval.envelope import envelope_at
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


def column_mean(tab: pd.DataFrame, rows: np.ndarray, col: str) -> float:
    """Mean of one column of a per-item table over the item rows `rows` (a bootstrap draw)."""
    return float(tab[col].to_numpy(dtype=float)[rows].mean())


def curve_columns(tabs: list[pd.DataFrame]) -> np.ndarray:
    """[table, 2, item]: the pass@1 and coverage columns of per-item tables, taken out of pandas once (a bootstrap
    reads them thousands of times); `cols[..., rows].mean(-1)` is column_mean's value for each table and column."""
    return np.stack([np.stack([t["pass@1"].to_numpy(dtype=float), t["coverage"].to_numpy(dtype=float)])
                     for t in tabs])


def gap_draws(sft: dict[float, pd.DataFrame], runs: list[pd.DataFrame], draws: list[np.ndarray]) -> np.ndarray:
    """[draw, run] coverage − the SFT model's envelope coverage at the run's pass@1 (sft: per-item tables by
    temperature), the envelope and every run on the same item rows of each draw (tables of the same items)."""
    out, temps, sft_cols, run_cols = [], np.array(sorted(sft)), curve_columns([sft[t] for t in sorted(sft)]), \
        curve_columns(runs)
    for rows in draws:
        front = np.column_stack([temps, sft_cols[:, :, rows].mean(-1)])
        p1, cov = run_cols[:, :, rows].mean(-1).T
        out.append(cov - envelope_at(front, p1)[0])
    return np.array(out)


def matched_draws(curves: dict[str, list[dict[float, pd.DataFrame]]], at: str, temperature: float,
                  draws: list[np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    """Coverage at matched pass@1: per arm a [draw, run] matrix of each run's coverage on its own curve's envelope
    (curves[arm][run]: per-item tables by temperature) at arm `at`'s mean pass@1 at `temperature`, on the same item
    rows of each draw; and the share of readings above a run's highest sampled pass@1 (extended linearly)."""
    out: dict[str, list[np.ndarray]] = {arm: [] for arm in curves}
    extended, n = 0, 0
    temps = {arm: np.array(sorted(runs[0])) for arm, runs in curves.items()}
    cols = {arm: [curve_columns([run[t] for t in temps[arm]]) for run in runs] for arm, runs in curves.items()}
    t_at = list(temps[at]).index(temperature)
    for rows in draws:
        target = float(np.mean([c[t_at, 0, rows].mean() for c in cols[at]]))
        for arm, runs in cols.items():
            row = []
            for c in runs:
                value, outside = envelope_at(np.column_stack([temps[arm], c[:, :, rows].mean(-1)]), target, True)
                row.append(float(value[0]))
                extended, n = extended + int(outside[0]), n + 1
            out[arm].append(np.array(row))
    return {arm: np.array(v) for arm, v in out.items()}, extended / max(n, 1)


def item_draws(n_items: int, n_boot: int, seed: int, tag: str) -> list[np.ndarray]:
    """The identity, then n_boot seeded bootstrap draws of item rows: shared by every model compared."""
    rng = np.random.default_rng(stable_seed(tag, seed))
    return [np.arange(n_items)] + [rng.integers(0, n_items, n_items) for _ in range(n_boot)]


def frontier_gaps(sft: dict[float, pd.DataFrame], arms: dict[str, list[pd.DataFrame]], n_boot: int, seed: int,
                  k_values: tuple[int, ...], control: str = "shuffled") -> dict:
    """Per arm: mean over its seeds of (coverage − the SFT envelope's coverage at the run's pass@1), with a 95%
    interval from a bootstrap over eval items (the envelope and every run resampled on the same items) and the spread
    between seeds; `below` when the interval lies under zero. With a `control` arm (the shuffled reward), each other
    arm's gap minus the control's (minus_control), and `collapsed` (by its reward) only when that difference's
    interval lies under zero: GRPO updates that carry no information (drift) lower coverage too, so a gap alone, or a
    control whose own interval includes 0, calls nothing. Without a control no arm is called collapsed."""
    tables = {t: per_item(a, k_values) for t, a in sft.items()}
    runs = {arm: [per_item(a, k_values) for a in frames] for arm, frames in arms.items()}
    draws = item_draws(len(next(iter(tables.values()))), n_boot, seed, "task_frontier")
    temps = sorted(tables)
    front = np.array([(t, column_mean(tables[t], draws[0], "pass@1"), column_mean(tables[t], draws[0], "coverage"))
                      for t in temps])
    out, boots = {}, {}
    for arm, tabs in runs.items():
        g = boots[arm] = gap_draws(tables, tabs, draws)
        out[arm] = _interval(g[0], g[1:].mean(axis=1))
        out[arm]["below"] = bool(out[arm]["ci_high"] < 0)
        p1 = np.array([column_mean(t, draws[0], "pass@1") for t in tabs])
        out[arm]["outside_frontier"] = [round(float(x), 4) for x in p1[envelope_at(front, p1)[1]]]  # above its top
        out[arm]["collapsed"] = False
    for arm in runs:  # the same gap against the negative control's, on the same item draws
        if control in runs and arm != control:
            diff = boots[arm].mean(axis=1) - boots[control].mean(axis=1)
            out[arm]["minus_control"] = _interval(boots[arm][0], diff[1:], boots[control][0])
            out[arm]["collapsed"] = bool(out[arm]["minus_control"]["ci_high"] < 0)
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





BLIND_RATIO, BLIND_MARGIN = 2.0, 0.15  # a model reads a cluster's prompts: pass@1 >= 2x blind and >= blind + 0.15


def reads_prompt(pass1: float, blind: float) -> bool:
    """A model reads a cluster's prompts: pass@1 at least BLIND_RATIO x the blind baseline and BLIND_MARGIN above it."""
    return pass1 >= BLIND_RATIO * blind and pass1 >= blind + BLIND_MARGIN


def blind_baseline(answers: pd.DataFrame, task_items: list[TaskItem]) -> dict[str, dict]:
    """Per cluster of one model's answers: pass@1 (mean over items), the prompt-blind baseline (each item's checker
    applied to every answer given to the cluster's other items: what a model that ignores the prompt's bounds
    scores) and whether the model reads its prompts there (BLIND_RATIO and BLIND_MARGIN)."""
    by_id = {i.item_id: i for i in task_items}
    values = [_given(by_id[i], t) for i, t in zip(answers["item_id"], answers["text"])]
    frame = answers.assign(value=values)
    out = {}
    for cluster, a in frame.groupby("cluster", sort=True):
        total, n_all = Counter(a["value"].dropna()), len(a)
        own, blind = [], []
        for item_id, rows in a.groupby("item_id", sort=True):
            right = {x.lower() for x in by_id[item_id].answers}
            mine = Counter(rows["value"].dropna())
            own.append(sum(mine[x] for x in right) / len(rows))
            if n_all > len(rows):
                blind.append(sum(total[x] - mine[x] for x in right) / (n_all - len(rows)))
        p1 = float(np.mean(own))
        b = float(np.mean(blind)) if blind else math.nan
        out[cluster] = {"pass@1": round(p1, 4), "blind": round(b, 4) if blind else None,
                        "reads_prompt": bool(blind) and reads_prompt(p1, b)}
    return out


def _given(item: TaskItem, text: str) -> str | None:
    """The value a response gives, spelled as the item's checker compares it (lower case; a hub number normalised)."""
    given = extract(text)
    if given is None:
        return None
    return (normalise(given) if item.solution else given).lower()
