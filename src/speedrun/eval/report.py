"""report.md from an evaluate() result: the verdict, the runs, each comparison with its statistics, figures.

Paths in the markdown are relative to report.md, so it renders on GitHub from reports/.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from speedrun.common import stable_hash, write_text
from speedrun.eval import stats
from speedrun.eval.compare import FAIL, METRIC_BY_NAME, PASS, UNSURE
from speedrun.eval.figures import _shares, plot_forest, plot_logs, plot_metrics, plot_scatter, plot_weights

GOOD_TEXT = {"lower": "lower", "higher": "higher", "neutral": "control"}
MAX_CELL_CHARS = 600
METHOD = ("\u0394 = mean over a's runs \u2212 mean over b's runs (one run per GRPO training seed; every run sampled on "
          "the same prompts and sampling seeds). Its variance = the between-run variance (s\u00b2/R per variant: the "
          "training seed) + the variant \u00d7 prompt part of a paired bootstrap over prompts, then seeds within a "
          "prompt (the runs' own sampling noise, already in the first term, removed); 95% interval from Student's t "
          "with Welch-Satterthwaite degrees of freedom (src/speedrun/eval/stats.py; calibration: "
          "bench/verdict_calibration.py). Primary metrics (*) are tested under Holm's correction over the primary "
          "list; the rest are secondary: unadjusted 95% intervals, exploratory, not a tally of independent wins. "
          "Reward is judged by non-inferiority: not worse than b's by more than the margin, the share of b's reward "
          "gain over the reference a may give up (a point estimate: its own noise is not in the margin). A variant "
          "with one run has no between-run variance: its interval covers prompts only and it gets no verdict. "
          "Robustness: a permutation test on the runs' values (prompts not resampled), beside p: exact over every "
          "split of the pooled runs up to ten runs per variant, Monte Carlo over 100,000 seeded splits beyond; its "
          "smallest attainable p, in its column's header, is 0.1 at three runs per variant, so it can back a call "
          "only from six runs per variant up.")


def _fmt(name: str, x: float, signed: bool = False) -> str:
    fmt = METRIC_BY_NAME[name].fmt
    return (fmt.replace("{:", "{:+") if signed else fmt).format(x)


def _cell(text: str) -> str:
    text = text if len(text) <= MAX_CELL_CHARS else text[:MAX_CELL_CHARS] + "\u2026"
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
    return text.strip().replace("\n", "<br>") or "*(empty)*"


def _examples(result: dict, samples: pd.DataFrame, n_examples: int) -> list[str]:
    """A few prompts (picked by a stable hash, not by score), the first sample of the reference and of each
    variant's first run side by side."""
    models = ([result["reference"]] if result["reference"] else []) + [runs[0] for runs in result["variants"].values()]
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
                "| " + " | ".join(f"reward {by_model[m]['reward']:.3f}" if m in by_model else ""
                                  for m in models) + " |"]
    return out


def _ci(name: str, d: dict) -> str:
    return f"[{_fmt(name, d['ci_low'], True)}, {_fmt(name, d['ci_high'], True)}]"


def verdict_line(result: dict, c: dict) -> str:
    """One sentence: the answer for comparison c and its uncertainty."""
    a, b = c["a"], c["b"]
    runs = f"{len(c['runs_a'])} vs {len(c['runs_b'])} GRPO training seeds"
    prim = [n for n in result["primary"] if n in c["delta"]]
    if not c["seed_variance"]:
        return (f"**No verdict** on {a} vs {b}: {runs}; with one run per variant the training seed's variance "
                "cannot be estimated (set several `grpo.seeds`).")
    better = [METRIC_BY_NAME[n].label for n in prim if c["delta"][n]["verdict"] == PASS]
    worse = [METRIC_BY_NAME[n].label for n in prim if c["delta"][n]["verdict"] == FAIL]
    if better and not worse:
        div = f"more diverse on {', '.join(better)}"
    elif worse and not better:
        div = f"less diverse on {', '.join(worse)}"
    elif better and worse:
        div = f"mixed: better on {', '.join(better)}, worse on {', '.join(worse)}"
    else:
        div = "no significant difference in diversity"
    parts = [f"**{a} vs {b}** ({runs}): {div} (primary: " + ", ".join(
        f"{METRIC_BY_NAME[n].label} {_fmt(n, c['delta'][n]['value'], True)} {_ci(n, c['delta'][n])}, Holm p "
        f"{c['delta'][n]['p_holm']:.2f}" for n in prim) + ")"]
    if c["noninferiority"] and "reward" in c["delta"]:
        r, ni = c["delta"]["reward"], c["noninferiority"]
        parts.append(f"reward {ni['verdict']} at margin {ni['margin']:.3f} ({1 - ni['keep']:.0%} of {c['b']}'s gain "
                     f"{ni['gain_b']:+.3f} over the reference; \u0394 {_fmt('reward', r['value'], True)} "
                     f"{_ci('reward', r)})")
    if "tic_share" in c["delta"]:  # the planted tic: a rise is what its positive control must call
        t, mean = c["delta"]["tic_share"], lambda runs: np.mean([result["values"][x]["tic_share"] for x in runs])
        call = {FAIL: "a rise, called", PASS: "a fall, called", UNSURE: "no call"}.get(t["verdict"], "no verdict")
        parts.append(f"planted tic {result['setup']['tic']!r} in {mean(c['runs_a']):.1f}% vs {mean(c['runs_b']):.1f}% "
                     f"of responses (Δ {_fmt('tic_share', t['value'], True)} {_ci('tic_share', t)}: {call})")
    return "; ".join(parts) + "."


def _runs_table(result: dict) -> list[str]:
    cols = result["primary"] + [n for n in ("reward", "ref_loglik") if n in result["metrics"]]
    variant_of = {r: v for v, runs in result["variants"].items() for r in runs}
    out = ["| model | variant | " + " | ".join(METRIC_BY_NAME[n].label + (" *" if n in result["primary"] else "")
                                                for n in cols) + " |", "|---|---|" + "---:|" * len(cols)]
    for m in result["models"]:
        out.append(f"| {m} | {variant_of.get(m, 'reference' if m == result['reference'] else '')} | "
                   + " | ".join(_fmt(n, result["values"][m][n]) for n in cols) + " |")
    return out


def _comparison_table(result: dict, c: dict) -> list[str]:
    a, b = c["a"], c["b"]
    roles = {"primary": 0, "secondary": 1, "control": 2}
    names = sorted(result["metrics"], key=lambda n: (roles[c["delta"][n]["role"]], result["metrics"].index(n)))
    perm = next((d for d in c["delta"].values() if d.get("p_perm_min") is not None), None)
    perm_head = "permutation p"
    if perm:
        how = "Monte Carlo; " if perm.get("p_perm_method") == "monte carlo" else ""
        perm_head += f" ({how}smallest possible {perm['p_perm_min']:.3g})"
    out = [f"| metric | role | better | {a} (mean) | {b} (mean) | \u0394 | 95% CI | p | {perm_head} | verdict |",
           "|---|---|---|---:|---:|---:|---|---:|---:|---|"]
    for n in names:
        d, m = c["delta"][n], METRIC_BY_NAME[n]
        mean = lambda runs: float(np.mean([result["values"][r][n] for r in runs]))  # noqa: E731
        p = f"{d['p_holm']:.3f} (Holm)" if "p_holm" in d else f"{d['p']:.3f}"
        ver = d["verdict"] or ("control" if d["role"] == "control" else "no verdict")
        if n == "reward" and c["noninferiority"] and c["noninferiority"]["verdict"]:
            ver += f" \u00b7 {c['noninferiority']['verdict']} (margin {c['noninferiority']['margin']:.3f})"
        p_perm = "" if d.get("p_perm") is None else f"{d['p_perm']:{'.3g' if d['p_perm'] < 0.001 else '.3f'}}"
        out.append(f"| {m.label} | {d['role']} | {GOOD_TEXT[m.good]} | {_fmt(n, mean(c['runs_a']))} | "
                   f"{_fmt(n, mean(c['runs_b']))} | {_fmt(n, d['value'], True)} | {_ci(n, d)} | {p} | {p_perm} | "
                   f"{ver} |")
    coupled = [n for n in result["primary"] if c["delta"][n].get("pair_r") is not None]
    if coupled:  # the arms share each training seed's streams: does that show in their runs?
        paired = [METRIC_BY_NAME[n].label for n in coupled if c["delta"][n]["paired"]]
        out += ["", "Coupling: run i of each arm shares training seed i's sampling and prompt-draw streams. "
                "Correlation of the matched runs: "
                + ", ".join(f"{METRIC_BY_NAME[n].label} r {c['delta'][n]['pair_r']:+.2f}" for n in coupled)
                + f". A primary is analysed paired only with ≥ {stats.PAIRED_MIN_RUNS} pairs and r ≥ "
                f"{stats.PAIRED_MIN_R}: " + (f"paired: {', '.join(paired)}." if paired else "none here (unpaired).")]
    return out


def _reference_table(result: dict) -> list[str]:
    ref = result["reference"]
    cols = [n for n in ("reward", "ref_loglik", "prompt_gain") if n in result["metrics"]]
    out = ["| variant or run | " + " | ".join(f"\u0394 {METRIC_BY_NAME[n].label} \u2212 {ref} | 95% CI" for n in cols)
           + " |", "|---|" + "---:|---|" * len(cols)]
    rows = list(result["vs_reference"].items()) + list(result["runs_vs_reference"].items())
    for name, by_metric in rows:
        bold = "**" if name in result["vs_reference"] else ""
        out.append(f"| {bold}{name}{bold} | " + " | ".join(
            f"{_fmt(n, by_metric[n]['value'], True)} | {_ci(n, by_metric[n])} {by_metric[n]['verdict'] or ''}"
            for n in cols) + " |")
    return out


def heldout_wording(sources: set[str], sft_source: str, left_out: int) -> str:
    """The report's held-out sentence for the split the eval prompts actually came from: embedded prompts are held
    out by top-level module, hub prompts by a stable hash of their id (prompts.hash_split)."""
    parts = []
    if "embedded" in sources:
        parts.append("by top-level module: the eval prompts' modules (prompts.eval_frac of the pretrained modules) "
                     "appear in no post-training stage's data (SFT, pairs, on-policy samples, RM, GRPO)")
    hub = sorted(sources - {"embedded"})
    if hub:
        parts.append(f"hub prompts ({', '.join(hub)}) by a stable hash of the prompt id (prompts.eval_frac of the "
                     "deduplicated prompts): in no pair, on-policy sample, RM or GRPO batch"
                     + ("; the SFT conversations (sft.source: hf) are another dataset, not checked against them"
                        if sft_source == "hf" else ""))
    sft_val = "the corpus's val modules" if sft_source == "embedded" else "the SFT dataset's val split"
    picks = (f"SFT and the RM pick checkpoints on {sft_val}" if sft_source == "embedded" and not hub
             else f"SFT picks checkpoints on {sft_val}, the RM on the val prompts' pairs")
    return "; ".join(parts + [picks, f"{left_out} eval prompts left out because their reference answer is also a "
                                     "trained prompt's answer"])


def _setup_lines(result: dict, setup: dict) -> list[str]:
    """The report's setup: the stage's own entries, then what was evaluated and how it is tested."""
    s = result["setup"]
    lines = [f"- **{k}**: {v if isinstance(v, (str, int, float)) else json.dumps(v, sort_keys=True)}"
              for k, v in setup.items()]
    lo, hi = s["samples_per_cell"]
    per_cell = str(lo) if lo == hi else f"{lo}\u2013{hi}"
    prim = ", ".join(METRIC_BY_NAME[n].label for n in result["primary"]) or "none"
    lines += [f"- **evaluated**: {s['n_prompts']} prompts \u00d7 seeds {s['seeds']} \u00d7 {per_cell} samples = "
              f"{s['responses_per_model']} responses per model ({len(result['models'])} models)",
              f"- **primary outcomes** (Holm): {prim}; reward: non-inferiority, keeping ≥ {s['reward_keep']:.0%} of "
              f"the comparison's b arm's reward gain over the reference",
              f"- **statistics**: {METHOD}",
              f"- **metric details**: bootstrap {s['n_boot']} draws (seed {s['bootstrap_seed']}); the draws of "
              "distinct-n, EAD and Gini are rescaled to the full-pool value (a resampled pool repeats prompts, adding "
              f"tokens but no types); self-BLEU-4 on {s['self_bleu_k']} responses (nltk method-1 smoothing); EAD "
              f"vocabulary V = {s['ead_vocab_size']} (n = 1, 2, 3; the eval stage passes the corpus's distinct "
              "n-grams, a scale no evaluated model moves); words = `\\b\\w+\\b` on lowercased text"
              + (f"; length-matched metrics: each response's first {s['match_words']} words (a shorter response "
                 "whole: its share is a length control), the same V" if s.get("match_words") else "")
              + ("; stock phrases: the word 3-grams held by the most of the reference's responses to one half "
                 "of the prompts (recurring over ≥ 3 prompts), counted on every model's responses to the other half: "
                 + ", ".join(f"'{g}'" for g in s["stock_phrases"]) if s.get("stock_phrases") else "")]
    return lines


def _sampling_lines(weights: dict[str, dict[str, float]], fig: Path, link: str) -> list[str]:
    """Each variant's prompt-group shares as a table and a figure (fig, linked as link)."""
    lines: list[str] = []
    if weights:
        plot_weights(weights, fig)
        shares = _shares(weights)
        lines += ["| variant | groups | effective groups (1/\u03a3 share\u00b2) | largest group share |",
                  "|---|---:|---:|---|"]
        for v, sh in shares.items():
            big = sh.sort_values(ascending=False, kind="stable")
            lines.append(f"| {v} | {sh.size} | {1 / float(np.sum(sh.to_numpy() ** 2)):.1f} "
                         f"| {_cell(str(big.index[0]))} {big.iloc[0]:.3f} |")
        lines += ["", f"![per-group sampling shares]({link})"]
    else:
        lines += ["*(no sampling weights given)*"]
    return lines


def write_report(result: dict, samples: pd.DataFrame, logs: dict[str, pd.DataFrame],
                 weights: dict[str, dict[str, float]], out_md: Path, fig_dir: Path, setup: dict,
                 extra_sections: list[str] | None = None, n_examples: int = 3,
                 lead_sections: list[str] | None = None) -> str:
    """Write out_md and its figures into fig_dir (metrics.png, forest_<a>_vs_<b>.png, scatter.png,
    reward_curves.png, sampling_weights.png); returns the markdown. logs: per-step GRPO log per run (step,
    reward_mean; kl and entropy plotted when present). weights: {variant: {group: sampling share}}. Empty
    logs/weights skip their figure. lead_sections: markdown blocks ahead of the verdict (the checks a reader
    should see first); extra_sections: blocks appended at the end, in order."""
    out_md, fig_dir = Path(out_md), Path(fig_dir)
    rel = lambda name: Path(os.path.relpath(fig_dir / name, out_md.parent)).as_posix()  # noqa: E731
    plot_metrics(result, fig_dir / "metrics.png")
    lines = ["# Diversity evaluation: density-aware vs uniform prompt sampling", ""]
    for section in lead_sections or []:
        lines += [section.strip(), ""]
    lines += ["## Verdict", ""] if lead_sections else []
    lines += [verdict_line(result, c) for c in result["comparisons"]]
    lines += ["", "## Setup", ""] + _setup_lines(result, setup)

    lines += ["", "## Runs", "", "Every run on the same held-out prompts and sampling seeds (* primary).", ""]
    lines += _runs_table(result)
    if result.get("vs_reference"):
        lines += ["", f"## Against {result['reference']}", "",
                  f"Did GRPO move the model? Each variant (bold: pooled over its runs, interval with the training "
                  f"seed) and each run (paired bootstrap over prompts) against {result['reference']}.", ""]
        lines += _reference_table(result)
    for c in result["comparisons"]:
        name = f"forest_{c['a']}_vs_{c['b']}.png"
        plot_forest(result, c, fig_dir / name)
        lines += ["", f"## {c['a']} \u2212 {c['b']}", ""] + _comparison_table(result, c)
        lines += ["", f"![{c['a']} minus {c['b']}: per-seed differences and pooled intervals]({rel(name)})"]
    if result["primary"] and "reward" in result["metrics"]:
        plot_scatter(result, result["primary"][0], fig_dir / "scatter.png")
        lines += ["", f"![reward against {result['primary'][0]} per run]({rel('scatter.png')})"]
    lines += ["", f"![metrics per model with 95% intervals over prompts]({rel('metrics.png')})"]

    lines += ["", "## Training curves", ""]
    if logs:
        plot_logs(logs, fig_dir / "reward_curves.png")
        lines += [f"![reward, KL and entropy per step of every GRPO run]({rel('reward_curves.png')})"]
    else:
        lines += ["*(no GRPO logs given)*"]

    lines += ["", "## Prompt sampling", ""] + _sampling_lines(weights, fig_dir / "sampling_weights.png",
                                                              rel("sampling_weights.png"))

    lines += ["", "## Sample responses"] + _examples(result, samples, n_examples)
    for section in extra_sections or []:
        lines += ["", section.strip()]
    md = "\n".join(lines) + "\n"
    write_text(out_md, md)
    return md
