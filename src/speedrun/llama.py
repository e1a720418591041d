"""A Llama-family decoder (SmolLM2, Llama 2/3, Qwen2, Qwen3): RMSNorm with weights, grouped-query attention,
SwiGLU, rotary positions with the checkpoint's theta, tied or untied embeddings; Qwen2's biased query, key and value
projections, Qwen3's per-head query and key norms and its head width apart from width / heads.

It keeps the GPT's interface (speedrun.model): hidden() over training, padded and KV-cache batches through the same
attention_inputs, logits() in fp32, decode_step() for the engine's captured decode, so the engine's sampling and
sequence log-probs take either model. Weights come from a checkpoint (speedrun.pretrained), not from pretraining.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from speedrun.kernels import fused_add_rms_norm, fused_llama_blocks, fused_rms_norm, fused_rotary_cache, fused_silu_mul
from speedrun.model import GPT, KVCache, apply_rotary, attention_inputs, one_query_attention, rotary, trunk_blocks
from speedrun.packed import fused, packed_weight
from speedrun.shapes import record


@dataclass
class LlamaConfig:
    vocab_size: int
    depth: int
    n_embd: int
    n_head: int
    n_kv_head: int
    ffn_hidden: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tied: bool = True  # the lm head is the token embedding
    seq_len: int = 2048  # the context the checkpoint was trained on (rotary angles go past it)
    qkv_bias: bool = False  # Qwen2: biased query, key and value projections
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head's query and key, before rotary
    head_size: int = 0  # a head's width where the checkpoint sets it (Qwen3); 0: n_embd / n_head

    def __post_init__(self) -> None:
        if (not self.head_size and self.n_embd % self.n_head) or self.n_head % self.n_kv_head:
            raise ValueError(f"width {self.n_embd}, {self.n_head} query heads and {self.n_kv_head} key/value heads "
                             "do not divide: a Llama needs width = heads x head_dim and heads = groups x kv heads")

    @property
    def head_dim(self) -> int:
        return self.head_size or self.n_embd // self.n_head


def hf_rotary(positions: Tensor, config: LlamaConfig, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos, sin tables (speedrun.model.rotary) for rotary as Llama checkpoints expect it (first half rotated towards
    the second: the GPT's turn reversed, so sin negated), in dtype (the projections' own): made once per forward, not
    cast and negated in each of the 30 blocks."""
    cos, sin = rotary(positions, config.head_dim, config.rope_theta)
    return cos.to(dtype), (-sin).to(dtype)


def compute_dtype(model: nn.Module, device: torch.device) -> torch.dtype:
    """The dtype a Linear of model returns here: autocast's where it is on, else the weights'."""
    return torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else \
        model.wte.weight.dtype


class Attention(nn.Module):
    FUSE = {"packed_qkv": ("q", "k", "v")}  # one product when packed (speedrun.packed)

    def __init__(self, config: LlamaConfig, layer: int):
        super().__init__()
        c = config
        self.layer, self.n_head, self.n_kv_head, self.head_dim = layer, c.n_head, c.n_kv_head, c.head_dim
        self.q = nn.Linear(c.n_embd, c.n_head * c.head_dim, bias=c.qkv_bias)
        self.k = nn.Linear(c.n_embd, c.n_kv_head * c.head_dim, bias=c.qkv_bias)
        self.v = nn.Linear(c.n_embd, c.n_kv_head * c.head_dim, bias=c.qkv_bias)
        self.o = nn.Linear(c.n_head * c.head_dim, c.n_embd, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.norm_eps) if c.qk_norm else None

    def products(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The query, key and value products of x [B, T, C] (one packed product where packed): [B, T, heads x D]."""
        return fused(self, "packed_qkv", x) or (self.q(x), self.k(x), self.v(x))

    def rotate(self, q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q [B, H, T, D] and k, v [B, Hkv, T, D] of products()'s outputs, rotary applied (after Qwen3's head
        norms); cos, sin: hf_rotary's tables."""
        B, T, _ = q.shape
        q = q.view(B, T, self.n_head, self.head_dim)
        k = k.view(B, T, self.n_kv_head, self.head_dim)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        qk = apply_rotary(torch.cat([q, k], 2).transpose(1, 2), cos, sin)  # one turn for both: half the small ops
        return *qk.split([self.n_head, self.n_kv_head], 1), v

    def project(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """rotate(products(x)): q [B, H, T, D] and k, v [B, Hkv, T, D] of x [B, T, C]."""
        return self.rotate(*self.products(x), cos, sin)

    def decode(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, kv_cache: KVCache) -> Tensor:
        """The attention output of one token per row x [B, 1, C] over the cache, its keys and values written into it:
        on a CPU the rotary and the write in one pass (speedrun.kernels), else rotate() and the cache's update, on
        the same products. Qwen3's head norms sit between the products and the rotary: the kernel has none."""
        B = x.size(0)
        q, k, v = self.products(x)
        kv_cache.check_room(1)
        rotated = None if self.q_norm is not None else \
            fused_rotary_cache(q, k, v, cos, sin, kv_cache.k[self.layer], kv_cache.v[self.layer], kv_cache.pos)
        if rotated is None:
            q, k, v = self.rotate(q, k, v, cos, sin)
            kv_cache.update(self.layer, k, v)
        else:
            q = rotated
        if self.layer == 0:
            record("attention", B, 1, kv_cache.key_width(1), mask is not None)
        # over the cache's whole width (unwritten columns are not valid): a view cut at the keys so far is not
        # contiguous per row, and a bf16 batched matmul copies it first (3.7x slower at 64 rows of SmolLM2)
        k, v, valid = kv_cache.k[self.layer], kv_cache.v[self.layer], kv_cache.valid[:, None, None]
        y = one_query_attention(q.view(B, self.n_head, 1, -1), k, v, valid, kv_cache.source, kv_cache.shared)
        return self.o(y.reshape(B, 1, -1))

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, kv_cache: KVCache | None) -> Tensor:
        B, T, _ = x.shape
        if T == 1 and type(kv_cache) is KVCache and kv_cache.k is not None:  # a decode step (a PrefixCache
            return self.decode(x, cos, sin, mask, kv_cache)  # concatenates: SDPA below)
        q, k, v = self.project(x, cos, sin)
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer, k, v)
        if self.layer == 0:
            record("attention", B, T, k.size(2), mask is not None)
        groups = self.n_head // self.n_kv_head  # each key/value head serves this many query heads
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o(y.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    FUSE = {"packed_gate_up": ("gate", "up")}

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate = nn.Linear(config.n_embd, config.ffn_hidden, bias=False)
        self.up = nn.Linear(config.n_embd, config.ffn_hidden, bias=False)
        self.down = nn.Linear(config.ffn_hidden, config.n_embd, bias=False)

    def forward(self, x: Tensor, decoding: bool = False) -> Tensor:
        gate, up = fused(self, "packed_gate_up", x) or (self.gate(x), self.up(x))
        h = fused_silu_mul(gate, up) if decoding else None  # a decode step: one pass (speedrun.kernels)
        return self.down(F.silu(gate) * up if h is None else h)


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(width)), eps

    def forward(self, x: Tensor, decoding: bool = False, dtype: torch.dtype | None = None) -> Tensor:
        """x normed; decoding: in one pass (speedrun.kernels), in dtype where given (the next product's)."""
        y = fused_rms_norm(x, self.weight, self.eps, dtype) if decoding else None
        return F.rms_norm(x, (x.size(-1),), self.weight.to(x.dtype), self.eps) if y is None else y

    def after_add(self, x: Tensor, r: Tensor, decoding: bool = False, dtype: torch.dtype | None = None
                  ) -> tuple[Tensor, Tensor]:
        """(x + r, it normed): the residual add and this norm, in one pass where decoding."""
        both = fused_add_rms_norm(x, r, self.weight, self.eps, dtype) if decoding else None
        if both is not None:
            return both
        x = x + r
        return x, self.forward(x, decoding, dtype)


class LlamaBlock(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(config.n_embd, config.norm_eps), Attention(config, layer)
        self.mlp_norm, self.mlp = RMSNorm(config.n_embd, config.norm_eps), SwiGLU(config)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, kv_cache: KVCache | None) -> Tensor:
        decoding = x.size(1) == 1 and type(kv_cache) is KVCache  # the fused CPU kernels where they apply
        # a decode's norms write autocast's dtype: its products would cast them there anyway
        dtype = torch.get_autocast_dtype(x.device.type) if decoding and torch.is_autocast_enabled(x.device.type) \
            else None
        x, h = self.mlp_norm.after_add(x, self.attn(self.attn_norm(x, decoding, dtype), cos, sin, mask, kv_cache),
                                       decoding, dtype)
        return x + self.mlp(h, decoding)


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(LlamaBlock(config, i) for i in range(config.depth))
        self.norm_f = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tied:
            self.lm_head.weight = self.wte.weight
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """A random model (tests write it as a checkpoint); real weights come from speedrun.pretrained."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def hidden(self, idx: Tensor, *, key_mask: Tensor | None = None, positions: Tensor | None = None,
               kv_cache: KVCache | None = None, padded: bool | None = None, split: int | None = None,
               resume: Tensor | None = None) -> Tensor:
        """Final normed hidden states [B, T, C] (the arguments: speedrun.model.attention_inputs; split and resume:
        GPT.hidden's)."""
        positions, mask, key_mask = attention_inputs(idx, key_mask, positions, kv_cache, padded)
        cos, sin = hf_rotary(positions, self.config, compute_dtype(self, idx.device))
        x = self.wte(idx) if resume is None else resume
        fused = self.fused_decode(x, cos, sin, mask, kv_cache) if split is None and resume is None else None
        if fused is not None:
            x = fused
        else:
            for block in trunk_blocks(self.blocks, split, resume):
                x = block(x, cos, sin, mask, kv_cache)
        if kv_cache is not None:
            kv_cache.advance(key_mask)
        return x if split is not None and resume is None else self.norm_f(x)

    def fused_decode(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, kv_cache: KVCache | None
                     ) -> Tensor | None:
        """x [B, 1, C] through the blocks at a decode step in one call into the CPU kernels (speedrun.kernels'
        fused_llama_blocks): the kernels and packed products LlamaBlock's decode runs, in its order (the same bits),
        without Python between them. None where it does not apply: not a decode step, products not packed or
        with biases (speedrun.packed; Qwen2), Qwen3's head norms, no autocast, or the kernels do not apply."""
        if x.size(1) != 1 or type(kv_cache) is not KVCache or kv_cache.k is None or self.config.qk_norm or \
                not torch.is_autocast_enabled(x.device.type):
            return None
        weights = []
        for block in self.blocks:
            products = [packed_weight(block.attn, "packed_qkv"), packed_weight(block.attn.o, "forward"),
                        packed_weight(block.mlp, "packed_gate_up"), packed_weight(block.mlp.down, "forward")]
            if any(w is None for w in products):
                return None
            weights += [block.attn_norm.weight, *products[:2], block.mlp_norm.weight, *products[2:]]
        kv_cache.check_room(1)
        y = fused_llama_blocks(x, weights, kv_cache.k, kv_cache.v, kv_cache.valid, cos, sin, kv_cache.pos,
                               kv_cache.source, kv_cache.shared, self.config.n_head, self.config.norm_eps,
                               torch.get_autocast_dtype(x.device.type))
        if y is not None:
            record("attention", x.size(0), 1, kv_cache.key_width(1), mask is not None)
        return y

    def decode_step(self, token: Tensor, k: Tensor, v: Tensor, valid: Tensor, lengths: Tensor
                    ) -> tuple[Tensor, Tensor, Tensor]:
        """One static-shape decode step (the contract of GPT.decode_step): token [N] after the cached k, v
        [L, N, Hkv, S, D]; returns (logits [N, V], the token's keys and values [L, N, Hkv, 1, D]), writing nothing."""
        N, c = token.size(0), self.config
        groups = c.n_head // c.n_kv_head
        cos, sin = hf_rotary(lengths[:, None], c, compute_dtype(self, token.device))
        bias = torch.zeros(valid.shape, device=valid.device).masked_fill(~valid, float("-inf"))[:, None, None, :]
        scale = c.head_dim ** -0.5
        x = self.wte(token[:, None])
        new_k, new_v = [], []
        for layer, block in enumerate(self.blocks):
            q, k1, v1 = block.attn.project(block.attn_norm(x), cos, sin)  # q [N, H, 1, D], k1 v1 [N, Hkv, 1, D]
            new_k.append(k1)
            new_v.append(v1)
            q = q.view(N, c.n_kv_head, groups, c.head_dim)  # a key/value head's query heads side by side
            kl, vl = k[layer].to(q.dtype), v[layer].to(q.dtype)  # [N, Hkv, S, D]
            scores = torch.cat([(q @ kl.transpose(-1, -2)).float() * scale + bias,
                                (q * k1).sum(-1, keepdim=True).float() * scale], -1).softmax(-1)
            y = scores[..., :-1].to(q.dtype) @ vl + scores[..., -1:].to(q.dtype) * v1  # [N, Hkv, G, D]
            x = x + block.attn.o(y.reshape(N, 1, -1))
            x = x + block.mlp(block.mlp_norm(x))
        return self.logits(self.norm_f(x)[:, -1]), torch.stack(new_k), torch.stack(new_v)

    def logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden).float()

    forward = GPT.forward  # logits, or the cross-entropy with the head run only where a target is kept

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # a tied head counted once

    def estimate_flops(self) -> float:
        """Training FLOPs per token, as GPT.estimate_flops counts them: the head's matmul counts, tied or not."""
        c = self.config
        matmul_params = self.num_params() - self.wte.weight.numel() + (self.lm_head.weight.numel() if c.tied else 0)
        return float(6 * matmul_params + 12 * c.depth * c.n_head * c.head_dim * c.seq_len)
