"""The GRPO loop, shared by the preference track and the adversarial cycles.

Per step: draw B prompts, sample G completions each with the KV-cache engine, score them, compute
group-relative advantages, then mu passes of the clipped token loss with a k3 KL to a frozen reference.
The old log-probs are the engine's own sampling log-probs (same temperature / top-k / top-p), so at
mu = 1 the ratio is 1 and the gradient is the plain policy gradient of the distribution that sampled."""
from __future__ import annotations

import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn

from speedrun.common import check_finite, stable_seed, write_parquet, write_text
from speedrun.config import GRPOConfig
from speedrun.engine import Samples, generate, sequence_logprobs
from speedrun.progress import Progress
from speedrun.rl.grpo import group_advantages, passk_advantages, token_loss, zero_std_fraction
from speedrun.shapes import ShapeCounter, count_shapes, round_up, width_step
from speedrun.train.distributed import Dist, all_gather_cat, all_reduce_grads, all_reduce_sum, rank_share
from speedrun.train.checkpoint import save_model
from speedrun.train.loop import autocast
from speedrun.trunk import FrozenTrunk, freeze_trunk, frozen_linears_in, frozen_trunk, require_shared_trunk

# (step, generator) -> indices of the step's prompts
DrawFn = Callable[[int, torch.Generator], torch.Tensor]
# (prompts of the step, samples) -> rewards [B * G]
RewardFn = Callable[[list[list[int]], Samples], torch.Tensor]
# (indices of a draw's prompts [n], their rewards [n * G]) -> bool [n]: the groups that train
SelectFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class GRPOResult:
    log: list[dict]
    stop_reason: str
    seconds: float
    completion_tokens: int


def grpo_train(policy: nn.Module, ref: nn.Module, prompts: list[list[int]], draw: DrawFn, reward_fn: RewardFn,
               cfg: GRPOConfig, device: str, stop_id: int | None, pad_id: int,
               extra_stats: Callable[[torch.Tensor], dict] | None = None, name: str = "grpo",
               stream: str | None = None, d: Dist | None = None, select: SelectFn | None = None) -> GRPOResult:
    """Train `policy` in place against `reward_fn`; returns the per-step log and why it stopped. The sampling and
    prompt-draw generators are keyed on (cfg.seed, stream or name, step): runs that share a stream share their
    random numbers (the arms of one training seed, so their comparison is paired). Each completion token takes
    its own uniform from the step's generator (engine.generate's uniforms), so a row's draws do not depend on the
    rows beside it. Across processes (d, under torchrun): every rank draws the step's prompts, samples and
    scores its contiguous share of them, the rewards are gathered (advantages and logs see the whole batch), the
    loss divides by the global token count and the gradients are summed: the same step as one process, up to
    float rounding. reward_fn sees this rank's share. select (one process): the groups of a step's draw that train
    (a prompt-selection arm), the draw repeated up to cfg.select_rounds times until prompts_per_step groups are kept:
    rollout()."""
    unset = [f.name for f in fields(cfg) if getattr(cfg, f.name) is None]
    if unset:
        raise ValueError(f"{name}: GRPO config fields {unset} are not set (a stage sets them with dataclasses.replace)")
    if select is not None and d is not None and d.world > 1:
        raise ValueError(f"{name}: a prompt-selection arm runs in one process (compute.nproc 1): its refill rounds "
                         "read every group's rewards before the next draw")
    d = d or Dist(0, 1, device)
    stream = stream or name
    ref.eval().requires_grad_(False)
    if cfg.frozen_blocks:
        freeze_trunk(policy, cfg.frozen_blocks, f"{name}: frozen_blocks")
        require_shared_trunk(policy, ref, cfg.frozen_blocks)
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    sample_kw = dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
    G = cfg.group_size
    log: list[dict] = []
    best_avg, bad_steps, stop_reason, tokens, t_start = -float("inf"), 0, "steps", 0, time.perf_counter()
    bar = Progress(cfg.steps, name, enabled=None if d.is_main else False)
    with count_shapes() as shapes:  # distinct attention shapes: on a GPU each new one costs a plan or a capture
        shapes.mark(-1)
        if cfg.warm_up:
            warm_up(policy, ref, prompts, cfg, device, pad_id, d)
        for step in range(cfg.steps):
            t0 = time.perf_counter()
            shapes.mark(step)
            idx, batch, s, rewards, rollouts, trains = rollout(policy, prompts, draw, reward_fn, select, cfg, device,
                                                               stop_id, pad_id, stream, step, d)
            share = rank_share(len(idx), d)
            rows = slice(share.start * G, share.stop * G)  # this rank's completions
            with torch.no_grad(), autocast(device, cfg.bf16):
                trunk = s.trunk  # the policy's and the reference's, the same weights (the rollout's, or made here)
                if trunk is None and cfg.frozen_blocks:
                    trunk = frozen_trunk(policy, batch, s.tokens, s.mask, cfg.frozen_blocks, pad_id)
                ref_logp = sequence_logprobs(ref, batch, s.tokens, mask=s.mask, pad_id=pad_id, trunk=trunk,
                                             **sample_kw)
            check_finite(float(rewards.mean()), f"{name} reward", step)
            t_sample = time.perf_counter() - t0
            adv_all = passk_advantages(rewards, G, cfg.pass_k, cfg.adv_scale) if cfg.advantage == "passk" else \
                group_advantages(rewards, G, scale=cfg.adv_scale)
            adv = adv_all[rows].to(device)
            loss_mask, per_row, n_loss = masks(s, stop_id, cfg, d)
            if not trains:  # the selection kept no group: the step samples, counts and trains nothing
                loss_mask, n_loss = loss_mask * 0, 0.0
            policy.train()
            stats, grad_norm = update(policy, opt, params, batch, s, ref_logp, adv, loss_mask, n_loss, step, cfg,
                                      device, pad_id, sample_kw, d, name, trunk)
            n_tok = int(per_row[:, 0].sum())
            tokens += n_tok
            seconds = time.perf_counter() - t0
            row = step_row(step, stats, grad_norm, rewards, adv_all, per_row, G, n_tok, seconds, t_sample, shapes)
            row.update(rollouts=rollouts, groups_trained=len(idx) if trains else 0)
            if extra_stats is not None:
                row.update(extra_stats(idx if trains else idx[:0]))
            log.append(row)
            bar.update(1, reward=f"{row['reward_mean']:+.3f}", kl=f"{row['kl']:.4f}")
            if d.is_main:
                bar.log(f"{name} step {step + 1}/{cfg.steps}: reward {row['reward_mean']:+.3f} "
                        f"± {row['reward_std']:.3f}, kl {row['kl']:.4f}, len {row['completion_len']:.1f}, "
                        f"{row['tokens_per_s']:.0f} tok/s, {row['attn_shapes']} attention shapes")
            if row["reward_mean"] >= cfg.reward_threshold:
                stop_reason = "reward_threshold"
                break
            best_avg, bad_steps = plateau(log, cfg, best_avg, bad_steps)
            if cfg.patience and bad_steps >= cfg.patience:
                stop_reason = "plateau"
                break
    bar.close()
    if d.is_main:
        print(f"{name}: {shapes.distinct} distinct attention shapes in {shapes.calls} calls, "
              f"{shapes.new_since(0) if cfg.warm_up else shapes.new_since(1)} first met "
              f"{'after the warm-up' if cfg.warm_up else 'after step 1'}", flush=True)
    return GRPOResult(log, stop_reason, time.perf_counter() - t_start, tokens)


def rollout(policy: nn.Module, prompts: list[list[int]], draw: DrawFn, reward_fn: RewardFn, select: SelectFn | None,
            cfg: GRPOConfig, device: str, stop_id: int | None, pad_id: int, stream: str, step: int, d: Dist
            ) -> tuple[torch.Tensor, list[list[int]], Samples, torch.Tensor, int, bool]:
    """A step's prompts (indices), this rank's prompts and samples, every rank's rewards, the completions generated
    and whether any group trains. Without select: one draw of prompts_per_step. With it (DAPO's dynamic sampling,
    arXiv 2503.14476): draws of prompts_per_step until that many groups are kept or cfg.select_rounds draws are
    spent; the kept groups train, the first prompts_per_step of them in draw order; none kept: the last draw's groups
    are returned and nothing trains. Round 0 takes the step's own random numbers, so an arm that keeps every group
    samples what an unselected arm samples."""
    G, B, parts, kept = cfg.group_size, cfg.prompts_per_step, [], 0
    for rnd in range(cfg.select_rounds if select is not None else 1):
        key = (step,) if rnd == 0 else (step, rnd)
        g = torch.Generator(device=device).manual_seed(stable_seed(cfg.seed, stream, *key))
        idx = draw(step, torch.Generator().manual_seed(stable_seed(cfg.seed, stream, "draw", *key)))
        share = rank_share(len(idx), d)
        batch = [prompts[i] for i in idx[share].tolist()]
        uniforms = torch.rand(len(idx) * G, cfg.max_new_tokens, generator=g, device=device)[
            share.start * G:share.stop * G]
        policy.eval()
        with torch.no_grad(), autocast(device, cfg.bf16):
            # frozen weights cast once, not per token (not under a captured decode: it keeps the weights' addresses)
            with frozen_linears_in(policy, torch.bfloat16 if cfg.bf16 and cfg.decode != "compiled" else None):
                s = generate(policy, batch, G, cfg.max_new_tokens, stop_id=stop_id, pad_id=pad_id,
                             uniforms=uniforms, decode=cfg.decode, temperature=cfg.temperature, top_k=cfg.top_k,
                             top_p=cfg.top_p)
                if cfg.frozen_blocks and select is None:  # before the reward: an RM on the same blocks shares it
                    s.trunk = frozen_trunk(policy, batch, s.tokens, s.mask, cfg.frozen_blocks, pad_id,
                                           every_token=True)
            local_rewards = reward_fn(batch, s).float().to(device)
        rewards = all_gather_cat(local_rewards, d).cpu()
        if select is None:
            return idx, batch, s, rewards, len(idx) * G, True
        keep = select(idx, rewards)
        parts.append((idx, batch, s, rewards, keep))
        kept += int(keep.sum())
        if kept >= B:
            break
    rollouts = sum(len(p[0]) for p in parts) * G
    if kept == 0:
        return (*parts[-1][:4], rollouts, False)
    return (*kept_groups(parts, G, B, pad_id), rollouts, True)


def kept_groups(parts: list[tuple], G: int, B: int, pad_id: int
                ) -> tuple[torch.Tensor, list[list[int]], Samples, torch.Tensor]:
    """The kept groups of a step's draws, at most B in draw order, as one draw: (prompt indices, prompts, samples
    padded to the longest kept completion, rewards)."""
    idx, batch, rewards, tok, msk, lp = [], [], [], [], [], []
    for p_idx, p_batch, s, r, keep in parts:
        for j in torch.nonzero(keep).flatten().tolist()[:B - len(idx)]:
            idx.append(int(p_idx[j]))
            batch.append(p_batch[j])
            sl = slice(j * G, (j + 1) * G)
            tok.append(s.tokens[sl]), msk.append(s.mask[sl]), lp.append(s.logprobs[sl]), rewards.append(r[sl])
    T = max(1, int(max(m.sum(1).max() for m in msk)))
    pad = lambda x, v: torch.nn.functional.pad(x[:, :T], (0, T - min(T, x.shape[1])), value=v)  # noqa: E731
    s = Samples(torch.cat([pad(t, pad_id) for t in tok]), torch.cat([pad(m, 0.0) for m in msk]),
                torch.cat([pad(x, 0.0) for x in lp]),
                torch.arange(len(idx), device=tok[0].device).repeat_interleave(G))
    return torch.tensor(idx, dtype=torch.long), batch, s, torch.cat(rewards)


def masks(s: Samples, stop_id: int | None, cfg: GRPOConfig, d: Dist) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The loss mask of this rank's completions, the per-completion figures of every rank's and the global count of
    loss tokens (the loss's normaliser)."""
    # a truncated completion was scored mid-sentence; masking it (TRL's mask_truncated_completions) keeps it
    # in its group's advantages but out of the gradient
    truncated = (s.mask[:, -1] > 0) & (s.tokens[:, -1] != stop_id) if stop_id is not None else \
        torch.zeros(len(s.mask), dtype=torch.bool, device=s.mask.device)
    loss_mask = s.mask * (~truncated)[:, None] if cfg.truncated == "mask" else s.mask
    # per completion: tokens, summed sampling log-probs, truncated; over all ranks
    per_row = all_gather_cat(torch.stack([s.mask.sum(1), (s.logprobs * s.mask).sum(1),
                                          truncated.float()], 1), d).cpu()
    n_loss = float(all_reduce_sum(loss_mask.sum().detach().clone(), d))
    return loss_mask, per_row, n_loss


def update(policy: nn.Module, opt: torch.optim.Optimizer, params: list[nn.Parameter], batch: list[list[int]],
           s: Samples, ref_logp: torch.Tensor, adv: torch.Tensor, loss_mask: torch.Tensor, n_loss: float, step: int,
           cfg: GRPOConfig, device: str, pad_id: int, sample_kw: dict, d: Dist,
           name: str, trunk: FrozenTrunk | None = None) -> tuple[dict, float]:
    """The step's cfg.inner_updates passes of the clipped token loss (none when every completion is masked); returns
    the last pass's stats, averaged over every rank's tokens, and its gradient norm. trunk: the frozen blocks'
    activations, shared by every pass."""
    stats, grad_norm = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "ratio_mean": 1.0}, 0.0
    for _ in range(cfg.inner_updates if n_loss > 0 else 0):
        for grp in opt.param_groups:
            grp["lr"] = cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup_steps))
        with autocast(device, cfg.bf16):
            out = sequence_logprobs(policy, batch, s.tokens, mask=s.mask, pad_id=pad_id,
                                    entropy=cfg.entropy_bonus > 0, trunk=trunk, **sample_kw)
        logp, ent = out if cfg.entropy_bonus > 0 else (out, None)
        loss, local = token_loss(logp.float(), s.logprobs, ref_logp.float(), adv, loss_mask, cfg.clip_eps,
                                 cfg.beta, normaliser=n_loss, clip_high=cfg.clip_high) if loss_mask.any() else \
            ((logp * 0).sum(), dict.fromkeys(stats, 0.0))  # a rank with no token still joins the all-reduce
        if ent is not None:  # entropy regularisation: + eta * the whole next-token distribution's entropy
            loss = loss - cfg.entropy_bonus * (ent.float() * (loss_mask > 0)).sum() / n_loss
        # each rank's stats are means over its tokens: weigh them by its token count
        n_local = float(loss_mask.sum())
        keys = ["pg_loss", "kl", "clip_frac", "ratio_mean"]
        summed = all_reduce_sum(torch.tensor([float(loss.detach())] + [local[k] * n_local for k in keys],
                                             dtype=torch.float64), d)
        stats = {"loss": float(summed[0]), **{k: float(v) / n_loss for k, v in zip(keys, summed[1:])}}
        check_finite(stats["loss"], f"{name} loss", step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        all_reduce_grads(params, d)
        grad_norm = float(nn.utils.clip_grad_norm_(params, cfg.grad_clip))
        opt.step()
    return stats, grad_norm


def step_row(step: int, stats: dict, grad_norm: float, rewards: torch.Tensor, adv_all: torch.Tensor,
             per_row: torch.Tensor, G: int, n_tok: int, seconds: float, t_sample: float,
             shapes: ShapeCounter) -> dict:
    """One step's log row: the update's stats and the whole batch's rewards and completions (per_row: tokens,
    summed sampling log-probs and truncated, per completion over all ranks)."""
    return {"step": step + 1, "loss": stats["loss"], "pg_loss": stats["pg_loss"], "kl": stats["kl"],
            "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
            "zero_std_frac": zero_std_fraction(rewards, G), "adv_mean": float(adv_all.mean()),
            "logp_mean": float(per_row[:, 1].sum()) / max(n_tok, 1),
            # the sampled tokens' mean surprisal: an unbiased estimate of the sampling entropy per token
            "entropy": -float(per_row[:, 1].sum()) / max(n_tok, 1),
            "completion_len": float(per_row[:, 0].mean()), "truncated_frac": float(per_row[:, 2].mean()),
            "clip_frac": stats["clip_frac"], "ratio_mean": stats["ratio_mean"], "grad_norm": grad_norm,
            "tokens_per_s": n_tok / seconds, "attn_shapes": shapes.distinct, "attn_shapes_new": shapes.new_since(step),
            "sample_frac_time": t_sample / seconds}


def plateau(log: list[dict], cfg: GRPOConfig, best_avg: float, bad_steps: int) -> tuple[float, int]:
    """Early stopping on the reward's moving average over cfg.patience steps, judged on full windows only: the best
    average so far and the count of steps since it last rose by more than cfg.min_delta."""
    if not cfg.patience or len(log) < cfg.patience:
        return best_avg, bad_steps
    avg = sum(r["reward_mean"] for r in log[-cfg.patience:]) / cfg.patience
    return (avg, 0) if avg > best_avg + cfg.min_delta else (best_avg, bad_steps + 1)


def warm_up(policy: nn.Module, ref: nn.Module, prompts: list[list[int]], cfg: GRPOConfig, device: str, pad_id: int,
            d: Dist) -> None:
    """Before step 0, one dummy step per prompt width the run can meet (no update, no random number drawn): the
    sampling, reference and policy forwards and the backward at every shape of the run, so that a GPU builds its
    attention plans (and, decode "compiled", captures its graphs) here and not at some later step. Completions
    run to max_new_tokens: the widest completion bucket, the one every step with a stop token reaches too."""
    step = width_step()
    if step == 1:
        return  # exact shapes: nothing bounded to warm up
    share = rank_share(cfg.prompts_per_step, d)
    B, G, T = share.stop - share.start, cfg.group_size, cfg.max_new_tokens
    sample_kw = dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
    for width in sorted({round_up(len(p), step) for p in prompts}):
        batch = [[pad_id] * (width - 1)] * B  # one column of left padding: the masked path real batches take
        with torch.no_grad(), autocast(device, cfg.bf16):
            s = generate(policy, batch, G, T, pad_id=pad_id, uniforms=torch.zeros(B * G, T, device=device),
                         decode=cfg.decode, **sample_kw)
            trunk = frozen_trunk(policy, batch, s.tokens, s.mask, cfg.frozen_blocks, pad_id) \
                if cfg.frozen_blocks else None
            sequence_logprobs(ref, batch, s.tokens, mask=s.mask, pad_id=pad_id, trunk=trunk, **sample_kw)
        with autocast(device, cfg.bf16):
            out = sequence_logprobs(policy, batch, s.tokens, mask=s.mask, pad_id=pad_id,
                                    entropy=cfg.entropy_bonus > 0, trunk=trunk, **sample_kw)
        sum(o.float().sum() for o in (out if isinstance(out, tuple) else (out,))).backward()
        policy.zero_grad(set_to_none=True)


def save_run(out_dir: Path, policy: nn.Module, meta: dict, log: "pd.DataFrame", prompts: "pd.DataFrame",  # noqa: F821
             weights: torch.Tensor, draws: torch.Tensor) -> None:
    """A prompt-GRPO run's outs: model.pt + meta.json, log.csv (the per-step log, timings left out: they differ
    between reruns), weights.parquet (each prompt's sampling weight and how often it was drawn)."""
    import pandas as pd

    save_model(out_dir, policy.state_dict(), policy.config, meta)
    write_text(out_dir / "log.csv", log.drop(columns=["tokens_per_s", "sample_frac_time"]).to_csv(
        index=False, float_format="%.6g"))
    write_parquet(out_dir / "weights.parquet", pd.DataFrame(
        {"prompt_id": prompts["prompt_id"], "group": prompts["group"], "weight": weights.numpy(),
         "draws": draws.numpy()}))


def log_means(log: "pd.DataFrame", start: dict[str, tuple[str, int]],  # noqa: F821
              end: dict[str, tuple[str, int]]) -> dict[str, float]:
    """A run's summary from its step log: {key: (column, digits)} averaged over the first (start) or the last (end)
    fifth of the steps, at least one step, rounded to digits."""
    k = max(1, len(log) // 5)
    return {**{key: round(float(log[col][:k].mean()), n) for key, (col, n) in start.items()},
            **{key: round(float(log[col][-k:].mean()), n) for key, (col, n) in end.items()}}
