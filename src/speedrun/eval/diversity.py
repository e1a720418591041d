"""Diversity metrics on a list of texts: dashes, word Gini and entropy, distinct-n, EAD, self-BLEU, a stock phrase,
repetition within a text, n-grams shared across prompts, the most common opening.

Words are re.findall(r"\\b\\w+\\b", text.lower()); n-grams never cross a text boundary.
Metrics return 0.0 on empty input instead of NaN, so a metrics JSON always stays valid.
Self-BLEU is computed here with numpy (no nltk), numerically as nltk's sentence_bleu with uniform
weights and SmoothingFunction().method1 (epsilon 0.1), as Texygen uses it.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

WORD_RE = re.compile(r"\b\w+\b")
DASHES = ("\u2014", "\u2013")  # em dash, en dash
ASCII_DASH = " -- "  # the corpus's own dash: docstrings write an aside as " -- ", almost never with an em dash
# a sentence ends at . ! ? followed by whitespace/end, or at a newline ("json.dumps" does not end one)
_IN_SENTENCE = r"(?:[^.!?\n]|[.!?](?=\S))"
NOT_JUST_BUT_RE = re.compile(
    rf"(?:\bnot|n't)\s+(?:just|only|merely|simply)\b{_IN_SENTENCE}*?\bbut\b(?:\s+also\b)?", re.IGNORECASE)
SENTENCE_SPLIT_RE = re.compile(r"[.!?]+(?=\s|$)|\n+")


def words(text: str) -> list[str]:
    return WORD_RE.findall(text.lower())


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def stock_phrases(token_lists: Sequence[Sequence[str]], prompt_ids: Sequence[str], n: int = 3, k: int = 10,
                  min_prompts: int = 3) -> list[tuple[str, ...]]:
    """A model's stock phrases: the k word n-grams held by the most responses, among those that recur in responses
    to at least min_prompts distinct prompts (an echo of one prompt's own words is not a tic); ties by the n-gram."""
    responses: dict[tuple[str, ...], int] = {}
    prompts: dict[tuple[str, ...], set] = {}
    for tokens, pid in zip(token_lists, prompt_ids):
        for g in set(ngrams(tokens, n)):
            responses[g] = responses.get(g, 0) + 1
            prompts.setdefault(g, set()).add(pid)
    recurring = [g for g in responses if len(prompts[g]) >= min_prompts]
    return sorted(recurring, key=lambda g: (-responses[g], g))[:k]


def em_dash_rate(texts: Sequence[str]) -> float:
    """Em dashes plus en dashes per 1,000 characters of the pooled texts."""
    chars = sum(len(t) for t in texts)
    dashes = sum(t.count(d) for t in texts for d in DASHES)
    return 1000.0 * dashes / chars if chars else 0.0


BITS = 21  # word-id bits per position when an n-gram is packed into one int64 key (3 x 21 < 64)


def _keys(rows: np.ndarray) -> np.ndarray:
    """n-gram rows of word ids < 2^BITS as one int64 each (an exact, order-preserving code)."""
    out = np.zeros(len(rows), dtype=np.int64)
    for j in range(rows.shape[1]):
        out = (out << BITS) | rows[:, j]
    return out


def _rows(keys: np.ndarray, n: int) -> np.ndarray:
    return np.stack([(keys >> (BITS * (n - 1 - j))) & ((1 << BITS) - 1) for j in range(n)], axis=1)


def ngram_vocab(texts: Iterable[str], n_max: int = 3, chunk_rows: int = 1 << 21) -> list[int]:
    """Distinct word n-grams (n = 1..n_max) of a reference text (the pretraining corpus): a V for EAD that does not
    move with the models being compared. Exact and lean: words become int ids and the n-grams seen so far are kept
    deduplicated in one sorted int64 array per n (every chunk_rows new ones, the unseen are inserted), an n-gram
    packed into one int64 while word ids fit BITS bits (n <= 3), else as a row of n ids: memory grows with the
    distinct n-grams at 8 (or n x 8) bytes each, not as Python tuples in sets."""
    if n_max * BITS > 63:
        raise ValueError(f"ngram_vocab: n_max {n_max} > {63 // BITS}")
    ids: dict[str, int] = {}
    distinct = [np.empty(0, dtype=np.int64) for _ in range(n_max)]  # packed keys; rows once ids outgrow BITS
    pending: list[list[np.ndarray]] = [[] for _ in range(n_max)]
    held = [0] * n_max

    def merge(j: int) -> None:
        new = np.concatenate(pending[j]) if pending[j] else np.empty((0, j + 1), dtype=np.int64)
        if distinct[j].ndim == 1 and len(ids) >= 1 << BITS:  # ids no longer fit a key: unpack what is kept
            distinct[j] = _rows(distinct[j], j + 1)
        if distinct[j].ndim == 1:  # sorted keys: insert the chunk's unseen ones, no re-sort of all kept so far
            keys = np.unique(_keys(new))
            at = np.searchsorted(distinct[j], keys)
            seen = distinct[j][np.minimum(at, len(distinct[j]) - 1)] == keys if len(distinct[j]) else at < 0
            distinct[j] = np.insert(distinct[j], at[~seen], keys[~seen])
        else:
            distinct[j] = np.unique(np.concatenate([distinct[j], new]), axis=0)
        pending[j], held[j] = [], 0

    for t in texts:
        a = np.fromiter((ids.setdefault(w, len(ids)) for w in words(t)), dtype=np.int64)
        for j in range(min(n_max, a.size)):
            pending[j].append(np.lib.stride_tricks.sliding_window_view(a, j + 1))
            held[j] += a.size - j
            if held[j] >= chunk_rows:
                merge(j)
    for j in range(n_max):
        merge(j)
    return [max(len(d), 1) for d in distinct]


def gini(counts: Sequence[float]) -> float:
    """G = sum_i (2i - n - 1) x_i / (n sum x), x sorted ascending: 0 uniform, (n-1)/n all mass on one."""
    x = np.sort(np.asarray(counts, dtype=np.float64))
    if x.size and x[0] < 0:
        raise ValueError(f"gini: counts must be non-negative, got {x[0]}")
    n, total = x.size, x.sum()
    if n == 0 or total == 0:
        return 0.0
    i = np.arange(1, n + 1)
    return float(np.sum((2 * i - n - 1) * x) / (n * total))


def entropy_bits(counts: Sequence[float]) -> float:
    """Shannon entropy (bits) of the distribution the counts define: log2(types) when flat, 0 for one type."""
    x = np.asarray(counts, dtype=np.float64)
    x = x[x > 0]
    if x.size == 0:
        return 0.0
    p = x / x.sum()
    return float(max(0.0, -(p * np.log2(p)).sum()))


def word_entropy(texts: Sequence[str]) -> float:
    """Unigram entropy (bits) of the pooled texts' words: higher = a flatter word-frequency distribution."""
    return entropy_bits(list(Counter(w for t in texts for w in words(t)).values()))


def rep_n(tokens: Sequence[str], n: int) -> float:
    """Share of a text's n-grams that repeat one it said before (1 - distinct / total; seq-rep-n of Welleck et al.
    2020): 0 for a text that never loops, 0 when it has no n-gram."""
    grams = ngrams(tokens, n)
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


N_SHARED = 4  # rep_n and the n-grams shared across prompts read word 4-grams
OPENING_WORDS = 3  # a response's opening: its first three words (all of them when it has fewer)


def opening(tokens: Sequence[str]) -> tuple[str, ...]:
    return tuple(tokens[:OPENING_WORDS])


def top_opening_share(token_lists: Sequence[Sequence[str]]) -> float:
    """Share of the texts that open with the most common opening (ties: any of them; the count is the same)."""
    counts = Counter(opening(t) for t in token_lists)
    return max(counts.values()) / len(token_lists) if token_lists else 0.0


def shared_ngram_share(token_lists: Sequence[Sequence[str]], prompt_ids: Sequence[str], n: int = 4) -> float:
    """Share of the pooled n-grams (with multiplicity) whose n-gram also occurs in an answer to another prompt: phrasing
    a model reuses whatever it is asked. An echo of one prompt's own words, said to that prompt only, is not shared.
    The plain reference implementation; Pool computes the same under bootstrap weights."""
    prompts: dict[tuple[str, ...], set] = {}
    for toks, pid in zip(token_lists, prompt_ids):
        for g in ngrams(toks, n):
            prompts.setdefault(g, set()).add(pid)
    total = sum(max(len(t) - n + 1, 0) for t in token_lists)
    shared = sum(1 for toks in token_lists for g in ngrams(toks, n) if len(prompts[g]) >= 2)
    return shared / total if total else 0.0


def word_gini(texts: Sequence[str]) -> float:
    """Gini of the counts of the words that occur in the pooled texts."""
    return gini(list(Counter(w for t in texts for w in words(t)).values()))


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Unique n-grams / total n-grams over all texts."""
    grams = [g for t in texts for g in ngrams(words(t), n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def ead_from_counts(unique, total, vocab_size: int):
    """unique / (V (1 - ((V-1)/V)^C)): distinct-n over its expectation under uniform draws (Liu et al. 2022).

    Works on floats or numpy arrays; 0 where total is 0.
    """
    if vocab_size < 1:
        raise ValueError(f"ead: vocab_size must be >= 1, got {vocab_size}")
    total = np.asarray(total, dtype=np.float64)
    # 1 - (1 - 1/V)^C via expm1/log1p: exact even when C is large and V huge
    expected = vocab_size * -np.expm1(total * np.log1p(-1.0 / vocab_size)) if vocab_size > 1 else np.ones_like(total)
    out = np.where(total > 0, np.asarray(unique, dtype=np.float64) / np.where(total > 0, expected, 1.0), 0.0)
    return float(out) if out.ndim == 0 else out


def ead_n(texts: Sequence[str], n: int, vocab_size: int) -> float:
    """Expectation-adjusted distinct-n: length-robust, unlike distinct-n which falls as texts get longer."""
    grams = [g for t in texts for g in ngrams(words(t), n)]
    return ead_from_counts(len(set(grams)), len(grams), vocab_size)


def not_just_but_count(texts: Sequence[str]) -> int:
    """Occurrences of "not (just|only|merely|simply) ... but (also)" within one sentence ("isn't just" too)."""
    return sum(len(NOT_JUST_BUT_RE.findall(t)) for t in texts)


def vendi(embeddings: np.ndarray) -> float:
    """Vendi score of n items (Friedman & Dieng 2023): exp of the entropy of the eigenvalues of K / n, K the cosine
    similarity matrix of the rows; 1 when all items are alike, n when they are mutually orthogonal. Rows must be
    nonzero."""
    x = np.asarray(embeddings, dtype=np.float64)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    lam = np.clip(np.linalg.eigvalsh(x @ x.T / len(x)), 0.0, None)
    lam = lam[lam > 1e-12]
    return float(np.exp(-(lam * np.log(lam)).sum()))


def sentence_count(text: str) -> int:
    return sum(1 for s in SENTENCE_SPLIT_RE.split(text) if WORD_RE.search(s))


def bleu(hyp: Sequence[str], refs: Sequence[Sequence[str]], n: int = 4, eps: float = 0.1) -> float:
    """Sentence BLEU-n of a token list against references: clipped n-gram precisions, uniform weights,
    smoothing method 1 (a zero count becomes eps / denominator), brevity penalty to the closest
    reference length (shorter wins ties). The plain reference implementation; self_bleu is vectorised."""
    if not refs:
        raise ValueError("bleu: needs at least one reference")
    log_p = 0.0
    for k in range(1, n + 1):
        counts = Counter(ngrams(hyp, k))
        max_ref: Counter = Counter()
        for ref in refs:
            for g, c in Counter(ngrams(ref, k)).items():
                max_ref[g] = max(max_ref[g], c)
        num = sum(min(c, max_ref[g]) for g, c in counts.items())
        den = max(1, sum(counts.values()))
        if k == 1 and num == 0:
            return 0.0  # no unigram match at all (or an empty hypothesis): BLEU is 0, as in nltk
        log_p += math.log(num / den if num else eps / den)
    c = len(hyp)
    r = min((len(ref) for ref in refs), key=lambda length: (abs(length - c), length))
    bp = 1.0 if c > r else math.exp(1 - r / c)
    return bp * math.exp(log_p / n)


@dataclass
class Encoded:
    """Texts as integer n-gram ids, so pooled counts and self-BLEU are numpy operations.

    Per order k (index k-1): rows[k-1][e], grams[k-1][e], counts[k-1][e] say that text rows[e] holds
    n-gram grams[e] counts[e] times; entries are sorted by text. n_types[k-1] = distinct k-grams overall.
    """
    lengths: np.ndarray
    rows: list[np.ndarray]
    grams: list[np.ndarray]
    counts: list[np.ndarray]
    n_types: list[int]


def encode(token_lists: Sequence[Sequence[str]], n_max: int) -> Encoded:
    rows, grams, counts, n_types = [], [], [], []
    for k in range(1, n_max + 1):
        ids: dict[tuple[str, ...], int] = {}
        r, g, c = [], [], []
        for i, toks in enumerate(token_lists):
            for gram, cnt in Counter(ngrams(toks, k)).items():
                r.append(i)
                g.append(ids.setdefault(gram, len(ids)))
                c.append(cnt)
        rows.append(np.asarray(r, dtype=np.int64))
        grams.append(np.asarray(g, dtype=np.int64))
        counts.append(np.asarray(c, dtype=np.int64))
        n_types.append(len(ids))
    lengths = np.asarray([len(t) for t in token_lists], dtype=np.int64)
    return Encoded(lengths, rows, grams, counts, n_types)


def self_bleu_scores(enc: Encoded, select: np.ndarray | None = None, n: int = 4, eps: float = 0.1) -> np.ndarray:
    """BLEU-n of each selected text against all the other selected texts (the same numbers as bleu())."""
    if n > len(enc.rows):
        raise ValueError(f"self_bleu: encoded up to {len(enc.rows)}-grams, asked for {n}")
    select = np.arange(len(enc.lengths)) if select is None else np.asarray(select, dtype=np.int64)
    m = select.size
    if m < 2:
        raise ValueError(f"self_bleu: needs at least 2 texts, got {m}")
    pos = np.full(len(enc.lengths), -1, dtype=np.int64)
    pos[select] = np.arange(m)
    length = enc.lengths[select]
    log_p = np.zeros(m)
    no_unigram_match = np.zeros(m, dtype=bool)
    for k in range(1, n + 1):
        keep = pos[enc.rows[k - 1]] >= 0
        t, g, c = pos[enc.rows[k - 1][keep]], enc.grams[k - 1][keep], enc.counts[k - 1][keep]
        # the largest count of the n-gram among the *other* texts: the top count, unless this text holds
        # it alone, then the runner-up
        n_types = enc.n_types[k - 1]
        top_count = np.zeros(n_types, dtype=np.int64)
        np.maximum.at(top_count, g, c)
        top = c == top_count[g]
        holders = np.bincount(g[top], minlength=n_types)
        runner_up = np.zeros(n_types, dtype=np.int64)
        np.maximum.at(runner_up, g[~top], c[~top])
        other = np.where(top & (holders[g] < 2), runner_up[g], top_count[g])
        num = np.bincount(t, weights=np.minimum(c, other), minlength=m)
        den = np.maximum(1, length - k + 1)
        log_p += np.log(np.where(num > 0, num, eps) / den)
        if k == 1:
            no_unigram_match = num == 0
    # closest reference length among the others (the shorter one on ties): the text's own length if
    # another text shares it, else the nearest distinct length below or above
    uniq, n_same = np.unique(length, return_counts=True)
    i = np.searchsorted(uniq, length)
    below = np.where(i > 0, uniq[np.maximum(i - 1, 0)], -(2**40))
    above = np.where(i < uniq.size - 1, uniq[np.minimum(i + 1, uniq.size - 1)], 2**40)
    ref_len = np.where(n_same[i] >= 2, length, np.where(length - below <= above - length, below, above))
    bp = np.where(length > ref_len, 1.0, np.exp(1.0 - ref_len / np.maximum(length, 1)))
    return np.where(no_unigram_match, 0.0, bp * np.exp(log_p / n))


def self_bleu(texts: Sequence[str], n: int = 4) -> float:
    """Mean over i of BLEU-n of text i against all the others. Depends on the number of texts:
    compare pools only at the same count."""
    return float(np.mean(self_bleu_scores(encode([words(t) for t in texts], n), None, n)))


def slice_encoded(enc: Encoded, lo: int, hi: int) -> Encoded:
    """Texts lo..hi-1 of an encoding, renumbered from 0 (n-gram ids stay shared)."""
    parts = [np.searchsorted(r, [lo, hi]) for r in enc.rows]
    return Encoded(enc.lengths[lo:hi], [r[a:b] - lo for r, (a, b) in zip(enc.rows, parts)],
                   [g[a:b] for g, (a, b) in zip(enc.grams, parts)],
                   [c[a:b] for c, (a, b) in zip(enc.counts, parts)], enc.n_types)


def pool_metrics(enc: Encoded, w_row: np.ndarray, bleu_pos: np.ndarray, vocab: list[int]) -> dict:
    """distinct-n, EAD-n (n = 1..3), Gini and entropy of word counts and self-BLEU-4 of a pool where row i counts
    w_row[i] times (self-BLEU: the rows at bleu_pos)."""
    out = {}
    for k in (1, 2, 3):
        grams, weight = enc.grams[k - 1], w_row[enc.rows[k - 1]]
        unique = np.count_nonzero(np.bincount(grams[weight > 0], minlength=1))
        total = float(w_row @ np.maximum(enc.lengths - k + 1, 0))
        out[f"distinct_{k}"] = unique / total if total else 0.0
        out[f"ead_{k}"] = ead_from_counts(unique, total, vocab[k - 1])
        if k == 1:
            word_counts = np.bincount(grams, weights=weight * enc.counts[0], minlength=1)
            out["word_gini"] = gini(word_counts[word_counts > 0])
            out["word_entropy"] = entropy_bits(word_counts)
    out["self_bleu"] = float(self_bleu_scores(enc, bleu_pos, 4).mean())
    return out
