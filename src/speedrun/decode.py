"""The sampling loop's pieces: the distribution sampled from (process_logits), one draw per row (_draw), and the
three decode loops generate() runs (dynamic: the cache grows and finished rows are dropped; static: a fixed-width
cache; compiled: static under torch.compile). speedrun.engine.generate sets them up and calls one."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from speedrun.kernels import fused_cdf_search
from speedrun.model import GPT, KVCache
from speedrun.shapes import ladder, record, width_step


def process_logits(logits: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                   keep: Tensor | None = None) -> Tensor:
    """Log-probs [..., V] of the distribution sampled from: logits / temperature, then top-k, then top-p
    (the smallest set of most likely tokens holding >= top_p of the top-k-renormalised mass) masked to -inf.

    temperature == 0 is greedy: log-prob 0 on the argmax, -inf elsewhere. top_k ties with the k-th logit are
    kept. `keep` [...] are token ids that are never masked out (sequence_logprobs passes the sampled tokens,
    so an updated policy that would now truncate them gives a finite log-prob instead of -inf).
    """
    logits = logits.float()
    if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
        raise ValueError(f"bad sampling params: temperature={temperature}, top_k={top_k}, top_p={top_p}")
    if temperature == 0:
        best = logits.argmax(-1, keepdim=True)
        return torch.full_like(logits, float("-inf")).scatter(-1, best, 0.0)
    if temperature != 1.0:
        logits = logits / temperature
    if top_k == 0 and top_p == 1.0:
        return F.log_softmax(logits, dim=-1)
    with torch.no_grad():  # which tokens survive is a discrete choice: no gradient through the mask
        drop = torch.zeros_like(logits, dtype=torch.bool)
        if 0 < top_k < logits.size(-1):
            drop = logits < logits.topk(top_k, dim=-1).values[..., -1:]
        if top_p < 1.0:
            sorted_logits, order = logits.masked_fill(drop, float("-inf")).sort(dim=-1, descending=True, stable=True)
            probs = sorted_logits.softmax(-1)
            mass_before = probs.cumsum(-1) - probs
            drop = drop.scatter(-1, order, mass_before >= top_p)  # the most likely token always has mass_before 0
        if keep is not None:
            drop = drop.scatter(-1, keep[..., None], False)
    return F.log_softmax(logits.masked_fill(drop, float("-inf")), dim=-1)


def _draw(logprobs: Tensor, temperature: float, generator: torch.Generator | None, u: Tensor | None = None) -> Tensor:
    """One token per row from exp(logprobs) by inverse CDF: one uniform per row (torch.multinomial draws one
    exponential per vocabulary entry, 20x slower on CPU), from `generator` unless given as u [rows].
    Masked tokens (-inf) have zero width: never drawn."""
    if temperature == 0:
        return logprobs.argmax(-1)
    probs = logprobs.exp()
    if u is None:
        gen_device = generator.device if generator is not None else probs.device
        u = torch.rand(probs.size(0), generator=generator, device=gen_device)
    u = u.to(probs.device)
    drawn = fused_cdf_search(probs, u)  # on a CPU: the same index, the CDF never written (speedrun.kernels)
    if drawn is not None:
        return drawn
    cdf = probs.cumsum(-1)
    return torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True).squeeze(-1).clamp_(max=cdf.size(-1) - 1)


def dynamic_decode(model: GPT, cache: KVCache, last: Tensor, tokens: Tensor, mask: Tensor, logprobs: Tensor,
                   stop_id: int | None, pad_id: int, generator: torch.Generator | None, uniforms: Tensor | None,
                   on_token: Callable[[Tensor, Tensor], None] | None, decode: str, sample_kw: dict) -> int:
    """generate()'s decode with a growing cache that drops ended rows. Fills tokens / mask / logprobs; returns the
    last column."""
    N, T = tokens.shape
    rows = torch.arange(N, device=last.device)  # output row of each cache row
    alive = torch.ones(N, dtype=torch.bool, device=last.device)
    for t in range(T):
        lp = process_logits(last, **sample_kw)
        u = None if uniforms is None else uniforms[rows.to(uniforms.device), t]
        nxt = _draw(lp, sample_kw["temperature"], generator, u)
        live_rows = rows[alive]
        tokens[live_rows, t] = nxt[alive]
        logprobs[live_rows, t] = lp.gather(-1, nxt[:, None]).squeeze(-1)[alive]
        mask[live_rows, t] = 1.0
        if on_token is not None:
            on_token(rows[alive], nxt[alive])
        if t == T - 1:
            break
        if stop_id is not None:
            alive &= nxt != stop_id
            n_alive = int(alive.sum())
            if n_alive == 0:
                break
            # compact when half the rows ended (at most log2(N) copies of the cache); with a width step, whenever
            # the rows alive fit a smaller size of the row ladder (a few ended rows kept)
            n_keep = n_alive if width_step() == 1 else ladder(n_alive)
            if (2 * n_alive <= len(rows)) if width_step() == 1 else (n_keep < len(rows)):
                keep = torch.sort(torch.argsort((~alive).to(torch.int8), stable=True)[:n_keep]).values
                cache.keep_rows(keep)
                rows, nxt, alive = rows[keep], nxt[keep], alive[keep]
        last = model.logits(model.hidden(nxt[:, None], kv_cache=cache)[:, -1])
    return t


DECODE_MODES = ("dynamic", "static", "compiled")
STATIC_WIDTH = 64  # a static cache's width is rounded up to a multiple of this
STATIC_CHECK = 16  # a static decode looks whether every row has ended once per this many tokens
_COMPILED: dict[str, Callable] = {}


def static_decode(model: GPT, cache: KVCache, last: Tensor, tokens: Tensor, mask: Tensor, logprobs: Tensor,
                  stop_id: int | None, pad_id: int, generator: torch.Generator | None, uniforms: Tensor | None,
                  on_token: Callable[[Tensor, Tensor], None] | None, decode: str, sample_kw: dict) -> int:
    """generate()'s decode with static shapes: every row stays in its slot (an ended row writes padding) and each
    token is one call of static_token (a CUDA graph in "compiled" mode), so the loop adds a few writes per token and
    waits for the device once per STATIC_CHECK tokens. Fills tokens / mask / logprobs; returns the last column."""
    N, T = tokens.shape
    token_fn = compiled_static_token(last.device) if decode == "compiled" else static_token
    alive = torch.ones(N, dtype=torch.bool, device=last.device)
    rows = torch.arange(N, device=last.device)
    gen_device = generator.device if generator is not None else last.device
    for t in range(T):
        # the uniforms _draw would take from the generator (none for greedy decoding)
        u = uniforms[:, t] if uniforms is not None else torch.rand(N, generator=generator, device=gen_device) \
            if sample_kw["temperature"] > 0 else last.new_zeros(N)
        if decode == "compiled" and last.device.type == "cuda":  # the last call's CUDA-graph outputs are consumed:
            torch.compiler.cudagraph_mark_step_begin()          # let the replay reuse their memory
        record("decode_step", N, 1, cache.k.size(3), True)  # here: a compiled step must not trace it
        nxt, tok, lp, alive_next, logits, new_k, new_v = token_fn(
            model, last, u.to(last.device), alive, cache.k, cache.v, cache.valid, cache.lengths, stop_id, pad_id,
            **sample_kw)
        tokens[:, t], logprobs[:, t], mask[:, t] = tok, lp, alive.float()
        if on_token is not None:
            on_token(rows[alive], nxt[alive])
        alive.copy_(alive_next)
        if t == T - 1 or (stop_id is not None and t % STATIC_CHECK == STATIC_CHECK - 1 and not bool(alive.any())):
            break
        last.copy_(logits)  # copies: a captured step's outputs live in its graph's memory
        cache.k[:, :, :, cache.pos] = new_k[:, :, :, 0]
        cache.v[:, :, :, cache.pos] = new_v[:, :, :, 0]
        cache.valid[:, cache.pos] = True
        cache.lengths += 1
        cache.pos += 1
    return t


def static_token(model: GPT, last: Tensor, u: Tensor, alive: Tensor, k: Tensor, v: Tensor, valid: Tensor,
                 lengths: Tensor, stop_id: int | None, pad_id: int, temperature: float, top_k: int, top_p: float
                 ) -> tuple[Tensor, ...]:
    """One token of the static decode, for capture: draw from logits `last` [N, V] with uniforms u [N], then
    model.decode_step on the drawn tokens. Returns (drawn tokens, the same with pad_id where a row had ended, their
    log-probs (0 there), rows alive after this token, the next logits, the new keys and values); writes nothing."""
    lp = process_logits(last, temperature, top_k, top_p)
    nxt = _draw(lp, temperature, None, u)
    tok = torch.where(alive, nxt, pad_id)
    picked = torch.where(alive, lp.gather(-1, nxt[:, None]).squeeze(-1), 0.0)
    alive_next = alive & (nxt != stop_id) if stop_id is not None else alive.clone()
    logits, new_k, new_v = model.decode_step(nxt, k, v, valid, lengths)
    return nxt, tok, picked, alive_next, logits, new_k, new_v


def compiled_static_token(device: torch.device | str) -> Callable:
    """static_token under torch.compile, one per device type (a CUDA graph on GPU: reduce-overhead mode)."""
    kind = torch.device(device).type
    if kind not in _COMPILED:
        _COMPILED[kind] = torch.compile(static_token, mode="reduce-overhead" if kind == "cuda" else None)
    return _COMPILED[kind]
