"""The GRPO loop, shared by the preference track and the adversarial cycles.

Per step: draw B prompts, sample G completions each with the KV-cache engine, score them, compute
group-relative advantages, then mu passes of the clipped token loss with a k3 KL to a frozen reference.
The old log-probs are the engine's own sampling log-probs (same temperature / top-k / top-p), so at
mu = 1 the ratio is 1 and the gradient is the plain policy gradient of the distribution that sampled."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from speedrun.common import check_finite, stable_seed
from speedrun.config import GRPOConfig
from speedrun.engine import Samples, generate, sequence_logprobs
from speedrun.progress import Progress
from speedrun.rl.grpo import group_advantages, masked_mean, token_loss, zero_std_fraction
from speedrun.train.loop import autocast

# (step, generator) -> indices of the step's prompts
DrawFn = Callable[[int, torch.Generator], torch.Tensor]
# (prompts of the step, samples) -> rewards [B * G]
RewardFn = Callable[[list[list[int]], Samples], torch.Tensor]


@dataclass
class GRPOResult:
    log: list[dict]
    stop_reason: str
    seconds: float
    completion_tokens: int


def grpo_train(policy: nn.Module, ref: nn.Module, prompts: list[list[int]], draw: DrawFn, reward_fn: RewardFn,
               cfg: GRPOConfig, device: str, stop_id: int | None, pad_id: int,
               extra_stats: Callable[[torch.Tensor], dict] | None = None, name: str = "grpo",
               stream: str | None = None) -> GRPOResult:
    """Train `policy` in place against `reward_fn`; returns the per-step log and why it stopped. The sampling and
    prompt-draw generators are keyed on (cfg.seed, stream or name, step): runs that share a stream share their
    random numbers (the arms of one training seed, so their comparison is paired)."""
    stream = stream or name
    ref.eval().requires_grad_(False)
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.9, 0.95),
                            weight_decay=0.0)
    sample_kw = dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
    log: list[dict] = []
    best_avg, bad_steps, stop_reason, tokens, t_start = -float("inf"), 0, "steps", 0, time.perf_counter()
    bar = Progress(cfg.steps, name)
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        g = torch.Generator(device=device).manual_seed(stable_seed(cfg.seed, stream, step))
        idx = draw(step, torch.Generator().manual_seed(stable_seed(cfg.seed, stream, "draw", step)))
        batch = [prompts[i] for i in idx.tolist()]
        policy.eval()
        with torch.no_grad(), autocast(device, cfg.bf16):
            s = generate(policy, batch, cfg.group_size, cfg.max_new_tokens, stop_id=stop_id, pad_id=pad_id,
                         generator=g, **sample_kw)
            rewards = reward_fn(batch, s).float().cpu()
            ref_logp = sequence_logprobs(ref, batch, s.tokens, mask=s.mask, pad_id=pad_id, **sample_kw)
        check_finite(float(rewards.mean()), f"{name} reward", step)
        t_sample = time.perf_counter() - t0
        adv = group_advantages(rewards, cfg.group_size, scale=cfg.adv_scale).to(device)
        # a truncated completion was scored mid-sentence; masking it (TRL's mask_truncated_completions) keeps it
        # in its group's advantages but out of the gradient
        truncated = (s.mask[:, -1] > 0) & (s.tokens[:, -1] != stop_id) if stop_id is not None else \
            torch.zeros(len(s.mask), dtype=torch.bool, device=s.mask.device)
        loss_mask = s.mask * (~truncated)[:, None] if cfg.truncated == "mask" else s.mask
        policy.train()
        stats, grad_norm = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "ratio_mean": 1.0}, 0.0
        for _ in range(cfg.inner_updates if loss_mask.any() else 0):  # every completion masked: no update
            for grp in opt.param_groups:
                grp["lr"] = cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup_steps))
            with autocast(device, cfg.bf16):
                out = sequence_logprobs(policy, batch, s.tokens, mask=s.mask, pad_id=pad_id,
                                        entropy=cfg.entropy_bonus > 0, **sample_kw)
            logp, ent = out if cfg.entropy_bonus > 0 else (out, None)
            loss, stats = token_loss(logp.float(), s.logprobs, ref_logp.float(), adv, loss_mask, cfg.clip_eps,
                                     cfg.beta)
            if ent is not None:  # entropy regularisation: + eta * the whole next-token distribution's entropy
                loss = loss - cfg.entropy_bonus * masked_mean(ent.float(), loss_mask)
                stats["loss"] = float(loss.detach())
            check_finite(float(loss.detach()), f"{name} loss", step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = float(nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip))
            opt.step()
        n_tok = int(s.mask.sum())
        tokens += n_tok
        lengths = s.mask.sum(1)
        row = {"step": step + 1, "loss": stats["loss"], "pg_loss": stats["pg_loss"], "kl": stats["kl"],
               "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
               "zero_std_frac": zero_std_fraction(rewards, cfg.group_size), "adv_mean": float(adv.mean()),
               "logp_mean": float(masked_mean(s.logprobs, s.mask)),
               # the sampled tokens' mean surprisal: an unbiased estimate of the sampling entropy per token
               "entropy": float(-masked_mean(s.logprobs, s.mask)), "completion_len": float(lengths.mean()),
               "truncated_frac": float(truncated.float().mean()),
               "clip_frac": stats["clip_frac"], "ratio_mean": stats["ratio_mean"], "grad_norm": grad_norm,
               "tokens_per_s": n_tok / (time.perf_counter() - t0),
               "sample_frac_time": t_sample / (time.perf_counter() - t0)}
        if extra_stats is not None:
            row.update(extra_stats(idx))
        log.append(row)
        bar.update(1, reward=f"{row['reward_mean']:+.3f}", kl=f"{row['kl']:.4f}")
        bar.log(f"{name} step {step + 1}/{cfg.steps}: reward {row['reward_mean']:+.3f} ± {row['reward_std']:.3f}, "
                f"kl {row['kl']:.4f}, len {row['completion_len']:.1f}, {row['tokens_per_s']:.0f} tok/s")
        if row["reward_mean"] >= cfg.reward_threshold:
            stop_reason = "reward_threshold"
            break
        if cfg.patience and len(log) >= cfg.patience:  # judge a full moving-average window only
            avg = sum(r["reward_mean"] for r in log[-cfg.patience:]) / min(len(log), cfg.patience)
            if avg > best_avg + cfg.min_delta:
                best_avg, bad_steps = avg, 0
            else:
                bad_steps += 1
                if bad_steps >= cfg.patience:
                    stop_reason = "plateau"
                    break
    bar.close()
    return GRPOResult(log, stop_reason, time.perf_counter() - t_start, tokens)
