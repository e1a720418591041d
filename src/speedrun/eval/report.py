"""report.md + PNG figures from an evaluate() result, the GRPO logs and the prompt-sampling shares.

Figures are drawn with matplotlib's object API on the Agg canvas (no pyplot state), at a fixed dpi
and without the Software tag, so a rerun writes byte-identical files. Paths in the markdown are
relative to report.md, so it renders on GitHub from reports/.
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from speedrun.common import stable_hash, write_bytes, write_text
from speedrun.eval.compare import FAIL, METRIC_BY_NAME, PASS, UNSURE

DPI = 100
GOOD_TEXT = {"lower": "lower", "higher": "higher", "neutral": "control"}
VERDICT_WORD = {PASS: "better", FAIL: "worse", UNSURE: "n.s.", None: "control"}
VERDICT_COLOR = {PASS: "#2ca02c", FAIL: "#d62728", UNSURE: "#7f7f7f", None: "#9ecae1"}
FIXED_COLORS = {"sft": "#7f7f7f", "baseline": "#1f77b4", "density": "#d62728"}
OTHER_COLORS = ["#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
MAX_CELL_CHARS = 600


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
    """One panel per metric: each model's value with its bootstrap 95% interval."""
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
        ax.set_xticks(x, [m.replace("grpo_", "") for m in models], fontsize=7)
        d = result["delta"][name]
        ax.set_title(f"{METRIC_BY_NAME[name].label}\n{VERDICT_WORD[d['verdict']]}", fontsize=8,
                     color=VERDICT_COLOR[d["verdict"]] if d["verdict"] in (PASS, FAIL) else "black")
        ax.tick_params(axis="y", labelsize=7)
        ax.yaxis.set_major_locator(MaxNLocator(4))  # fewer tick labels: text is most of the drawing time
    fig.subplots_adjust(left=0.04, right=0.99, bottom=0.04, top=0.95, wspace=0.3, hspace=0.55)  # tight_layout: slow
    _save(fig, path)


def plot_delta(result: dict, path: Path) -> None:
    """Forest plot: density - baseline relative to the baseline value, with its 95% interval."""
    a, b = result["pair"]
    rows = []
    for name in result["metrics"]:
        base = result["values"][b][name]
        if base != 0:
            d = result["delta"][name]
            rows.append((METRIC_BY_NAME[name].label, 100 * np.array([d["value"], d["ci_low"], d["ci_high"]]) / abs(base),
                         d["verdict"]))
    fig = Figure(figsize=(7, 0.35 * len(rows) + 1.2))
    ax = fig.add_subplot(1, 1, 1)
    for i, (label, (v, lo, hi), ver) in enumerate(rows):
        y = len(rows) - 1 - i
        ax.plot([lo, hi], [y, y], color=VERDICT_COLOR[ver], linewidth=2)
        ax.plot([v], [y], "o", color=VERDICT_COLOR[ver])
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [r[0] for r in reversed(rows)], fontsize=8)
    ax.set_xlabel(f"{a} - {b}, % of {b} (95% bootstrap interval)")
    ax.set_title("green: better, red: worse, grey: not significant, blue: control", fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def plot_logs(logs: dict[str, pd.DataFrame], path: Path) -> None:
    """Per-step reward (raw, thin; rolling mean, thick) and KL / entropy where every log has them."""
    for variant, df in logs.items():
        for col in ("step", "reward_mean"):
            if col not in df.columns:
                raise ValueError(f"logs[{variant!r}]: missing column {col!r} (has {list(df.columns)})")
    panels = ["reward_mean"] + [c for c in ("kl", "entropy") if all(c in df.columns for df in logs.values())]
    fig = Figure(figsize=(4.5 * len(panels), 3.4))
    colors = _colors(logs)
    for j, col in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), j + 1)
        for variant, df in logs.items():
            df = df.sort_values("step")
            y = df[col].astype(float)
            ax.plot(df["step"], y, color=colors[variant], alpha=0.25, linewidth=0.8)
            window = max(1, len(df) // 20)
            ax.plot(df["step"], y.rolling(window, min_periods=1).mean(), color=colors[variant], label=variant)
        ax.set_xlabel("step")
        ax.set_title(col, fontsize=9)
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


def _fmt(name: str, x: float, signed: bool = False) -> str:
    fmt = METRIC_BY_NAME[name].fmt
    return (fmt.replace("{:", "{:+") if signed else fmt).format(x)


def _cell(text: str) -> str:
    text = text if len(text) <= MAX_CELL_CHARS else text[:MAX_CELL_CHARS] + "\u2026"
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
    return text.strip().replace("\n", "<br>") or "*(empty)*"


def _metric_tables(result: dict) -> list[str]:
    models, (a, b) = result["models"], result["pair"]
    out, group = [], None
    for name in result["metrics"]:
        m, d = METRIC_BY_NAME[name], result["delta"][name]
        if m.group != group:
            group = m.group
            out += ["", f"### {group}", "",
                    "| metric | better | " + " | ".join(models) + f" | \u0394 {a} \u2212 {b} | 95% CI | verdict |",
                    "|---|---|" + "---:|" * len(models) + "---:|---|---|"]
        vals = " | ".join(_fmt(name, result["values"][mm][name]) for mm in models)
        ci = f"[{_fmt(name, d['ci_low'], True)}, {_fmt(name, d['ci_high'], True)}]"
        out.append(f"| {m.label} | {GOOD_TEXT[m.good]} | {vals} | {_fmt(name, d['value'], True)} | {ci} "
                   f"| {d['verdict'] or 'control'} |")
    return out


def _examples(result: dict, samples: pd.DataFrame, n_examples: int) -> list[str]:
    """A few prompts (picked by a stable hash, not by score), the first sample of each model side by side."""
    models = result["models"]
    df = samples.assign(prompt_id=samples["prompt_id"].astype(str))
    prompts = sorted(df["prompt_id"].unique(), key=lambda p: stable_hash("example", p))[:n_examples]
    out = []
    for p in prompts:
        rows = df[df["prompt_id"] == p].sort_values(["seed", "sample_idx"], kind="stable")
        first = rows.iloc[0]
        rows = rows[(rows["seed"] == first["seed"]) & (rows["sample_idx"] == first["sample_idx"])]
        by_model = {r["model"]: r for _, r in rows.iterrows()}
        title = f"`{p}`" + (f": {_cell(str(first['prompt']))}" if "prompt" in rows.columns else "")
        out += ["", f"**Prompt {title}** (seed {first['seed']}, sample {first['sample_idx']})", "",
                "| " + " | ".join(models) + " |", "|" + "---|" * len(models),
                "| " + " | ".join(_cell(by_model[m]["text"]) if m in by_model else "" for m in models) + " |",
                "| " + " | ".join(f"reward {by_model[m]['reward']:.3f}" if m in by_model else "" for m in models) + " |"]
    return out


def write_report(result: dict, samples: pd.DataFrame, logs: dict[str, pd.DataFrame],
                 weights: dict[str, dict[str, float]], out_md: Path, fig_dir: Path, setup: dict,
                 extra_sections: list[str] | None = None, n_examples: int = 3) -> str:
    """Write out_md and its figures (metrics.png, delta.png, reward_curves.png, sampling_weights.png)
    into fig_dir; returns the markdown. logs: per-step GRPO log per variant (step, reward_mean; kl and
    entropy plotted when present). weights: {variant: {group: sampling share}}. Empty logs/weights skip
    their figure. extra_sections: markdown blocks appended at the end, in order."""
    out_md, fig_dir = Path(out_md), Path(fig_dir)
    rel = lambda name: Path(os.path.relpath(fig_dir / name, out_md.parent)).as_posix()  # noqa: E731
    a, b = result["pair"]
    s = result["setup"]
    plot_metrics(result, fig_dir / "metrics.png")
    plot_delta(result, fig_dir / "delta.png")

    lines = ["# Diversity evaluation: density-aware vs uniform prompt sampling", "", "## Setup", ""]
    lines += [f"- **{k}**: {v if isinstance(v, (str, int, float)) else json.dumps(v, sort_keys=True)}"
              for k, v in setup.items()]
    lo, hi = s["samples_per_cell"]
    per_cell = str(lo) if lo == hi else f"{lo}\u2013{hi}"
    lines += [f"- **evaluated**: {s['n_prompts']} prompts \u00d7 seeds {s['seeds']} \u00d7 "
              f"{per_cell} samples = {s['responses_per_model']} "
              f"responses per model ({', '.join(result['models'])})",
              f"- **statistics**: \u0394 = {a} \u2212 {b}; paired bootstrap over prompts, then seeds within a prompt "
              f"({s['n_boot']} draws, seed {s['bootstrap_seed']}), 95% percentile interval; a resampled pool repeats "
              "prompts, which adds tokens but no new types, so the draws of distinct-n, EAD, unique/total and Gini "
              "are rescaled to the full-pool value (pooled self-BLEU is not, and its interval can sit off its "
              f"\u0394); self-BLEU-4 on "
              f"{s['self_bleu_k']} responses (nltk method-1 smoothing); EAD vocabulary V = {s['ead_vocab_size']} "
              f"(n = 1, 2, 3); words = `\\b\\w+\\b` on lowercased text",
              "- **what the interval leaves out**: GRPO's own training seed. Each variant is one training run, so a "
              "verdict says these two runs differ, not that the samplers do; only agreement over several training "
              "seeds says that"]

    directional = [n for n in result["metrics"] if METRIC_BY_NAME[n].good != "neutral"]
    count = {v: sum(result["delta"][n]["verdict"] == v for n in directional) for v in (PASS, FAIL, UNSURE)}
    lines += ["", "## Summary", "",
              f"{PASS} {count[PASS]} better, {FAIL} {count[FAIL]} worse, {UNSURE} {count[UNSURE]} not significant, "
              f"of {len(directional)} metrics with a direction ({a} vs {b}). {PASS} only where the 95% interval "
              "excludes zero in the good direction; length is a control without a verdict."]
    if "reward" in result["delta"]:
        d = result["delta"]["reward"]
        word = {PASS: "gained", FAIL: "lost", UNSURE: "kept (no significant difference)"}[d["verdict"]]
        lines += ["", f"Reward {word}: {a} {_fmt('reward', result['values'][a]['reward'])} vs {b} "
                  f"{_fmt('reward', result['values'][b]['reward'])}, \u0394 {_fmt('reward', d['value'], True)} "
                  f"[{_fmt('reward', d['ci_low'], True)}, {_fmt('reward', d['ci_high'], True)}]."]

    if result.get("vs_reference"):
        ref = result["reference"]
        lines += ["", f"Against {ref} (paired, same draws): did GRPO move the reward at all?", "",
                  f"| model | mean RM reward | \u0394 \u2212 {ref} | 95% CI | verdict |", "|---|---:|---:|---|---|"]
        for m, by_metric in result["vs_reference"].items():
            d = by_metric["reward"]
            lines.append(f"| {m} | {_fmt('reward', result['values'][m]['reward'])} | "
                         f"{_fmt('reward', d['value'], True)} | [{_fmt('reward', d['ci_low'], True)}, "
                         f"{_fmt('reward', d['ci_high'], True)}] | {d['verdict']} |")

    lines += ["", "## Metrics"] + _metric_tables(result)
    lines += ["", f"![metrics per model with 95% intervals]({rel('metrics.png')})", "",
              f"![relative difference with 95% intervals]({rel('delta.png')})"]

    lines += ["", "## Training curves", ""]
    if logs:
        plot_logs(logs, fig_dir / "reward_curves.png")
        lines += [f"![reward per step of both GRPO runs]({rel('reward_curves.png')})"]
    else:
        lines += ["*(no GRPO logs given)*"]

    lines += ["", "## Prompt sampling", ""]
    if weights:
        plot_weights(weights, fig_dir / "sampling_weights.png")
        shares = _shares(weights)
        lines += ["| variant | groups | effective groups (1/\u03a3 share\u00b2) | largest group share |", "|---|---:|---:|---|"]
        for v, sh in shares.items():
            big = sh.sort_values(ascending=False, kind="stable")
            lines.append(f"| {v} | {sh.size} | {1 / float(np.sum(sh.to_numpy() ** 2)):.1f} "
                         f"| {_cell(str(big.index[0]))} {big.iloc[0]:.3f} |")
        lines += ["", f"![per-group sampling shares]({rel('sampling_weights.png')})"]
    else:
        lines += ["*(no sampling weights given)*"]

    lines += ["", "## Sample responses"] + _examples(result, samples, n_examples)
    for section in extra_sections or []:
        lines += ["", section.strip()]
    md = "\n".join(lines) + "\n"
    write_text(out_md, md)
    return md
