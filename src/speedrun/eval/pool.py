"""One model's responses as per-cell sums, so that a bootstrap draw (a weight per cell) scores every metric without
touching text again; and the nested bootstrap's cell draws. A cell is one (prompt_id, seed): compare.py."""
from __future__ import annotations

import numpy as np
import pandas as pd

from speedrun.eval import diversity as dv
from speedrun.eval import semantic


class Pool:
    """One model's responses, sorted by (prompt_id, seed, sample_idx), with per-cell sums."""

    def __init__(self, df: pd.DataFrame, enc: dv.Encoded, tic: str, enc_first: dv.Encoded | None = None,
                 stock: tuple[list[list[str]], list[tuple[str, ...]], np.ndarray] | None = None, match_words: int = 0):
        self.enc, self.enc_first = enc, enc_first  # enc_first: each response's first match_words words
        cell_keys = list(zip(df["prompt_id"], df["seed"]))
        self.cells = sorted(set(cell_keys))
        cell_of = {c: j for j, c in enumerate(self.cells)}
        self.cell = np.asarray([cell_of[c] for c in cell_keys], dtype=np.int64)
        n_cells = len(self.cells)
        texts = df["text"].tolist()

        def per_cell(values) -> np.ndarray:
            return np.bincount(self.cell, weights=np.asarray(values, dtype=np.float64), minlength=n_cells)

        self.n = per_cell(np.ones(len(df)))
        self.chars = per_cell([len(t) for t in texts])
        self.dashes = per_cell([sum(t.count(d) for d in dv.DASHES) for t in texts])
        self.ascii_dashes = per_cell([t.count(dv.ASCII_DASH) for t in texts])
        self.words = per_cell(enc.lengths)
        # a response shorter than the length-matched window counts whole there, adding fewer n-grams to its pool
        self.short = per_cell(np.asarray(enc.lengths) < match_words) if enc_first is not None else None
        self.sentences = per_cell([dv.sentence_count(t) for t in texts])
        self.njb = per_cell([dv.not_just_but_count([t]) for t in texts])
        self.tic = per_cell([tic in t for t in texts]) if tic else None
        self.stock = None
        if stock is not None:  # (word lists, phrases, rows counted): responses holding any phrase, counted rows only
            toks, phrases, counted = stock
            wanted, n = set(phrases), len(phrases[0])
            held = [counted[i] and not wanted.isdisjoint(dv.ngrams(t, n)) for i, t in enumerate(toks)]
            self.stock, self.n_counted = per_cell(held), per_cell(counted)
        self.reward = per_cell(df["reward"].astype(float).to_numpy())
        if "ref_logprob" in df.columns:  # the prompt's reference answer under this model, on each of its rows
            self.ref_ll = per_cell(df["ref_logprob"].astype(float).to_numpy())
        if "prompt_gain" in df.columns:  # that answer's log-likelihood under its own prompt over another's
            self.prompt_gain = per_cell(df["prompt_gain"].astype(float).to_numpy())
        self._text_patterns(df, enc)
        members = [np.flatnonzero(self.cell == j) for j in range(n_cells)]
        self.within = {f"within_distinct_{k}": np.asarray(
            [dv.distinct_n([texts[i] for i in rows], k) for rows in members]) for k in (1, 2, 3)}
        self.within["within_self_bleu"] = np.asarray([dv.self_bleu_scores(enc, rows, 4).mean() for rows in members])
        if "embedding" in df.columns:  # a fixed embedder's vector per response: semantic spread within a prompt
            emb = np.stack(df["embedding"].to_numpy())
            self.within["within_vendi"] = np.asarray([dv.vendi(emb[rows]) for rows in members])
        if "sentence_embedding" in df.columns:  # a sentence encoder's unit vector per response (eval.semantic)
            emb = np.stack(df["sentence_embedding"].to_numpy())
            self.within["within_semantic"] = np.asarray([semantic.pairwise_distance(emb[rows]) for rows in members])
            self.across = per_cell(semantic.across_distance(emb, df["prompt_id"], df["seed"], df["sample_idx"]))

    def _text_patterns(self, df: pd.DataFrame, enc: dv.Encoded) -> None:
        """Per response: its share of repeated 4-grams (rep_n) and its opening; per (4-gram, prompt) pair held, so a
        draw counts the 4-grams said to two or more of its prompts (dv.shared_ngram_share)."""
        n_rows, k = len(df), dv.N_SHARED - 1
        rows, grams, counts = enc.rows[k], enc.grams[k], enc.counts[k]
        total = np.bincount(rows, weights=counts, minlength=n_rows)
        distinct = np.bincount(rows, minlength=n_rows)
        self.rep = np.bincount(self.cell, weights=np.where(total > 0, 1.0 - distinct / np.maximum(total, 1), 0.0),
                               minlength=len(self.cells))
        openings: dict[tuple, int] = {}
        self.opening = np.asarray([openings.setdefault(dv.opening(dv.words(t)), len(openings)) for t in df["text"]],
                                  dtype=np.int64)
        prompts = {p: i for i, p in enumerate(sorted({p for p, _ in self.cells}))}
        prompt_of_cell = np.asarray([prompts[p] for p, _ in self.cells], dtype=np.int64)
        self.gram_rows, self.gram_ids, self.gram_counts = rows, grams, counts.astype(np.float64)
        # each (4-gram, cell) once, and the (4-gram, prompt) pair it belongs to: a draw keeps a pair alive while one
        # of its cells is drawn
        cell_pair = np.unique(grams * len(self.cells) + self.cell[rows])
        self.pair_cell = cell_pair % len(self.cells)
        prompt_pair = (cell_pair // len(self.cells)) * len(prompts) + prompt_of_cell[self.pair_cell]
        gp, self.pair_gp = np.unique(prompt_pair, return_inverse=True)
        self.gp_gram = gp // len(prompts)
        self.n_types = max(enc.n_types[k], 1)

    def _shared(self, w_cell: np.ndarray, w_row: np.ndarray) -> float:
        """Share of the draw's 4-grams (weighted) whose 4-gram is said to at least two of the draw's prompts."""
        alive = np.bincount(self.pair_gp[w_cell[self.pair_cell] > 0], minlength=self.gp_gram.size) > 0
        held = np.bincount(self.gp_gram[alive], minlength=self.n_types)  # prompts of the draw saying the 4-gram
        weight = w_row[self.gram_rows] * self.gram_counts
        return float(weight @ (held[self.gram_ids] >= 2)) / max(float(weight.sum()), 1e-12)

    def metrics(self, w_cell: np.ndarray, bleu_pos: np.ndarray, vocab: list[int]) -> dict:
        """All metrics on the pool where cell j counts w_cell[j] times."""
        n_resp = w_cell @ self.n
        out = {
            "em_dash_rate": 1000.0 * (w_cell @ self.dashes) / max(w_cell @ self.chars, 1.0),
            "not_just_but": 100.0 * (w_cell @ self.njb) / n_resp,
            "ascii_dash_rate": 1000.0 * (w_cell @ self.ascii_dashes) / max(w_cell @ self.chars, 1.0),
            "reward": (w_cell @ self.reward) / n_resp,
            **({"ref_loglik": (w_cell @ self.ref_ll) / n_resp} if hasattr(self, "ref_ll") else {}),
            **({"prompt_gain": (w_cell @ self.prompt_gain) / n_resp} if hasattr(self, "prompt_gain") else {}),
            **({"tic_share": 100.0 * (w_cell @ self.tic) / n_resp} if self.tic is not None else {}),
            **({"stock_phrases": 100.0 * (w_cell @ self.stock) / max(w_cell @ self.n_counted, 1.0)}
               if self.stock is not None else {}),
            "len_words": (w_cell @ self.words) / n_resp,
            "len_chars": (w_cell @ self.chars) / n_resp,
            "len_sentences": (w_cell @ self.sentences) / n_resp,
            **({"short_share": 100.0 * (w_cell @ self.short) / n_resp} if self.short is not None else {}),
        }
        for name, per_cell in self.within.items():
            out[name] = (w_cell @ per_cell) / w_cell.sum()
        w_row = w_cell[self.cell]
        out["rep_4"] = 100.0 * (w_cell @ self.rep) / n_resp
        out["top_opening"] = 100.0 * np.bincount(self.opening, weights=w_row).max() / n_resp
        out["shared_4grams"] = 100.0 * self._shared(w_cell, w_row)
        if hasattr(self, "across"):
            out["across_semantic"] = (w_cell @ self.across) / n_resp
        out |= dv.pool_metrics(self.enc, w_row, bleu_pos, vocab)
        if self.enc_first is not None:
            first = dv.pool_metrics(self.enc_first, w_row, bleu_pos, vocab)
            out |= {f"{n}_first": first[n] for n in ("ead_1", "distinct_2", "self_bleu")}
        return {k: float(v) for k, v in out.items()}


def draw_cells(rng: np.random.Generator, prompt_of_cell: np.ndarray, n_prompts: int) -> np.ndarray:
    """Cell weights of one nested bootstrap draw: prompts with replacement, then seeds within each."""
    order = np.argsort(prompt_of_cell, kind="stable")
    sizes = np.bincount(prompt_of_cell, minlength=n_prompts)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    picked = rng.integers(0, n_prompts, size=n_prompts)
    rep = np.repeat(picked, sizes[picked])
    cells = order[offsets[rep] + (rng.random(rep.size) * sizes[rep]).astype(np.int64)]
    return np.bincount(cells, minlength=prompt_of_cell.size).astype(np.float64)
