"""Report figures: metrics per model, the forest plot of a comparison, reward against diversity per run,
training curves and prompt-sampling shares.

Drawn with matplotlib's object API on the Agg canvas (no pyplot state), at a fixed dpi and without the
Software tag, so a rerun writes byte-identical files.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from speedrun.common import write_bytes
from speedrun.eval.compare import FAIL, METRIC_BY_NAME, PASS, UNSURE

DPI = 100
VERDICT_WORD = {PASS: "better", FAIL: "worse", UNSURE: "n.s.", None: "no verdict"}
VERDICT_COLOR = {PASS: "#2ca02c", FAIL: "#d62728", UNSURE: "#7f7f7f", None: "#9ecae1"}
FIXED_COLORS = {"sft": "#7f7f7f", "baseline": "#1f77b4", "density": "#d62728"}
OTHER_COLORS = ["#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def _save(fig: Figure, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})  # no version tag: stable bytes
    write_bytes(path, buf.getvalue())


def _colors(names) -> dict[str, str]:
    """The same colour for a model/variant in every figure: found by name, else the next spare one."""
    out, n_other = {}, 0
    for name in names:
        key = next((k for k in FIXED_COLORS if k in name.lower()), None)
        if key:
            out[name] = FIXED_COLORS[key]
        else:
            out[name], n_other = OTHER_COLORS[n_other % len(OTHER_COLORS)], n_other + 1
    return out


def plot_metrics(result: dict, path: Path) -> None:
    """One panel per metric: each model's (run's) value with its bootstrap 95% interval over prompts."""
    names, models = result["metrics"], result["models"]
    cols = 5
    rows = (len(names) + cols - 1) // cols
    fig = Figure(figsize=(3.2 * cols, 2.6 * rows))
    colors = _colors(models)
    for j, name in enumerate(names):
        ax = fig.add_subplot(rows, cols, j + 1)
        vals = np.array([result["values"][m][name] for m in models])
        lo = np.array([result["ci"][m][name][0] for m in models])
        hi = np.array([result["ci"][m][name][1] for m in models])
        # pooled self-BLEU's interval can miss the full-pool value (see compare.py): clamp the whiskers
        err = np.vstack([np.maximum(vals - lo, 0), np.maximum(hi - vals, 0)])
        x = np.arange(len(models))
        ax.bar(x, vals, yerr=err, color=[colors[m] for m in models], capsize=3)
        ax.set_xticks(x, [m.replace("grpo_", "") for m in models], fontsize=6, rotation=60)
        ax.set_title(METRIC_BY_NAME[name].label, fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.yaxis.set_major_locator(MaxNLocator(4))  # fewer tick labels: text is most of the drawing time
    fig.subplots_adjust(left=0.04, right=0.99, bottom=0.04, top=0.95, wspace=0.3, hspace=0.8)  # tight_layout: slow
    _save(fig, path)


def plot_logs(logs: dict[str, pd.DataFrame], path: Path) -> None:
    """Per-step reward (rolling mean), KL and entropy where every log has them; one line per run, coloured by
    variant (runs named grpo_<variant>_s<seed>)."""
    for run, df in logs.items():
        for col in ("step", "reward_mean"):
            if col not in df.columns:
                raise ValueError(f"logs[{run!r}]: missing column {col!r} (has {list(df.columns)})")
    panels = ["reward_mean"] + [c for c in ("kl", "entropy") if all(c in df.columns for df in logs.values())]
    fig = Figure(figsize=(4.5 * len(panels), 3.4))
    colors = _colors(logs)
    for j, col in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), j + 1)
        labelled = set()
        for run, df in logs.items():
            df = df.sort_values("step")
            window = max(1, len(df) // 10)
            y = df[col].astype(float).rolling(window, min_periods=1).mean()
            label = None if colors[run] in labelled else run.rsplit("_s", 1)[0]
            labelled.add(colors[run])
            ax.plot(df["step"], y, color=colors[run], alpha=0.8, linewidth=1.0, label=label)
        ax.set_xlabel("step")
        ax.set_title(f"{col} (rolling mean)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path)


def forest_rows(result: dict, comparison: dict) -> list[tuple[str, np.ndarray, list[float], str]]:
    """(label, [Δ, CI low, CI high] and each training seed's Δ as % of b's mean, verdict) per metric with a true zero
    (a % of the standardised RM reward's mean, which sits near 0, means nothing: the report's table has it)."""
    rows = []
    for name in result["metrics"]:
        base = float(np.mean([result["values"][r][name] for r in comparison["runs_b"]]))
        if base == 0 or not METRIC_BY_NAME[name].ratio:
            continue
        d = comparison["delta"][name]
        dots = [100 * per[name] / abs(base) for per in comparison["per_seed"].values()]
        label = METRIC_BY_NAME[name].label + (" *" if d["role"] == "primary" else "")
        rows.append((label, 100 * np.array([d["value"], d["ci_low"], d["ci_high"]]) / abs(base), dots, d["verdict"]))
    return rows


def plot_forest(result: dict, comparison: dict, path: Path) -> None:
    """Per metric: a - b relative to b's mean, each training seed's Δ (a's run i - b's run i) as a dot and the
    pooled 95% interval as a bar, coloured by verdict."""
    a, b = comparison["a"], comparison["b"]
    rows = forest_rows(result, comparison)
    fig = Figure(figsize=(7, 0.35 * len(rows) + 2.0))
    ax = fig.add_subplot(1, 1, 1)
    for i, (label, (v, lo, hi), dots, ver) in enumerate(rows):
        y = len(rows) - 1 - i
        ax.plot([lo, hi], [y, y], color=VERDICT_COLOR[ver], linewidth=2.5, alpha=0.7)
        ax.plot([v], [y], "|", color="black", markersize=10)
        ax.plot(dots, [y] * len(dots), "o", color="black", markersize=3)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [r[0] for r in reversed(rows)], fontsize=8)
    ax.set_xlabel(f"{a} − {b}, % of {b}'s mean\ndots = per training seed, bar = pooled 95% interval", fontsize=8)
    ax.set_title("* primary (Holm). green: better, red: worse, grey: n.s., blue: no verdict\n(control or 1 run). "
                 "Mean RM reward (standardised, mean near 0):\nin the report's table, not as a %", fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def plot_scatter(result: dict, x_metric: str, path: Path) -> None:
    """Mean RM reward against one diversity metric, a dot per run (and the reference), the variant means as
    crosses: the reward-diversity trade-off of every run."""
    fig = Figure(figsize=(5.5, 4.2))
    ax = fig.add_subplot(1, 1, 1)
    groups = dict(result["variants"])
    if result["reference"]:
        groups = {result["reference"]: [result["reference"]], **groups}
    colors = _colors(groups)
    for v, runs in groups.items():
        xs = [result["values"][r][x_metric] for r in runs]
        ys = [result["values"][r]["reward"] for r in runs]
        ax.plot(xs, ys, "o", color=colors[v], alpha=0.7, label=f"{v} ({len(runs)} run{'s' * (len(runs) > 1)})")
        if len(runs) > 1:
            ax.plot([np.mean(xs)], [np.mean(ys)], "x", color=colors[v], markersize=10, mew=2)
    ax.set_xlabel(f"{METRIC_BY_NAME[x_metric].label} ({METRIC_BY_NAME[x_metric].good} is better)")
    ax.set_ylabel("mean RM reward (held-out prompts)")
    ax.set_title("each run: reward against diversity (x = variant mean)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path)


def _shares(weights: dict[str, dict[str, float]]) -> dict[str, pd.Series]:
    out = {}
    for variant, groups in weights.items():
        s = pd.Series(groups, dtype=float).sort_index()
        if s.empty or not np.isfinite(s.to_numpy()).all() or (s < 0).any() or s.sum() <= 0:
            raise ValueError(f"weights[{variant!r}]: shares must be finite, >= 0 and not all 0")
        out[variant] = s / s.sum()
    return out


def plot_weights(weights: dict[str, dict[str, float]], path: Path, top: int = 15) -> None:
    """Left: the groups drawn most under uniform sampling (the baseline variant, else the first), share per
    variant. Right: all groups by rank."""
    shares = _shares(weights)
    variants = sorted(shares, key=lambda v: "baseline" not in v.lower())  # stable: baseline first
    ref = shares[variants[0]]
    groups = ref.sort_values(ascending=False, kind="stable").index[:top].tolist()
    fig = Figure(figsize=(11, 0.28 * len(groups) + 1.8))
    colors = _colors(variants)
    ax = fig.add_subplot(1, 2, 1)
    height = 0.8 / len(variants)
    for i, v in enumerate(variants):
        y = np.arange(len(groups))[::-1] + i * height
        ax.barh(y, [shares[v].get(g, 0.0) for g in groups], height=height, color=colors[v], label=v)
    ax.set_yticks(np.arange(len(groups))[::-1] + 0.4 - height / 2, groups, fontsize=7)
    ax.set_xlabel("share of drawn prompts")
    ax.set_title(f"top {len(groups)} groups under {variants[0]}", fontsize=9)
    ax.legend(fontsize=7)
    ax = fig.add_subplot(1, 2, 2)
    for v in variants:
        s = np.sort(shares[v].to_numpy())[::-1]
        ax.plot(np.arange(1, s.size + 1), s, color=colors[v], label=f"{v} (effective groups {1 / np.sum(s**2):.1f})")
    ax.set_yscale("log")
    ax.set_xlabel("group rank")
    ax.set_ylabel("share")
    ax.set_title("all groups", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path)


