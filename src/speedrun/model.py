"""The GPT: nanochat-style decoder with rotary positions, QK-norm, parameter-free RMSNorm, relu^2 MLP,
no biases, untied embedding / lm head and a tanh logit softcap.

One forward serves three callers:
  training          model(idx, targets)                       causal, no padding, positions 0..T-1
  padded batches    model(idx, key_mask=...)                  left padding: pads are never attended to and
                                                              real tokens get positions 0, 1, ... per row
  KV-cache decode   model(idx, kv_cache=cache, key_mask=...)  keys/values appended to a preallocated cache
Dtypes follow the inputs, so bf16 autocast on CUDA works; logits are always returned in fp32.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from speedrun.kernels import fused_decode_attention
from speedrun.shapes import record, round_up, width_step


@dataclass
class GPTConfig:
    vocab_size: int
    depth: int = 4
    n_embd: int = 0  # 0 -> 64 * depth
    head_dim: int = 64
    seq_len: int = 256  # max training context; rotary angles are computed per position, so decoding may go past it
    softcap: float = 15.0

    def __post_init__(self) -> None:
        if self.n_embd == 0:
            self.n_embd = 64 * self.depth
        if self.n_embd % self.head_dim:
            raise ValueError(f"n_embd={self.n_embd} is not a multiple of head_dim={self.head_dim}")

    @property
    def n_head(self) -> int:
        return self.n_embd // self.head_dim

    @property
    def n_kv_head(self) -> int:
        return self.n_head  # every query head has its own keys and values (the KV cache's width)


def norm(x: Tensor) -> Tensor:
    return F.rms_norm(x, (x.size(-1),))  # parameter-free RMSNorm


def rotary(positions: Tensor, head_dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos/sin tables [B or 1, 1, T, head_dim/2] for integer positions [B or 1, T]."""
    inv_freq = base ** -(torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions.float()[..., None] * inv_freq
    return angles.cos()[:, None], angles.sin()[:, None]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    d = x.size(-1) // 2
    x1, x2 = x[..., :d], x[..., d:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # keep autocast's bf16 instead of promoting to fp32
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)


class KVCache:
    """Preallocated keys/values for every layer: [L, B, H, max_len, D], written in place as tokens arrive.

    All rows advance together (`pos` is shared); rows of different prompt lengths are left-padded, and
    `valid` marks which cached positions hold real tokens, `lengths` how many each row has (its next position).
    """

    def __init__(self, config: GPTConfig, batch: int, max_len: int, device: torch.device | str = "cpu"):
        self.config, self.batch, self.max_len = config, batch, max_len
        self.k: Tensor | None = None  # allocated at the first write, in the dtype the model computes in
        self.v: Tensor | None = None
        self.valid = torch.zeros(batch, max_len, dtype=torch.bool, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.pos = 0
        self.padded = False  # any invalid position so far: attention then needs an explicit mask
        # after expand: row b's first `shared` columns equal row source[b]'s (its prompt's first kept copy), so a
        # decode's attention can read one copy a prompt (speedrun.kernels); None: every row holds its own
        self.source: Tensor | None = None
        self.shared = 0

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write this step's k, v [B, H, T, D] for `layer`; return all keys/values so far."""
        T = k.size(2)
        self.check_room(T)
        if self.k is None:
            c = self.config
            shape = (c.depth, self.batch, c.n_kv_head, self.max_len, c.head_dim)
            self.k = torch.zeros(shape, dtype=k.dtype, device=k.device)
            self.v = torch.zeros(shape, dtype=v.dtype, device=v.device)
        self.k[layer, :, :, self.pos:self.pos + T] = k
        self.v[layer, :, :, self.pos:self.pos + T] = v
        S = self.key_width(T)
        return self.k[layer, :, :, :S], self.v[layer, :, :, :S]

    def check_room(self, T: int) -> None:
        """Raise unless T more tokens fit."""
        if self.pos + T > self.max_len:
            raise ValueError(f"KV cache overflow: {self.pos} + {T} tokens > max_len {self.max_len}")

    def advance(self, key_mask: Tensor) -> None:
        """After a forward wrote its T tokens [B, T] into every layer: the next write goes past them."""
        self.pos += key_mask.size(1)
        self.lengths += key_mask.sum(1)

    def key_width(self, T: int) -> int:
        """Keys an attention over the next T tokens reads: the filled ones, rounded up to the width step (the
        columns past them are masked), so a growing cache presents a new key width every step-th token only."""
        return min(self.max_len, round_up(self.pos + T, width_step()))

    def expand(self, n: int, max_len: int) -> KVCache:
        """A new cache with every row repeated n times (a row's copies adjacent) and room for max_len tokens."""
        new = KVCache(self.config, self.batch * n, max_len, self.valid.device)
        new.pos, new.padded, new.shared = self.pos, self.padded, self.pos
        new.source = torch.arange(self.batch * n, device=self.valid.device) // n * n
        new.valid[:, :self.pos] = self.valid[:, :self.pos].repeat_interleave(n, 0)
        new.lengths = self.lengths.repeat_interleave(n, 0)
        if self.k is not None:  # each row's n copies written straight into the new cache (no zero fill, no temporary)
            L, B, H, _, D = self.k.shape
            new.k, new.v = self.k.new_empty((L, B * n, H, max_len, D)), self.v.new_empty((L, B * n, H, max_len, D))
            for src, dst in ((self.k, new.k), (self.v, new.v)):
                rows = dst.view(L, B, n, H, max_len, D)
                rows[..., :self.pos, :].copy_(src[:, :, None, :, :self.pos])
                rows[..., self.pos:, :].zero_()
        return new

    def keep_rows(self, rows: Tensor) -> None:
        """Drop every row not in `rows` (finished samples), so decoding stops spending compute on them."""
        self.batch = rows.numel()
        self.valid, self.lengths = self.valid[rows], self.lengths[rows]
        if self.source is not None:  # each kept row's source: the first kept row of its prompt (rows ascend, and so
            source = self.source[rows]  # do a prompt's copies and their sources)
            self.source = torch.searchsorted(source, source)
        if self.k is not None:
            self.k, self.v = self.k[:, rows], self.v[:, rows]


def attention_inputs(idx: Tensor, key_mask: Tensor | None, positions: Tensor | None, kv_cache: KVCache | None,
                     padded: bool | None) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(positions [B or 1, T], attention mask [B, 1, T, S] or None for plain causal, key_mask) of a forward over idx
    [B, T], for every model of the lab (GPT, Llama). key_mask [B, T] bool: False marks padding (never attended to;
    real tokens are numbered 0, 1, ... per row unless `positions` [B, T] is given). With kv_cache the tokens are
    appended to the cache (the caller advances it after its blocks ran). padded (no cache): whether key_mask has a
    False entry, where the caller knows; None checks (a device sync, and a graph break under torch.compile)."""
    B, T = idx.shape
    offset = 0 if kv_cache is None else kv_cache.pos
    if kv_cache is not None:
        if key_mask is None:
            key_mask = torch.ones(B, T, dtype=torch.bool, device=idx.device)
        elif not kv_cache.padded:
            kv_cache.padded = not bool(key_mask.all())  # (checked only when given: no sync per decode step)
        if positions is None:
            positions = kv_cache.lengths[:, None] + (key_mask.long().cumsum(1) - 1).clamp(min=0)
        kv_cache.valid[:, offset:offset + T] = key_mask
        padded = kv_cache.padded
    else:
        padded = key_mask is not None and (padded or padded is None and not bool(key_mask.all()))
        if positions is None:
            positions = ((key_mask.long().cumsum(1) - 1).clamp(min=0) if padded
                         else torch.arange(T, device=idx.device)[None])
    mask = None
    S = offset + T if kv_cache is None else kv_cache.key_width(T)
    if padded or (kv_cache is not None and ((offset > 0 and T > 1) or S > offset + T)):
        valid = kv_cache.valid[:, :S] if kv_cache is not None else key_mask
        q_pos = torch.arange(offset, offset + T, device=idx.device)[:, None]
        k_pos = torch.arange(S, device=idx.device)[None]
        mask = (k_pos <= q_pos)[None] & valid[:, None, :]
        mask = (mask | (k_pos == q_pos)[None])[:, None]  # a pad query sees itself: no all-masked row, no NaN
    return positions, mask, key_mask


def one_query_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, source: Tensor | None = None,
                        shared: int = 0) -> Tensor:
    """Attention of one query per row, q [B, H, 1, D], over keys and values k, v [B, Hkv, S, D] (H a multiple of Hkv:
    grouped-query), mask [B, 1, 1, S] bool (True: attended) or None: [B, H, 1, D]. On a CPU the compiled kernel
    (speedrun.kernels: one pass over the cache, fp32 inside; a prompt's keys read once where source and shared say
    which rows hold copies: KVCache.source), else batched_attention. Why not SDPA: on a CPU its kernel is tiled for
    long queries and took about 1 ms a call at a 64-row decode of SmolLM2 (30 calls a token)."""
    B, H, _, D = q.shape
    Hkv = k.size(1)
    valid = mask.reshape(B, -1) if mask is not None else torch.ones(B, k.size(2), dtype=torch.bool, device=k.device)
    y = fused_decode_attention(q.reshape(B, Hkv, H // Hkv, D), k, v, valid, source, shared)
    return batched_attention(q, k, v, mask) if y is None else y.reshape(B, H, 1, D)


def batched_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """one_query_attention as two batched matmuls with a key/value head's query heads side by side (no copy of the
    cache per query head), the softmax in fp32."""
    B, H, _, D = q.shape
    Hkv = k.size(1)
    scores = (q.reshape(B, Hkv, H // Hkv, D) @ k.transpose(-1, -2)).float() * D ** -0.5  # [B, Hkv, G, S]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1).to(v.dtype) @ v).reshape(B, H, 1, D)


def trunk_blocks(blocks: nn.ModuleList, split: int | None, resume: Tensor | None) -> nn.ModuleList:
    """The blocks a hidden() call runs: all; the first `split` (the frozen trunk); or, resuming from the trunk's
    residual, the ones after it."""
    if split is None:
        if resume is not None:
            raise ValueError("resume needs split: the number of blocks the resumed residual has been through")
        return blocks
    if not 0 < split < len(blocks):
        raise ValueError(f"split {split}: a frozen trunk is 1 to {len(blocks) - 1} of the model's {len(blocks)} blocks")
    return blocks[split:] if resume is not None else blocks[:split]


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.layer, self.n_head, self.head_dim = layer, config.n_head, config.head_dim
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)  # fused q, k, v: one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def project(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v [B, H, T, D] of x [B, T, C]: rotary positions, then QK-norm."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        return norm(apply_rotary(q, cos, sin)), norm(apply_rotary(k, cos, sin)), v

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, kv_cache: KVCache | None) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.project(x, cos, sin)
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer, k, v)
        if self.layer == 0:
            record("attention", B, T, k.size(2), mask is not None)
        if mask is None:  # no padding: plain causal (a 1-token query may see every cached key)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.c_fc(x))
        return self.c_proj(h * h)  # relu^2 (a plain product backprops faster on CPU than square/pow)


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.attn = CausalSelfAttention(config, layer)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, kv_cache: KVCache | None) -> Tensor:
        x = x + self.attn(norm(x), cos, sin, mask, kv_cache)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.depth))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        # nanochat init: unit-variance embedding, uniform in-projections with std 1/sqrt(C), zero out-projections
        # (every block starts as the identity) and a tiny lm head (near-uniform first predictions)
        nn.init.normal_(self.wte.weight, std=1.0)
        nn.init.normal_(self.lm_head.weight, std=0.001)
        bound = 3**0.5 * self.config.n_embd**-0.5
        for block in self.blocks:
            nn.init.uniform_(block.attn.c_attn.weight, -bound, bound)
            nn.init.uniform_(block.mlp.c_fc.weight, -bound, bound)
            nn.init.zeros_(block.attn.c_proj.weight)
            nn.init.zeros_(block.mlp.c_proj.weight)

    def hidden(self, idx: Tensor, *, key_mask: Tensor | None = None, positions: Tensor | None = None,
               kv_cache: KVCache | None = None, padded: bool | None = None, split: int | None = None,
               resume: Tensor | None = None) -> Tensor:
        """Final normed hidden states [B, T, C] (the arguments: attention_inputs). split=k (no cache), a frozen
        trunk's two halves (engine.FrozenTrunk): without resume the residual stream after the first k blocks, not
        normed; with resume= that residual, the states the blocks after it give."""
        positions, mask, key_mask = attention_inputs(idx, key_mask, positions, kv_cache, padded)
        cos, sin = rotary(positions, self.config.head_dim)
        x = norm(self.wte(idx)) if resume is None else resume
        for block in trunk_blocks(self.blocks, split, resume):
            x = block(x, cos, sin, mask, kv_cache)
        if kv_cache is not None:
            kv_cache.advance(key_mask)
        return x if split is not None and resume is None else norm(x)

    def decode_step(self, token: Tensor, k: Tensor, v: Tensor, valid: Tensor, lengths: Tensor
                    ) -> tuple[Tensor, Tensor, Tensor]:
        """One decode step with static shapes, for capture (torch.compile, CUDA graphs): token [N] follows the
        cached keys/values k, v [L, N, H, S, D] (valid [N, S]: the columns holding real tokens; lengths [N]: each
        row's position). Returns (logits [N, V], the token's keys and values [L, N, H, 1, D]); it writes nothing,
        so the caller stores them (a captured step mutates none of its inputs). Same math as hidden() + logits(),
        with the attention written out: one query against S keys plus itself."""
        N = token.size(0)
        cos, sin = rotary(lengths[:, None], self.config.head_dim)
        bias = torch.zeros(valid.shape, device=valid.device).masked_fill(~valid, float("-inf"))[:, None, None, :]
        scale = self.config.head_dim ** -0.5
        x = norm(self.wte(token[:, None]))
        new_k, new_v = [], []
        for layer, block in enumerate(self.blocks):
            q, k1, v1 = block.attn.project(norm(x), cos, sin)  # [N, H, 1, D]
            new_k.append(k1)
            new_v.append(v1)
            scores = torch.cat([(q @ k[layer].transpose(-1, -2).to(q.dtype)).float() * scale + bias,
                                (q * k1).sum(-1, keepdim=True).float() * scale], -1).softmax(-1)
            y = scores[..., :-1].to(q.dtype) @ v[layer].to(q.dtype) + scores[..., -1:].to(q.dtype) * v1
            x = x + block.attn.c_proj(y.transpose(1, 2).reshape(N, 1, -1))
            x = x + block.mlp(norm(x))
        return self.logits(norm(x)[:, -1]), torch.stack(new_k), torch.stack(new_v)

    def logits(self, hidden: Tensor) -> Tensor:
        """lm head + tanh softcap, in fp32: [..., V]."""
        logits = self.lm_head(hidden).float()
        return self.config.softcap * torch.tanh(logits / self.config.softcap)

    def forward(self, idx: Tensor, targets: Tensor | None = None, ignore_index: int = -1, reduction: str = "mean",
                *, key_mask: Tensor | None = None, positions: Tensor | None = None,
                kv_cache: KVCache | None = None) -> Tensor:
        """logits [B, T, V] if targets is None, else the cross-entropy (mean over non-ignored tokens, or [B, T])."""
        hidden = self.hidden(idx, key_mask=key_mask, positions=positions, kv_cache=kv_cache)
        if targets is None:
            return self.logits(hidden)
        keep = targets != ignore_index
        if bool(keep.all()):
            loss = F.cross_entropy(self.logits(hidden).flatten(0, -2), targets.reshape(-1), reduction=reduction)
            return loss.view(targets.shape) if reduction == "none" else loss
        # logits only where a target is kept (SFT: the assistant's tokens, about half): the lm head and the
        # softmax over the vocabulary are a quarter of the model's work per token
        picked = F.cross_entropy(self.logits(hidden[keep]), targets[keep], reduction="none")
        if reduction == "none":
            return torch.zeros(targets.shape, dtype=picked.dtype, device=picked.device).masked_scatter(keep, picked)
        return picked.sum() if reduction == "sum" else picked.mean()

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def estimate_flops(self) -> float:
        """Training FLOPs per token (nanochat convention): 6 x non-embedding params (lm head included)
        plus 12 L H D T for the attention scores and values."""
        c = self.config
        matmul_params = self.num_params() - self.wte.weight.numel()
        return float(6 * matmul_params + 12 * c.depth * c.n_head * c.head_dim * c.seq_len)
