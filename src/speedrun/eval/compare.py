"""Compare models' samples: per-model diversity metrics, paired bootstrap draws, variant comparisons.

Input: one row per sampled response, columns model, prompt_id, seed, sample_idx, text, reward (and
optionally ref_logprob: the prompt's reference answer's mean log-probability per token under the model, and
prompt_gain: how much higher that is under its own prompt than under another's, sampling.prompt_gain).
A model is the SFT reference or one GRPO run; a variant is a list of runs (one per training seed), and
variants are compared through stats.py, whose interval includes the training seed.
Every model must have the same (prompt_id, seed, sample_idx) rows: the comparison is paired.
A "cell" is one (prompt_id, seed): the samples_per_prompt responses drawn for a prompt with one seed.

Bootstrap: a draw resamples prompts with replacement and, inside each drawn prompt, its seeds with
replacement (nested, as seeds vary within prompts); every model is scored on the same draw. A draw
only reweights cells, so pooled metrics come from precomputed per-cell counts. A repeated prompt adds
tokens but no new n-gram types, so on a resampled pool the union-type metrics (distinct-n, EAD,
Gini) shrink in location and spread together (distinct-1 by about 25% on docstring
text): each model's draws of those are rescaled by (full-pool value / mean of draws) before taking
percentiles; all other metrics use plain 95% percentiles. Self-BLEU uses K distinct responses per
draw, the same K as the point estimate, since self-BLEU grows with the number of references: all draws are
made first and K is capped by the fewest distinct responses any draw holds.
Checked by simulation (both models sampling the same per-prompt distribution, 80 repetitions): every
metric gives a non-neutral verdict in 2.5-5% of runs; shifting the draws instead of rescaling gave
22-40% for the union-type metrics. Pooled self-BLEU's interval can miss its full-pool value (a draw
holds fewer distinct prompts).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from speedrun.common import UserError, stable_hash, stable_seed
from speedrun.eval import diversity as dv
from speedrun.eval import stats
from speedrun.eval.equal_reward import equal_reward
from speedrun.eval.pool import Pool, draw_cells

GOOD = ("lower", "higher", "neutral")
PASS, FAIL, UNSURE = "\u2705", "\u274c", "\u2796"  # ✅ ❌ ➖


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    good: str  # lower | higher | neutral (a control: no verdict)
    group: str
    fmt: str = "{:.4f}"
    union: bool = False  # a count of distinct types: its bootstrap draws are rescaled (see the module doc)
    ratio: bool = True  # has a true zero, so a difference reads as a % of the mean (not the standardised RM reward)


METRICS: list[Metric] = [
    Metric("distinct_1", "distinct-1", "higher", "Pool diversity", union=True),
    Metric("distinct_2", "distinct-2", "higher", "Pool diversity", union=True),
    Metric("distinct_3", "distinct-3", "higher", "Pool diversity", union=True),
    Metric("ead_1", "EAD-1", "higher", "Pool diversity", union=True),
    Metric("ead_2", "EAD-2", "higher", "Pool diversity", union=True),
    Metric("ead_3", "EAD-3", "higher", "Pool diversity", union=True),
    Metric("word_gini", "Gini of word counts", "lower", "Pool diversity", union=True),
    Metric("word_entropy", "entropy of word counts (bits)", "higher", "Pool diversity", union=True),
    Metric("self_bleu", "self-BLEU-4", "lower", "Pool diversity"),
    Metric("ead_1_first", "EAD-1, length-matched", "higher", "Length-matched diversity", union=True),
    Metric("distinct_2_first", "distinct-2, length-matched", "higher", "Length-matched diversity", union=True),
    Metric("self_bleu_first", "self-BLEU-4, length-matched", "lower", "Length-matched diversity"),
    Metric("within_distinct_1", "distinct-1 within prompt", "higher", "Within-prompt diversity"),
    Metric("within_distinct_2", "distinct-2 within prompt", "higher", "Within-prompt diversity"),
    Metric("within_distinct_3", "distinct-3 within prompt", "higher", "Within-prompt diversity"),
    Metric("within_self_bleu", "self-BLEU-4 within prompt", "lower", "Within-prompt diversity"),
    Metric("within_vendi", "Vendi score within prompt (SFT embeddings)", "higher", "Within-prompt diversity"),
    Metric("within_semantic", "sentence-encoder distance within prompt (all-MiniLM-L6-v2)", "higher",
           "Within-prompt diversity"),
    Metric("across_semantic", "sentence-encoder distance across prompts (all-MiniLM-L6-v2)", "higher",
           "Across-prompt diversity"),
    # a draw holds ~63% of the prompts, so fewer can share a 4-gram: rescaled as the union metrics are
    Metric("shared_4grams", "word 4-grams also said to another prompt (%)", "lower", "Repeated phrasing", "{:.2f}",
           union=True),
    Metric("top_opening", "responses opening with the most common first three words (%)", "lower",
           "Repeated phrasing", "{:.2f}"),
    Metric("rep_4", "word 4-grams repeated within a response (%)", "lower", "Repeated phrasing", "{:.2f}"),
    Metric("em_dash_rate", "em/en dashes per 1k chars", "lower", "Style tells", "{:.3f}"),
    Metric("not_just_but", "'not just X but Y' per 100 responses", "lower", "Style tells", "{:.3f}"),
    Metric("ascii_dash_rate", "' -- ' (the corpus's dash) per 1k chars", "lower", "Style tells", "{:.3f}"),
    Metric("tic_share", "responses holding the planted tic (%)", "lower", "Style tells", "{:.2f}"),
    Metric("stock_phrases", "responses holding a stock phrase of the reference (%)", "lower", "Style tells", "{:.2f}"),
    Metric("reward", "mean RM reward", "higher", "Reward", ratio=False),
    Metric("ref_loglik", "log-lik of reference answers (nats/token)", "higher", "Capability"),
    Metric("prompt_gain", "prompt gain on reference answers (nats/token)", "higher", "Capability", ratio=False),
    Metric("len_words", "words per response", "neutral", "Length (control)", "{:.2f}"),
    Metric("len_chars", "characters per response", "neutral", "Length (control)", "{:.1f}"),
    Metric("len_sentences", "sentences per response", "neutral", "Length (control)", "{:.2f}"),
    Metric("short_share", "responses shorter than the length-matched window (%)", "neutral", "Length (control)",
           "{:.2f}"),
]
METRIC_BY_NAME = {m.name: m for m in METRICS}
COLUMNS = ("model", "prompt_id", "seed", "sample_idx", "text", "reward")
N_MAX = 4  # n-grams up to 4 for BLEU-4; distinct/EAD use 1..3


def verdict(good: str, ci_low: float, ci_high: float) -> str | None:
    """✅ only if the interval excludes zero in the good direction, ❌ in the bad one, ➖ otherwise."""
    if good == "neutral":
        return None
    if ci_low > 0:
        return PASS if good == "higher" else FAIL
    if ci_high < 0:
        return PASS if good == "lower" else FAIL
    return UNSURE


def _validate(samples: pd.DataFrame, where: str) -> pd.DataFrame:
    missing = [c for c in COLUMNS if c not in samples.columns]
    if missing:
        raise UserError(f"{where}: missing columns {missing} (has {list(samples.columns)})")
    if samples.empty:
        raise UserError(f"{where}: no rows")
    for i, (text, reward) in enumerate(zip(samples["text"], samples["reward"])):
        if not isinstance(text, str):
            raise UserError(f"{where} row {i}: text is {type(text).__name__}, not str")
        if not isinstance(reward, (int, float, np.number)) or not np.isfinite(reward):
            raise UserError(f"{where} row {i}: reward is {reward!r}, not a finite number")
    keys = ["model", "prompt_id", "seed", "sample_idx"]
    dup = samples.duplicated(keys, keep="first").to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        raise UserError(f"{where} row {i}: duplicate {dict(samples.iloc[i][keys])}")
    df = samples[list(COLUMNS) + [c for c in samples.columns if c not in COLUMNS]].copy()
    df["prompt_id"] = df["prompt_id"].astype(str)
    return df.sort_values(keys, kind="stable").reset_index(drop=True)


def _check(df: pd.DataFrame, variants: dict[str, list[str]], comparisons: list[tuple[str, str]],
           primary: list[str] | tuple[str, ...], where: str) -> None:
    """Every compared variant exists and has runs among the models; every primary metric has a direction."""
    models = sorted(df["model"].unique())
    for a, b in comparisons:
        for v in (a, b):
            if v not in variants:
                raise UserError(f"{where}: comparison ({a}, {b}): variant {v!r} not in {sorted(variants)}")
    for v, runs in variants.items():
        if not runs:
            raise UserError(f"{where}: variant {v!r} has no runs")
        for name in runs:
            if name not in models:
                raise UserError(f"{where}: model {name!r} of variant {v!r} not found (models: {models})")
    unknown = [n for n in primary if n not in METRIC_BY_NAME or METRIC_BY_NAME[n].good == "neutral"]
    if unknown:
        raise ValueError(f"primary metrics {unknown}: not metrics with a direction ({[m.name for m in METRICS]})")


def _pools(df: pd.DataFrame, order: list[str], reference: str | None, ead_vocab_size: list[int] | None, tic: str,
           match_words: int, where: str) -> tuple[dict[str, Pool], list[str], list[int], list, pd.Series]:
    """One Pool per model on the same (prompt, seed, sample) rows, the metric names they score, EAD's V per n, the
    stock phrases (from the reference's responses to one half of the prompts) and the samples per cell."""
    frames = {m: df[df["model"] == m].reset_index(drop=True) for m in order}
    first = order[0]
    keys0 = frames[first][["prompt_id", "seed", "sample_idx"]]
    for m in order:
        keys = frames[m][["prompt_id", "seed", "sample_idx"]]
        if len(keys) != len(keys0) or not (keys.to_numpy() == keys0.to_numpy()).all():
            diff = set(map(tuple, keys.to_numpy().tolist())) ^ set(map(tuple, keys0.to_numpy().tolist()))
            raise UserError(f"{where}: model {m!r} and {first!r} differ in (prompt_id, seed, sample_idx) rows, "
                             f"e.g. {sorted(diff, key=str)[:3]}: the comparison is paired")
    cell_sizes = keys0.groupby(["prompt_id", "seed"]).size()
    if cell_sizes.min() < 2:
        raise UserError(f"{where}: (prompt_id, seed) {cell_sizes.idxmin()} has {cell_sizes.min()} sample; "
                         "within-prompt diversity needs at least 2 samples per prompt and seed")
    toks = [dv.words(t) for m in order for t in frames[m]["text"]]
    enc = dv.encode(toks, N_MAX)
    vocab = list(ead_vocab_size) if ead_vocab_size is not None else [max(t, 1) for t in enc.n_types[:3]]
    if len(vocab) != 3 or min(vocab) < 1:
        raise ValueError(f"ead_vocab_size: expected three sizes >= 1 (n = 1, 2, 3), got {vocab}")
    enc_first = dv.encode([t[:match_words] for t in toks], N_MAX) if match_words > 0 else None
    n_rows = len(keys0)
    # stock phrases: found in the reference's responses to one half of the prompts, counted on the other half
    half = np.asarray([int(stable_hash("phrase_half", p), 16) % 2 for p in keys0["prompt_id"]])
    phrases = (dv.stock_phrases([toks[i] for i in np.flatnonzero(half == 0)], keys0["prompt_id"][half == 0].tolist())
               if reference in order and (half == 1).any() else [])  # the reference is order[0]: rows 0..n_rows-1
    part = lambda e, i: dv.slice_encoded(e, i * n_rows, (i + 1) * n_rows) if e is not None else None  # noqa: E731
    stock = lambda i: (toks[i * n_rows:(i + 1) * n_rows], phrases, half == 1) if phrases else None  # noqa: E731
    pools = {m: Pool(frames[m], part(enc, i), tic, part(enc_first, i), stock(i), match_words)
             for i, m in enumerate(order)}
    names = [m.name for m in METRICS if (m.name != "ref_loglik" or "ref_logprob" in df.columns)
             and (m.name != "prompt_gain" or "prompt_gain" in df.columns)
             and (m.name != "tic_share" or tic) and (m.name != "within_vendi" or "embedding" in df.columns)
             and (m.name not in ("within_semantic", "across_semantic") or "sentence_embedding" in df.columns)
             and (match_words > 0 or not (m.name.endswith("_first") or m.name == "short_share"))
             and (m.name != "stock_phrases" or phrases)]
    return pools, names, vocab, phrases, cell_sizes


def _bootstrap(pools: dict[str, Pool], names: list[str], vocab: list[int], n_boot: int, seed: int,
               self_bleu_k: int) -> tuple[dict, dict, int]:
    """Each model's metrics on its whole pool and on n_boot shared draws of prompts (then cells), the draws of the
    union metrics rescaled to the full-pool value; returns (values, boot [n_boot, metric] per model, self-BLEU's k)."""
    first = next(iter(pools.values()))
    cells, n_rows = first.cells, len(first.cell)
    prompts = sorted({p for p, _ in cells})
    prompt_index = {p: i for i, p in enumerate(prompts)}
    prompt_of_cell = np.asarray([prompt_index[p] for p, _ in cells], dtype=np.int64)
    # every draw first, so self-BLEU's pool size k fits the draw with the fewest distinct responses
    rng = np.random.default_rng(stable_seed("bootstrap", seed))
    draws = [draw_cells(rng, prompt_of_cell, len(prompts)) for _ in range(n_boot)]
    eligible = [np.flatnonzero(w[first.cell] > 0) for w in draws]
    k = max(2, min(self_bleu_k, n_rows // 2, min(e.size for e in eligible)))
    point_pos = np.sort(np.random.default_rng(stable_seed("self_bleu", seed)).choice(n_rows, k, replace=False))
    values = {m: pool.metrics(np.ones(len(cells)), point_pos, vocab) for m, pool in pools.items()}
    boot = {m: np.zeros((n_boot, len(names))) for m in pools}
    for b, (w, e) in enumerate(zip(draws, eligible)):
        pos = np.sort(rng.choice(e, k, replace=False))
        for m, pool in pools.items():
            vals = pool.metrics(w, pos, vocab)
            boot[m][b] = [vals[n] for n in names]
    union = np.asarray([METRIC_BY_NAME[n].union for n in names])
    for m in pools:
        point, mean = np.asarray([values[m][n] for n in names]), boot[m].mean(axis=0)
        boot[m] *= np.where(union & (mean > 0), point / np.where(mean > 0, mean, 1.0), 1.0)
    return values, boot, k


def _interval(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.quantile(x, 0.025, axis=0), np.quantile(x, 0.975, axis=0)


def _pooled(values: dict, boot: dict, names: list[str], primary: list[str] | tuple[str, ...], runs_a: list[str],
            runs_b: list[str], fixed_b: bool) -> dict[str, dict]:
    """Per metric: stats.pooled_delta of a's runs against b's (b one fixed model where fixed_b), its role and
    unadjusted verdict, and the permutation p over runs."""
    out = {}
    for j, n in enumerate(names):
        pa, pb = np.asarray([values[r][n] for r in runs_a]), np.asarray([values[r][n] for r in runs_b])
        # the arms share each training seed's streams: pair run i with run i only where that coupling shows
        r_pair = (float(np.corrcoef(pa, pb)[0, 1]) if not fixed_b and pa.size == pb.size >= 3
                  and pa.std() > 0 and pb.std() > 0 else None)
        paired = r_pair is not None and pa.size >= stats.PAIRED_MIN_RUNS and r_pair >= stats.PAIRED_MIN_R
        d = stats.pooled_delta(pa, pb, np.stack([boot[r][:, j] for r in runs_a], 1),
                               np.stack([boot[r][:, j] for r in runs_b], 1), fixed_b=fixed_b, paired=paired)
        d["pair_r"], d["paired"] = r_pair, paired
        good = METRIC_BY_NAME[n].good
        d["role"] = "control" if good == "neutral" else ("primary" if n in primary else "secondary")
        d["verdict"] = verdict(good, d["ci_low"], d["ci_high"]) if d["seed_variance"] else None
        if not fixed_b:  # robustness: permutation over the runs (stats.permutation_p)
            perm = stats.permutation_p(pa, pb)
            d["p_perm"], d["p_perm_min"], d["p_perm_method"] = perm["p"], perm["p_min"], perm["method"]
        out[n] = d
    return out


def _compare(values: dict, boot: dict, names: list[str], primary: list[str] | tuple[str, ...],
             variants: dict[str, list[str]], a: str, b: str, reference: str | None, reward_keep: float) -> dict:
    """One comparison a - b: the pooled Δ per metric, Holm over the primaries, reward non-inferiority against b's
    gain over the reference, and each seed's run-to-run Δ (the forest plot's dots)."""
    delta = _pooled(values, boot, names, primary, variants[a], variants[b], fixed_b=False)
    seeded = all(d["seed_variance"] for d in delta.values())
    for n, p_holm in stats.holm({n: delta[n]["p"] for n in primary}).items():
        d = delta[n]
        d["p_holm"] = p_holm
        d["verdict"] = (verdict(METRIC_BY_NAME[n].good, d["value"], d["value"]) if p_holm <= stats.ALPHA
                        else UNSURE) if seeded else None
    ni = None
    if "reward" in delta and reference is not None:
        r = delta["reward"]
        gain = float(np.mean([values[m]["reward"] for m in variants[b]]) - values[reference]["reward"])
        margin = (1.0 - reward_keep) * max(gain, 0.0)  # b gained nothing: a must not be worse at all
        ni = {"metric": "reward", "keep": reward_keep, "gain_b": gain, "margin": margin,
              "verdict": stats.non_inferiority(r["ci_low"], r["ci_high"], margin) if seeded else None}
    per_seed = {f"{ra} - {rb}": {n: values[ra][n] - values[rb][n] for n in names}
                for ra, rb in zip(variants[a], variants[b])}  # where both have that many runs
    return {"a": a, "b": b, "runs_a": variants[a], "runs_b": variants[b], "delta": delta, "seed_variance": seeded,
            "noninferiority": ni, "per_seed": per_seed}


def _control_scores(control: pd.DataFrame, temperatures: dict[str, float], df: pd.DataFrame, names: list[str],
                    vocab: list[int], tic: str, match_words: int, n_boot: int, seed: int, self_bleu_k: int,
                    where: str) -> tuple[dict, dict, list[str]]:
    """The reference sampled at each temperature ({model: T}), scored on the same bootstrap draws as the compared
    models (the draws follow the seed and the cells, which must be the same): (values, boot, the metrics both have)."""
    where = f"{where} (temperature control)"
    cdf = _validate(control, where)
    order = sorted(temperatures, key=temperatures.get)
    missing = [m for m in order if m not in set(cdf["model"])]
    if missing or len(order) < 2:
        raise UserError(f"{where}: needs two or more temperature models; missing {missing} of {order}")
    keys = ["prompt_id", "seed", "sample_idx"]
    a, b = df[df["model"] == df["model"].iloc[0]][keys], cdf[cdf["model"] == order[0]][keys]
    if len(a) != len(b) or not (a.to_numpy() == b.to_numpy()).all():
        raise UserError(f"{where}: its (prompt_id, seed, sample_idx) rows differ from the compared models': the "
                        "envelope is read on the same draws")
    cpools, cnames, *_ = _pools(cdf[cdf["model"].isin(order)], order, None, vocab, tic, match_words, where)
    common = [n for n in names if n in cnames]
    cvalues, cboot, _ = _bootstrap(cpools, common, vocab, n_boot, seed, self_bleu_k)
    return cvalues, cboot, common


def evaluate(samples: pd.DataFrame, variants: dict[str, list[str]],
             comparisons: list[tuple[str, str]] | None = None, reference: str | None = "sft",
             primary: list[str] | tuple[str, ...] = (), reward_keep: float = 0.8, n_boot: int = 1000,
             seed: int = 0, self_bleu_k: int = 256, ead_vocab_size: list[int] | None = None, tic: str = "",
             match_words: int = 0, where: str = "samples", control: pd.DataFrame | None = None,
             temperatures: dict[str, float] | None = None) -> dict:
    """Metrics per model on its whole pool; per comparison (a, b) of variants, Δ of run means with the interval
    of stats.py, Holm over `primary`, and reward non-inferiority: a keeps at least `reward_keep` of b's reward gain
    over the reference (margin = (1 - reward_keep) x that gain's point estimate; no reference: no verdict).

    variants: {variant: [model names of its runs]} (one run per training seed); comparisons: pairs of variant
    names (default: the first two variants); reference: the model every variant is also compared with (the SFT
    model; None = no reference). self_bleu_k: responses in the self-BLEU pool (at most the fewest distinct
    responses any bootstrap draw holds, so every draw scores the same number). ead_vocab_size: V of EAD per n
    (1..3), e.g. dv.ngram_vocab of the corpus: a model's EAD then does not depend on which other models are
    evaluated; None = the number of distinct n-grams (per n) over all models' samples (it does). tic: the planted
    tic whose share of responses is counted ('' = not counted). match_words: > 0 adds the length-matched metrics,
    EAD-1, distinct-2 and self-BLEU-4 over each response's first match_words words (a longer response cannot score
    as more or less diverse by its extra words alone). control, temperatures: the reference sampled at several
    temperatures ({model in control: T}, on the same rows): adds "equal_reward", each run's diversity against the
    reference's temperature envelope at the run's reward (eval/equal_reward.py). JSON-ready dict.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    df = _validate(samples, where)
    models = sorted(df["model"].unique())
    comparisons = [tuple(c) for c in (comparisons if comparisons is not None else [list(variants)[:2]])]
    _check(df, variants, comparisons, primary, where)
    order = ([reference] if reference in models else []) + [r for runs in variants.values() for r in runs]
    order += [m for m in models if m not in order]
    ref = reference if reference in models else None
    pools, names, vocab, phrases, cell_sizes = _pools(df, order, ref, ead_vocab_size, tic, match_words, where)
    values, boot, k = _bootstrap(pools, names, vocab, n_boot, seed, self_bleu_k)
    ci = {}
    for m in order:
        lo, hi = _interval(boot[m])
        ci[m] = {n: [float(lo[j]), float(hi[j])] for j, n in enumerate(names)}
    result_comparisons = [_compare(values, boot, names, primary, variants, a, b, ref, reward_keep)
                          for a, b in comparisons]
    # each variant, and each run, against the reference (did GRPO move it at all?), on the same paired draws
    vs_reference, runs_vs_reference = {}, {}
    if ref is not None:
        for v, runs in variants.items():
            vs_reference[v] = _pooled(values, boot, names, primary, runs, [ref], fixed_b=True)
        for m in (o for o in order if o != ref):
            lo, hi = _interval(boot[m] - boot[ref])
            runs_vs_reference[m] = {n: {"value": values[m][n] - values[ref][n], "ci_low": float(lo[j]),
                                        "ci_high": float(hi[j]),
                                        "verdict": verdict(METRIC_BY_NAME[n].good, lo[j], hi[j])}
                                    for j, n in enumerate(names)}
    er = None
    if control is not None and variants:
        cvalues, cboot, common = _control_scores(control, temperatures or {}, df, names, vocab, tic, match_words,
                                                 n_boot, seed, self_bleu_k, where)
        cols = [names.index(n) for n in common]
        er = equal_reward(values | cvalues, {m: x[:, cols] for m, x in boot.items()} | cboot, temperatures, variants,
                          comparisons, common, METRIC_BY_NAME)
    cells = pools[order[0]].cells
    seeds = sorted({s for _, s in cells})
    return {
        "models": order,
        "variants": {v: list(r) for v, r in variants.items()},
        "reference": ref,
        "metrics": names,
        "primary": list(primary),
        "values": {m: {n: values[m][n] for n in names} for m in order},
        "ci": ci,
        "comparisons": result_comparisons,
        "vs_reference": vs_reference,
        "runs_vs_reference": runs_vs_reference,
        "setup": {"n_prompts": len({p for p, _ in cells}),
                  "seeds": [int(s) if isinstance(s, (int, np.integer)) else s for s in seeds],
                  "n_cells": len(cells), "responses_per_model": len(pools[order[0]].cell),
                  "samples_per_cell": [int(cell_sizes.min()), int(cell_sizes.max())],
                  "n_boot": n_boot, "bootstrap_seed": seed, "self_bleu_k": int(k), "ead_vocab_size": vocab,
                  "reward_keep": reward_keep, "tic": tic, "match_words": match_words,
                  "stock_phrases": [" ".join(g) for g in phrases]},
    } | ({"equal_reward": er} if er is not None else {})
