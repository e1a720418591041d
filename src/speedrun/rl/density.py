"""Density-aware prompt sampling: weight each prompt by how isolated it is in its embedding (speedrun.embeddings:
words, names, minilm, minilm_kind, sft_mean, sft_idf), draw batches.

w_i ∝ (mean cosine distance to its k nearest neighbours)^alpha: isolated prompts are drawn MORE often,
prompts in a crowd (e.g. one huge module's many near-identical questions) less often.
Weights are float64 torch tensors on CPU.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from speedrun.progress import Progress


def _as_unit_rows(embeddings: torch.Tensor | np.ndarray, tol: float = 1e-3) -> torch.Tensor:
    """The embeddings as float64 (dense, or sparse CSR as given), checked: [N, C], finite, L2-normalised rows."""
    e = torch.as_tensor(embeddings).detach().to(torch.float64)
    if e.dim() != 2 or e.shape[0] == 0:
        raise ValueError(f"embeddings must be [N, C] with N >= 1, got shape {tuple(e.shape)}")
    sparse = e.layout == torch.sparse_csr
    vals = e.values() if sparse else e
    if not torch.isfinite(vals).all():
        bad = torch.nonzero(~torch.isfinite(vals))[0]
        row = int(_csr_rows(e)[bad[0]]) if sparse else int(bad[0])
        raise ValueError(f"embeddings row {row} is not finite")
    norms = (torch.zeros(e.shape[0], dtype=e.dtype, device=e.device).index_add_(0, _csr_rows(e), vals ** 2).sqrt()
             if sparse else e.norm(dim=1))
    bad = torch.nonzero((norms - 1.0).abs() > tol)
    if len(bad):
        row = int(bad[0, 0])
        raise ValueError(f"embeddings must be L2-normalised rows: row {row} has norm {norms[row].item():.6g}")
    return e


def _csr_rows(e: torch.Tensor) -> torch.Tensor:
    """The row of each stored value of a sparse CSR matrix."""
    crow = e.crow_indices()
    return torch.repeat_interleave(torch.arange(e.shape[0], device=e.device), crow[1:] - crow[:-1])


def dense_rows(e: torch.Tensor, i0: int, i1: int) -> torch.Tensor:
    """Rows i0:i1 of a dense or sparse CSR matrix, dense: the same numbers either way, so a computation over blocks
    of rows gives the same result whether the whole matrix is held dense or sparse."""
    if e.layout != torch.sparse_csr:
        return e[i0:i1]
    crow = e.crow_indices()
    a, b = int(crow[i0]), int(crow[i1])
    rows = torch.repeat_interleave(torch.arange(i1 - i0, device=e.device), crow[i0 + 1:i1 + 1] - crow[i0:i1])
    out = torch.zeros(i1 - i0, e.shape[1], dtype=e.dtype, device=e.device)
    out[rows, e.col_indices()[a:b]] = e.values()[a:b]
    return out


def knn_distance(embeddings: torch.Tensor | np.ndarray, k: int, block_size: int = 1024,
                 every: float = 0.0) -> torch.Tensor:
    """Mean cosine distance (1 - cos) of each row to its k nearest other rows, float64 [N] on CPU.

    Tiled block_size x block_size with a running top-k per row, so memory is flat in N (never N x N); embeddings
    may be sparse CSR (the hashed bags: memory then grows with their nonzeros, not N x C), densified a block at a
    time. Runs on the input's device. k is capped at N-1; N=1 gives [0.]. Duplicates are neighbours at distance 0.
    every > 0: a progress line (blocks done, time left) at most that often, as its time grows as N^2.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    e = _as_unit_rows(embeddings)
    n = e.shape[0]
    k_eff = min(k, n - 1)
    out = torch.zeros(n, dtype=torch.float64)
    if k_eff == 0:
        return out
    with Progress(-(-n // block_size), f"density k-NN over {n:,} prompts", unit="block", every=every,
                  enabled=None if every > 0 else False) as bar:
        for i0 in range(0, n, block_size):
            out[i0:i0 + block_size] = knn_block(e, i0, min(i0 + block_size, n), k_eff, block_size)
            bar.update(1)
    return out


def knn_block(e: torch.Tensor, i0: int, i1: int, k: int, block_size: int = 1024) -> torch.Tensor:
    """knn_distance's unit of work: rows i0:i1 of the unit rows e (dense or CSR) against every row, block_size at a
    time with a running top-k (k <= N-1). Its memory is the whole computation's (bench/scale.py times one block)."""
    n = e.shape[0]
    best = torch.full((i1 - i0, k), -math.inf, dtype=e.dtype, device=e.device)  # top-k similarities so far
    for j0 in range(0, n, block_size):
        j1 = min(j0 + block_size, n)
        sim = dense_rows(e, i0, i1) @ dense_rows(e, j0, j1).T
        if j0 < i1 and i0 < j1:  # this tile holds the diagonal: a point is not its own neighbour
            r = torch.arange(max(i0, j0), min(i1, j1), device=e.device)
            sim[r - i0, r - j0] = -math.inf
        best = torch.cat([best, sim], dim=1).topk(k, dim=1).values
    return (1.0 - best).clamp_min(0.0).mean(dim=1).cpu()  # clamp: rounding can give 1 - cos < 0


def clip_and_normalise(raw: torch.Tensor, max_ratio: float) -> torch.Tensor:
    """Floor raw weights at max/max_ratio, normalise to sum 1; guarantees max/min <= max_ratio."""
    if not max_ratio >= 1.0:
        raise ValueError(f"max_ratio must be >= 1, got {max_ratio}")
    w = raw.to(torch.float64)
    if (w < 0).any() or not torch.isfinite(w).all():
        raise ValueError("raw weights must be finite and >= 0")
    top = w.max()
    if top <= 0:  # all distances 0 (every prompt duplicated): nothing to prefer
        return torch.full_like(w, 1.0 / w.numel())
    # tiny slack so the ratio still holds after the rounding of the normalisation
    w = w.clamp_min(top / max_ratio * (1.0 + 1e-9))
    w = w / w.sum()
    return w


def prompt_weights(
    embeddings: torch.Tensor | np.ndarray,
    k: int,
    alpha: float,
    max_ratio: float,
    block_size: int = 1024,
    every: float = 0.0,
) -> torch.Tensor:
    """Sampling weights float64 [N] summing to 1, ∝ (mean cosine distance to k nearest neighbours)^alpha.

    Larger distance (isolated) -> larger weight. alpha=0 is uniform. Clipped so max/min <= max_ratio.
    """
    if not alpha >= 0:
        raise ValueError(f"alpha must be >= 0 (alpha < 0 would oversample crowded prompts), got {alpha}")
    d = knn_distance(embeddings, k, block_size=block_size, every=every)
    raw = torch.ones_like(d) if alpha == 0 else d.pow(alpha)
    return clip_and_normalise(raw, max_ratio)


def neighbour_purity(embeddings: torch.Tensor, groups: Sequence[str], k: int, block_size: int = 1024) -> float:
    """Mean share of each row's k nearest neighbours (cosine, itself excluded) in its own group: 1 when the
    embedding puts every group together, about the group's share of rows for a random one. A block of rows at a
    time against every row: memory block_size x N, never N x N."""
    e = _as_unit_rows(embeddings)
    e = dense_rows(e, 0, e.shape[0])
    n, k = len(e), min(k, len(e) - 1)
    g = np.asarray(groups)
    same = 0
    for i0 in range(0, n, block_size):
        sim = e[i0:i0 + block_size] @ e.T
        sim[torch.arange(len(sim)), torch.arange(i0, i0 + len(sim))] = -math.inf  # not its own neighbour
        same += int((g[sim.topk(k, dim=1).indices.numpy()] == g[i0:i0 + len(sim), None]).sum())
    return same / (n * k)


def cluster_labels(embeddings: torch.Tensor | np.ndarray, k: int, seed: int, restarts: int = 4, iters: int = 25,
                   block_size: int = 1024) -> list[int]:
    """Spherical k-means of L2-normalised rows (dense or sparse CSR): a cluster per row, 0 the largest, at most k of
    them. Seeded k-means++ centres, Lloyd steps until no row moves (or `iters`); of `restarts` such runs, the one
    whose rows are most similar to their centres (k-means++ alone can seed two centres in one cluster)."""
    e = _as_unit_rows(embeddings)
    n = e.shape[0]

    def sims(c: torch.Tensor) -> torch.Tensor:  # [N, len(c)] cosine of every row to each centre
        return torch.cat([dense_rows(e, i, min(i + block_size, n)) @ c.T for i in range(0, n, block_size)])

    g = torch.Generator().manual_seed(seed)
    best, best_fit = None, -math.inf
    for _ in range(restarts):
        centres = dense_rows(e, 0, 0)
        far = torch.ones(n, dtype=torch.float64)  # 1 - cosine to the nearest centre so far
        while len(centres) < min(k, n) and far.sum() > 0:  # fewer distinct rows than k: fewer clusters
            i = int(torch.multinomial(far, 1, generator=g))
            centres = torch.cat([centres, dense_rows(e, i, i + 1)])
            far = torch.minimum(far, (1 - sims(centres[-1:])[:, 0]).clamp_min(0))
        labels = sims(centres).argmax(1)
        for _ in range(iters):
            sums = torch.zeros_like(centres)
            for i in range(0, n, block_size):
                sums.index_add_(0, labels[i:i + block_size], dense_rows(e, i, min(i + block_size, n)))
            norm = sums.norm(dim=1, keepdim=True)
            centres = torch.where(norm > 0, sums / norm.clamp_min(1e-12), centres)  # an emptied centre stays put
            moved = sims(centres).argmax(1)
            if torch.equal(moved, labels):
                break
            labels = moved
        fit = float(sims(centres).gather(1, labels[:, None]).sum())
        if fit > best_fit:
            best, best_fit = labels, fit
    sizes = torch.bincount(best, minlength=k).tolist()
    rank = {c: r for r, c in enumerate(sorted(range(len(sizes)), key=lambda c: (-sizes[c], c)))}
    return [rank[c] for c in best.tolist()]


def effective_sample_size(weights: torch.Tensor | np.ndarray) -> float:
    """(sum w)^2 / sum w^2: N for uniform weights, 1 when one prompt takes everything."""
    w = torch.as_tensor(weights, dtype=torch.float64)
    return float(w.sum() ** 2 / (w * w).sum())


def group_shares(weights: torch.Tensor | np.ndarray, groups: Sequence[str]) -> dict[str, float]:
    """Total sampling weight per group (e.g. per module), keys sorted; sums to sum(weights)."""
    w = torch.as_tensor(weights, dtype=torch.float64)
    if len(groups) != w.numel():
        raise ValueError(f"{len(groups)} group labels for {w.numel()} weights")
    shares: dict[str, float] = {}
    for g, x in zip(groups, w.tolist()):
        shares[str(g)] = shares.get(str(g), 0.0) + x
    return dict(sorted(shares.items()))


def share_entropy(shares: dict[str, float] | Sequence[float]) -> float:
    """Shannon entropy (nats) of normalised shares; exp() of it is the effective number of groups."""
    p = np.asarray(list(shares.values()) if isinstance(shares, dict) else list(shares), dtype=np.float64)
    p = p / p.sum()
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def draw_prompts(weights: torch.Tensor | np.ndarray, batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """batch_size distinct prompt indices (LongTensor), drawn ∝ weights without replacement (successive draws).

    Gumbel-top-k: the batch_size largest log w_i + G_i, G_i standard Gumbel noise from `generator`. Two arms that
    pass generators in the same state draw from the same noise, so their draws are coupled: the same prompts where
    their weights agree, different ones only as far as the weights differ."""
    w = torch.as_tensor(weights, dtype=torch.float64)
    if w.dim() != 1 or not torch.isfinite(w).all() or (w < 0).any():
        raise ValueError("weights must be a 1-D tensor of finite, non-negative numbers")
    nonzero = int((w > 0).sum())
    if not 1 <= batch_size <= nonzero:
        raise ValueError(f"batch_size={batch_size} must be in [1, {nonzero}] (prompts with non-zero weight)")
    u = torch.rand(w.shape, dtype=torch.float64, generator=generator).clamp_min(1e-300)
    keys = torch.where(w > 0, w.log() - (-u.log()).log(), torch.tensor(-torch.inf, dtype=torch.float64))
    return torch.topk(keys, batch_size).indices
