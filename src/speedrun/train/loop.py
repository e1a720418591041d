"""The training loop shared by pretrain, SFT and the reward models: AdamW, warmup then decay, gradient
clipping, periodic eval with early stopping, a resumable scratch checkpoint, DDP, a per-step log.

Batches are a pure function of the step (see data.py), so a run resumed from its scratch checkpoint
replays exactly the batches an uninterrupted run would have seen and ends with the same weights."""
from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from speedrun.common import UserError, check_finite, stable_hash
from speedrun.config import TrainConfig
from speedrun.progress import Progress
from speedrun.train.checkpoint import clear_resume, load_resume, save_resume
from speedrun.train.distributed import Dist, all_reduce_sum

# (step, rank, world) -> this rank's micro-batches [(inputs, targets)], targets -1 where ignored
BatchFn = Callable[[int, int, int], list[tuple[torch.Tensor, torch.Tensor]]]
EvalFn = Callable[[nn.Module], dict[str, float]]
LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]  # summed loss over target tokens


@dataclass
class TrainResult:
    best_state: dict[str, torch.Tensor]
    best_eval: dict[str, float]
    steps_done: int
    stopped_early: bool
    tokens: int  # target tokens trained on
    train_seconds: float  # of this process's steps (a resumed run: the resumed part)
    timed_tokens: int  # target tokens of those steps: throughput = timed_tokens / train_seconds
    log: list[dict] = field(default_factory=list)  # per-step train rows
    evals: list[dict] = field(default_factory=list)  # per-eval rows

    @property
    def best_step(self) -> int:
        """The step whose weights best_state holds (0: the model as it came): a checkpoint's "step"."""
        return int(self.best_eval.get("step", 0))


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (1.0 - (1.0 - cfg.final_lr_frac) * min(1.0, progress))


class Optimizers:
    """Several optimizers stepped as one (Muon on some parameters, AdamW on the others): the loop sets lr on
    param_groups, steps, zeroes and checkpoints them together."""

    def __init__(self, *optimizers: torch.optim.Optimizer):
        self.optimizers = optimizers
        self.param_groups = [g for o in optimizers for g in o.param_groups]

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        for o, s in zip(self.optimizers, state["optimizers"], strict=True):
            o.load_state_dict(s)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer | Optimizers:
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if cfg.optimizer not in ("adamw", "muon"):
        raise ValueError(f"optimizer must be adamw or muon, not {cfg.optimizer!r}")
    # Muon orthogonalises each update of a hidden matrix; embeddings, the LM/reward heads and vectors stay on AdamW
    is_matrix = lambda n, p: cfg.optimizer == "muon" and p.dim() == 2 and ".blocks." in f".{n}"  # noqa: E731
    matrices = [p for n, p in named if is_matrix(n, p)]
    decay = [p for n, p in named if p.dim() >= 2 and not is_matrix(n, p)]
    rest = [p for n, p in named if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}]
    if rest:
        groups.append({"params": rest, "weight_decay": 0.0})
    adamw = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, fused=False)
    if not matrices:
        return adamw
    # match_rms_adamw scales Muon's step to AdamW's update size, so one lr (and schedule) serves both
    muon = torch.optim.Muon(matrices, lr=cfg.lr, weight_decay=cfg.weight_decay, adjust_lr_fn="match_rms_adamw")
    return Optimizers(muon, adamw)


def lm_loss_sum(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model(x, y, reduction="sum")


def autocast(device: str, bf16: bool) -> contextlib.AbstractContextManager:
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device_type="cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16)


def compile_deterministic(model: nn.Module) -> nn.Module:
    """torch.compile with deterministic kernels: by default inductor accumulates some gradients with atomics on
    CPU (the embedding's backward), so two runs differ in the last bits; this keeps reruns byte-identical."""
    torch.use_deterministic_algorithms(True)
    torch._inductor.config.deterministic = True
    return torch.compile(model)


def train_step(model: nn.Module, step_model: nn.Module, ddp_model: nn.Module, optimizer: torch.optim.Optimizer,
               cfg: TrainConfig, batch_fn: BatchFn, loss_fn: LossFn, step: int, d: Dist,
               name: str) -> tuple[float, float, int]:
    """One optimizer step over this rank's micro-batches; returns the loss (over all ranks), the gradient norm and
    the global count of target tokens."""
    for g in optimizer.param_groups:
        g["lr"] = lr_at(step, cfg)
    micro = batch_fn(step, d.rank, d.world)
    # normalise by the global count of target tokens: exact same gradient for any world size / split
    n_local = sum(int((y != -1).sum()) for _, y in micro)
    n_global = int(all_reduce_sum(torch.tensor(n_local, dtype=torch.long), d))
    if n_global == 0:  # every row cut before its first target: no loss to take a step on
        raise UserError(f"{name} step {step}: no target token in the batch (its rows end at the length cut before "
                        f"their first target): raise the stage's max_len")
    loss_total = 0.0
    for i, (x, y) in enumerate(micro):
        x, y = x.to(d.device), y.to(d.device)
        sync = i == len(micro) - 1 or d.world == 1
        ctx = contextlib.nullcontext() if sync else ddp_model.no_sync()
        with ctx, autocast(d.device, cfg.bf16):
            loss = loss_fn(step_model, x, y) * (d.world / n_global)  # DDP averages grads over ranks
        loss.backward()
        loss_total += float(loss.detach()) / d.world
    loss_value = float(all_reduce_sum(torch.tensor(loss_total), d))
    check_finite(loss_value, f"{name} loss", step)
    grad_norm = float(nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_value, grad_norm, n_global


def train(model: nn.Module, cfg: TrainConfig, batch_fn: BatchFn, eval_fn: EvalFn, d: Dist,
          scratch: Path | None = None, fingerprint: str = "", loss_fn: LossFn = lm_loss_sum,
          log_every: int = 10, name: str = "train") -> TrainResult:
    """Train in place; returns the best-by-eval weights. Raises on a NaN/inf loss."""
    fingerprint = stable_hash(fingerprint, cfg, d.world)
    optimizer = make_optimizer(model, cfg)
    ddp_model = DDP(model) if d.world > 1 else model
    step_model = compile_deterministic(ddp_model) if cfg.compile else ddp_model  # the eval runs the plain module
    start, log, evals, best, best_seen, best_state, bad_evals, tokens = 0, [], [], math.inf, math.inf, None, 0, 0
    best_step, written = None, None  # the step of best_state; the best step whose weights scratch holds apart
    resume_path = Path(scratch) / "resume.pt" if scratch else None
    state = load_resume(resume_path, fingerprint) if resume_path else None
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, log, evals, best, best_seen, bad_evals, tokens = (
            state["step"], state["log"], state["evals"], state["best"], state["best_seen"], state["bad_evals"],
            state["tokens"])
        best_state, best_step = state["best_state"], state["best_step"]
        written = best_step if best_step not in (None, start) else None
        if d.is_main:
            print(f"{name}: resumed from {resume_path} at step {start}")

    def run_eval(step: int) -> bool:
        nonlocal best, best_seen, best_state, best_step, bad_evals
        model.eval()
        with torch.no_grad(), autocast(d.device, cfg.bf16):
            metrics = eval_fn(model)
        model.train()
        evals.append({"step": step, **metrics})
        value = metrics[cfg.monitor]
        check_finite(value, cfg.monitor, step)
        if d.is_main:
            bar.log(f"{name} step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        # min_delta decides patience only; the best checkpoint is the lowest loss of the trained ones (step 0,
        # the untrained model, is the curve's start: e.g. an RM's zero head, which scores everything the same)
        bad_evals = 0 if value < best_seen - cfg.min_delta else bad_evals + 1
        best_seen = min(best_seen, value)
        if step > 0 and value < best:
            best, best_state, best_step = value, copy.deepcopy(model.state_dict()), step
        return cfg.patience > 0 and bad_evals >= cfg.patience

    model.train()
    stopped, train_seconds, step, start_tokens = False, 0.0, start, tokens
    bar = Progress(cfg.steps, name, initial=start, enabled=None if d.is_main else False)
    if start == 0:
        stopped = run_eval(0)
    while step < cfg.steps and not stopped:
        t0 = time.perf_counter()
        loss_value, grad_norm, n_global = train_step(model, step_model, ddp_model, optimizer, cfg, batch_fn, loss_fn,
                                                     step, d, name)
        dt = time.perf_counter() - t0
        train_seconds += dt
        tokens += n_global
        step += 1
        log.append({"step": step, "loss": loss_value, "lr": lr_at(step - 1, cfg), "grad_norm": grad_norm,
                    "tokens_per_s": n_global / dt})
        bar.update(1, loss=f"{loss_value:.4f}")
        if d.is_main and (step % log_every == 0 or step == cfg.steps):
            bar.log(f"{name} step {step}/{cfg.steps}: loss {loss_value:.4f}, {n_global / dt:,.0f} tok/s")
        if step % cfg.eval_every == 0 or step == cfg.steps:
            stopped = run_eval(step)
        if resume_path and cfg.save_every and step % cfg.save_every == 0 and step < cfg.steps and d.is_main:
            written = save_resume(resume_path, {"fingerprint": fingerprint, "model": model.state_dict(),
                                                "optimizer": optimizer.state_dict(), "step": step, "log": log,
                                                "evals": evals, "best": best, "best_seen": best_seen,
                                                "bad_evals": bad_evals, "tokens": tokens},
                                  best_state, best_step, written)
    bar.close()
    if resume_path and d.is_main:
        clear_resume(resume_path)
    trained = [e for e in evals if e["step"] > 0]
    if not trained:  # no step taken (steps 0): the model as it came
        return TrainResult(copy.deepcopy(model.state_dict()), evals[0] if evals else {}, step, stopped, tokens,
                           train_seconds, tokens - start_tokens, log, evals)
    best_eval = next(e for e in trained if e[cfg.monitor] == best)
    return TrainResult(best_state, best_eval, step, stopped, tokens, train_seconds, tokens - start_tokens, log, evals)
