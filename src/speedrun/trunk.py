"""A frozen trunk: train only a model's last blocks (task.sft.frozen_blocks, task.train.frozen_blocks).

On a 2-core CPU a 135M-parameter model's full forward and backward over a GRPO batch is most of a step; training the
last blocks cuts the backward to them (autograd skips the frozen blocks), and in GRPO the policy and its reference,
whose frozen blocks are the same weights, share the trunk's activations: one no-grad forward through the frozen blocks
per step, then each model runs only its own last blocks and the head over the completion tokens
(engine.sequence_logprobs(trunk=...)). A tied head is the token embedding: frozen with it."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn as nn
from torch import Tensor

from speedrun.engine import PrefixCache, left_pad, real_width
from speedrun.shapes import round_up, width_step
from speedrun.common import UserError


def trunk_weights(model: nn.Module, blocks: int) -> dict[str, Tensor]:
    """The weights of a frozen trunk of `blocks` blocks, by name: the token embedding (a tied head is it) and the first
    `blocks` blocks (none for 0)."""
    if blocks == 0:
        return {}
    depth = len(model.blocks)
    if not 0 < blocks < depth:
        raise ValueError(f"the model has {depth} blocks, so 0 (train all) to {depth - 1} (train the last one) can be "
                         f"frozen, not {blocks}")
    prefixes = ("wte.", *(f"blocks.{i}." for i in range(blocks)))
    return {n: w for n, w in model.named_parameters() if n.startswith(prefixes)}


def freeze_trunk(model: nn.Module, blocks: int, key: str = "frozen_blocks") -> None:
    """Freeze the token embedding (a tied head with it) and the first `blocks` blocks (0: nothing frozen)."""
    try:
        weights = trunk_weights(model, blocks)
    except ValueError as e:
        raise UserError(f"{key}={blocks}: {e}") from None
    for w in weights.values():
        w.requires_grad_(False)


@contextlib.contextmanager
def frozen_linears_in(model: nn.Module, dtype: torch.dtype | None) -> Iterator[None]:
    """Within: the frozen (requires_grad False) fp32 weights and biases of the Linear layers of model's blocks held in
    dtype, as autocast to dtype would cast them at every call: autocast caches its casts of trainable weights only, so
    a decode loop recasts every frozen block at every token (on SmolLM2 with 26 of 30 blocks frozen, about 92M
    weights a step). The same numbers, cast once; restored, bit for bit, on the way out. dtype None: nothing held."""
    held = []
    if dtype is not None:
        for module in model.blocks.modules():
            if isinstance(module, nn.Linear):
                held += [(w, w.data) for w in (module.weight, module.bias)
                         if w is not None and not w.requires_grad and w.dtype == torch.float32]
    try:
        for w, data in held:
            w.data = data.to(dtype)
        yield
    finally:
        for w, data in held:
            w.data = data


def trunk_difference(model: nn.Module, other: nn.Module, blocks: int) -> str | None:
    """The name of the first weight of model's frozen trunk that other lacks or holds otherwise (compared in model's
    dtype: a weight held in bf16 for a decode, frozen_linears_in, compares as bf16); None where the trunks are one."""
    theirs = dict(other.named_parameters())
    for name, w in trunk_weights(model, blocks).items():
        if name not in theirs or theirs[name].shape != w.shape or not torch.equal(theirs[name].to(w.dtype), w):
            return name
    return None


def require_shared_trunk(policy: nn.Module, ref: nn.Module, blocks: int) -> None:
    """Refuse to share activations between two models whose frozen trunks differ (the reference must be the
    policy's starting point)."""
    if (name := trunk_difference(policy, ref, blocks)) is not None:
        raise ValueError(f"the policy's frozen {name} differs from its reference's: the trunk cannot be shared")


@dataclass
class FrozenTrunk:
    """The residual stream after the first `blocks` blocks of a GRPO batch, laid out as engine.continuation_hidden
    runs it: each prompt once (left-padded), then its rows' completion tokens (up to the longest real completion less
    its last token) attending to it."""
    blocks: int
    prompt_ids: Tensor     # [B, P]
    prompt_mask: Tensor    # [B, P] False on the left padding
    prompt_index: Tensor   # [N] the prompt of each completion row
    tokens: Tensor         # [N, W] (with every real token: W' >= W columns)
    prompt_states: Tensor  # [B, P, C] no grad
    states: Tensor         # [N, W, C] no grad
    width: int = 0         # W: the columns log-probs need (each row's last real token has no successor to predict)
    source: nn.Module | None = None  # the model whose frozen blocks ran

    def completion_states(self, model: nn.Module, T: int) -> Tensor:
        """model's final states [N, T, C] that predict completion tokens 0 .. T-1 (0 past the trunk's columns), with
        gradients through model's blocks after the trunk."""
        last, h = self.after(model, self.width)
        h = torch.cat([last[:, None], h], 1)
        return torch.nn.functional.pad(h, (0, 0, 0, T - h.size(1)))

    @torch.no_grad()
    def token_states(self, model: nn.Module) -> Tensor:
        """model's final states [N, W', C] of every completion column the trunk holds, through model's blocks after
        the trunk: what a reward model whose frozen blocks are the trunk's reads (shares), without running them."""
        return self.after(model, self.tokens.size(1))[1]

    def after(self, model: nn.Module, width: int) -> tuple[Tensor, Tensor]:
        """model's final states through its blocks after the trunk: each row's prompt's last [N, C] and its first
        `width` completion columns [N, width, C]."""
        cache, kw = self.cache(model), dict(split=self.blocks)
        last = model.hidden(self.prompt_ids, key_mask=self.prompt_mask, kv_cache=cache, resume=self.prompt_states,
                            **kw)[:, -1].index_select(0, self.prompt_index)  # left padding: -1 is real
        if not width:
            return last, last.new_zeros(len(last), 0, last.size(-1))
        return last, model.hidden(self.tokens[:, :width], kv_cache=cache.select(self.prompt_index),
                                  resume=self.states[:, :width], **kw)

    def shares(self, model: nn.Module) -> bool:
        """Whether model's embedding and first `blocks` blocks are the trunk's (checked once per pair of models:
        frozen weights do not change)."""
        seen = model.__dict__.setdefault("_same_trunk", {})
        key = (id(self.source), self.blocks)
        if key not in seen:
            seen[key] = self.source is not None and trunk_difference(self.source, model, self.blocks) is None
        return seen[key]

    def cache(self, model: nn.Module) -> PrefixCache:
        return PrefixCache(model.config, self.prompt_ids.size(0), self.prompt_ids.size(1) + self.tokens.size(1),
                           self.tokens.device)


@torch.no_grad()
def frozen_trunk(model: nn.Module, prompts: list[list[int]], tokens: Tensor, mask: Tensor, blocks: int,
                 pad_id: int, every_token: bool = False) -> FrozenTrunk:
    """The trunk of a generate() batch: prompts [B], completion tokens and mask [N, T], each prompt's rows adjacent.
    every_token: also each row's last real token (one more column), for a reward model that shares the trunk."""
    N, T = tokens.shape
    if N % len(prompts):
        raise ValueError(f"{N} completion rows do not split evenly over {len(prompts)} prompts")
    prompt_index = torch.arange(len(prompts), device=tokens.device).repeat_interleave(N // len(prompts))
    # the states needed: up to the token before each row's last real one (a ladder width on a GPU)
    longest = int(real_width(mask > 0).max())
    W = min(T - 1, round_up(max(longest - 1, 1), width_step()))
    held = min(T, round_up(max(longest, 1), width_step())) if every_token else W
    prompt_ids, prompt_mask = left_pad(prompts, pad_id, tokens.device)
    t = FrozenTrunk(blocks, prompt_ids, prompt_mask, prompt_index, tokens[:, :held], None, None, W, model)
    cache = t.cache(model)
    t.prompt_states = model.hidden(prompt_ids, key_mask=prompt_mask, kv_cache=cache, split=blocks)
    t.states = model.hidden(t.tokens, kv_cache=cache.select(prompt_index), split=blocks) if held else \
        t.prompt_states.new_zeros(N, 0, t.prompt_states.size(-1))
    return t
