"""GRPO math: group-relative advantages, the clipped token loss with a k3 KL penalty, small stats.

Pure tensor functions; the training loop (sampling, scoring, optimiser) lives elsewhere.
"""
from __future__ import annotations

import math

import torch
from speedrun.common import UserError

SCALES = ("group", "batch", "none")


def _check_groups(rewards: torch.Tensor, group_size: int) -> int:
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [num_prompts * group_size], got shape {tuple(rewards.shape)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    n = rewards.numel()
    if n == 0 or n % group_size != 0:
        raise ValueError(f"rewards has {n} entries, not a positive multiple of group_size={group_size}")
    return n // group_size


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """A_i = (r_i - mean of its group) / (std + eps); a prompt's group_size samples are contiguous.

    scale="group": Bessel-corrected std of the group; "batch": Bessel-corrected std of all rewards;
    "none": no division (Dr. GRPO). Returns [num_prompts * group_size], float (rewards' dtype if float).
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    num_prompts = _check_groups(rewards, group_size)
    r = rewards if rewards.is_floating_point() else rewards.float()
    r = r.detach()
    if not torch.isfinite(r).all():
        bad = int(torch.nonzero(~torch.isfinite(r))[0])
        raise ValueError(f"reward at index {bad} (group {bad // group_size}) is not finite: {r[bad].item()}")
    g = r.view(num_prompts, group_size)
    centered = g - g.mean(dim=1, keepdim=True)
    if scale == "none":
        return centered.reshape(-1)
    if scale == "group":
        if group_size < 2:
            raise ValueError("scale='group' needs group_size >= 2 (a Bessel-corrected std of one sample is undefined)")
        std = g.std(dim=1, keepdim=True, unbiased=True)
    else:
        if r.numel() < 2:
            raise ValueError("scale='batch' needs at least 2 rewards")
        std = r.std(unbiased=True)
    return (centered / (std + eps)).reshape(-1)


def passk_advantages(rewards: torch.Tensor, group_size: int, k: int, scale: str = "group",
                     eps: float = 1e-4) -> torch.Tensor:
    """The pass@k advantage (Chen et al., arXiv 2508.10751, its analytic form): a completion's advantage is the mean
    reward of the k-subsets of its group that hold it, less the mean over all k-subsets, where a k-subset's reward is
    its best completion's. On binary rewards (N completions, c right): the mean is 1 - C(N-c, k)/C(N, k), a right
    completion gets (1 - mean) and a wrong one (1 - mean - C(N-c-1, k-1)/C(N-1, k-1)), over the std of the subsets'
    reward (sqrt(mean (1 - mean)): the paper's). Real rewards take the same form with the max. k = 1 is GRPO's
    advantage up to the std's Bessel factor. scale: group (that std) | batch (the std of every reward) | none."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    num_prompts = _check_groups(rewards, group_size)
    if not 1 <= k <= group_size:
        raise ValueError(f"pass@k advantage: k must lie in [1, group size {group_size}], got {k}")
    r = rewards.detach().double().view(num_prompts, group_size)
    if not torch.isfinite(r).all():
        raise ValueError("pass@k advantage: a reward is not finite")
    s, order = r.sort(dim=1)  # ascending: the i-th smallest is a subset's max in C(i, k-1) of the C(N, k) subsets
    N = group_size
    w_all = torch.tensor([math.comb(i, k - 1) / math.comb(N, k) for i in range(N)], dtype=torch.float64)
    mean = (s * w_all).sum(1, keepdim=True)
    second = ((s - mean) ** 2 * w_all).sum(1, keepdim=True)  # the variance of the k-subsets' reward
    # for the completion at sorted position j: the other k-1 of its subset come from the N-1 others, whose i-th
    # smallest is the max of those k-1 in C(i, k-2) of C(N-1, k-1) draws; the subset's reward is the larger one
    w_rest = torch.tensor([math.comb(i, k - 2) / math.comb(N - 1, k - 1) if k >= 2 else 0.0 for i in range(N - 1)],
                          dtype=torch.float64)
    held = torch.empty_like(s)
    for j in range(N):
        rest = torch.cat([s[:, :j], s[:, j + 1:]], 1)
        held[:, j] = s[:, j] if k == 1 else (torch.maximum(rest, s[:, j:j + 1]) * w_rest).sum(1)
    adv = torch.empty_like(s).scatter_(1, order, held - mean)
    adv = torch.where(s[:, -1:] > s[:, :1], adv, torch.zeros_like(adv))  # equal rewards: exactly no signal
    if scale == "group":
        adv = adv / (second.sqrt() + eps)
    elif scale == "batch":
        adv = adv / (r.std(unbiased=True) + eps)
    return adv.reshape(-1).to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def zero_std_fraction(rewards: torch.Tensor, group_size: int) -> float:
    """Fraction of groups whose rewards are all equal: they give zero advantage, hence no signal."""
    num_prompts = _check_groups(rewards, group_size)
    g = rewards.detach().view(num_prompts, group_size)
    return float((g.amax(dim=1) == g.amin(dim=1)).float().mean())


def token_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    beta: float,
    normaliser: float | None = None,
    clip_high: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped GRPO surrogate + beta * k3 KL, averaged over the masked (completion) tokens of the batch.

    logp/old_logp/ref_logp/mask: [B, T] log-probs of the sampled tokens under the current policy, the
    sampling policy and the frozen reference; advantages: [B], one per sequence. old_logp and ref_logp
    are constants. Per token: -min(rho*A, clip(rho, 1-eps, 1+eps)*A) + beta*(exp(ref-logp) - (ref-logp) - 1).
    normaliser: the loss divides the summed token terms by it instead of this batch's masked-token count (a rank
    of a multi-process step passes the count over all ranks, so the summed gradients are the whole batch's);
    the stats stay means over this batch's tokens. clip_high: the ratio's upper clip 1 + clip_high in place of
    1 + clip_eps (DAPO's clip-higher, arXiv 2503.14476: more room to raise unlikely tokens; 0 = symmetric).
    """
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    for name, t in (("old_logp", old_logp), ("ref_logp", ref_logp), ("mask", mask)):
        if t.shape != logp.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != logp shape {tuple(logp.shape)}")
    if advantages.shape != (logp.shape[0],):
        raise ValueError(f"advantages must be [B]={logp.shape[0]}, got shape {tuple(advantages.shape)}")
    if clip_eps < 0 or beta < 0 or clip_high < 0:
        raise ValueError(f"clip_eps, clip_high and beta must be >= 0, got clip_eps={clip_eps}, "
                         f"clip_high={clip_high}, beta={beta}")
    hi = 1.0 + (clip_high or clip_eps)
    m = mask.bool()
    n = m.sum()
    if n == 0:
        raise ValueError("mask selects no completion tokens")
    # zero the padded positions first: an -inf there would otherwise turn the gradient into NaN
    zero = torch.zeros_like(logp)
    logp = torch.where(m, logp, zero)
    old = torch.where(m, old_logp.detach().to(logp.dtype), zero)
    ref = torch.where(m, ref_logp.detach().to(logp.dtype), zero)
    adv = advantages.detach().to(logp.dtype)[:, None]

    ratio = torch.exp(logp - old)
    surr = ratio * adv
    surr_clipped = torch.clamp(ratio, 1.0 - clip_eps, hi) * adv
    pg = -torch.minimum(surr, surr_clipped)
    # k3 estimator: unbiased, >= 0, and its gradient pulls logp toward ref (unlike logp - ref)
    d = ref - logp
    kl = torch.exp(d) - d - 1.0
    per_token = pg + beta * kl
    loss = torch.where(m, per_token, zero).sum() / (n if normaliser is None else normaliser)

    with torch.no_grad():
        nf = n.to(logp.dtype)
        msum = lambda x: float(torch.where(m, x, zero).sum() / nf)  # noqa: E731
        # clipped branch active = the min picked the clipped term, so this token gets no gradient
        clipped = ((adv > 0) & (ratio > hi)) | ((adv < 0) & (ratio < 1.0 - clip_eps))
        outside = (ratio > hi) | (ratio < 1.0 - clip_eps)
        stats = {
            "loss": float(loss),
            "pg_loss": msum(pg),
            "kl": msum(kl),
            "clip_frac": msum(clipped.to(logp.dtype)),
            "ratio_outside_frac": msum(outside.to(logp.dtype)),
            "ratio_mean": msum(ratio),
            "logp_mean": msum(logp),
            "n_tokens": float(n),
        }
    return loss, stats


def require_reward_signal(output_weight: torch.Tensor, reward_std: float | None, source: str) -> None:
    """Refuse a reward model that scores every completion the same: its output layer is all zeros (the untrained
    head) or its rewards have no spread. Every group-relative advantage would be 0 and GRPO would train nothing."""
    if not bool(output_weight.detach().any()):
        why = "its output layer is all zeros (the untrained head)"
    elif reward_std is not None and not reward_std > 0:
        why = f"its rewards have std {reward_std} over its validation responses"
    else:
        return
    raise UserError(f"{source}: constant reward model: {why}, so every GRPO advantage would be 0 and GRPO would "
                     "train nothing. Retrain it (see its metrics: best_step, reward_std, val accuracy).")
