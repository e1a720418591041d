"""Batched sampling with a KV cache, and the matching differentiable log-probs for GRPO (the sampled
distribution and the decode loops are speedrun.decode).

generate(): left-pad the prompts, prefill each prompt once, repeat its cache num_samples times, then decode
all rows together. Every row draws its own first token (the first draw happens after the replication).
sequence_logprobs(): one batched forward over prompt + completion giving, for an unchanged model, the same
log-probs that generate() recorded: both go through process_logits, i.e. the temperature-scaled, top-k/top-p
truncated distribution that was actually sampled from.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from speedrun.decode import DECODE_MODES, STATIC_WIDTH, dynamic_decode, process_logits, static_decode
from speedrun.model import GPT, KVCache
from speedrun.packed import packed_linears, sampling_dtype
from speedrun.shapes import forward_compile, forward_cost, length_groups, record, round_up
from speedrun.shapes import scoring_hidden, width_step
from speedrun.tokenizer import Tokenizer


@dataclass
class Samples:
    tokens: Tensor        # [N, T] long: completion tokens, pad_id after the stop token; T = the longest completion
    mask: Tensor          # [N, T] float: 1.0 on completion tokens (the stop token included), 0 after
    logprobs: Tensor      # [N, T] float: log-prob of each token under process_logits at sampling time, 0 off-mask
    prompt_index: Tensor  # [N] long: the prompt each row came from; a prompt's samples are adjacent
    trunk: "FrozenTrunk | None" = None  # noqa: F821  the frozen blocks' states of these rows, where GRPO made them


def completion_texts(out: Samples, tok: Tokenizer) -> list[str]:
    """The decoded completion of every row of a generate() result (its mask; <|assistant_end|> dropped)."""
    return [tok.decode([t for t, k in zip(row, m) if k and t != tok.assistant_end_id])
            for row, m in zip(out.tokens.tolist(), out.mask.tolist())]


def left_pad(prompts: list[list[int]] | Tensor, pad_id: int, device: torch.device | str) -> tuple[Tensor, Tensor]:
    """Right-align the prompts in a [B, P] batch: (ids, key_mask) with key_mask False on the padding; P is the
    longest prompt rounded up to the width step."""
    if isinstance(prompts, Tensor):
        prompts = prompts.tolist()
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token (e.g. BOS)")
    P = round_up(max(len(p) for p in prompts), width_step())
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    key_mask = torch.zeros(len(prompts), P, dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
        key_mask[i, P - len(p):] = True
    return ids.to(device), key_mask.to(device)


@torch.no_grad()
def generate(model: GPT, prompts: list[list[int]], num_samples: int, max_new_tokens: int, *,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, stop_id: int | None = None,
             pad_id: int = 0, generator: torch.Generator | None = None, uniforms: Tensor | None = None,
             on_token: Callable[[Tensor, Tensor], None] | None = None, decode: str = "dynamic") -> Samples:
    """Sample num_samples completions of up to max_new_tokens for every prompt (rows [i*num_samples, ...)
    belong to prompt i). A row ends at stop_id (kept, mask 1); the loop ends when every row has ended, and the
    outputs are as wide as the longest completion (at most max_new_tokens).
    Draws use only `generator` (pass one on the model's device to avoid a copy per step), or, if given,
    uniforms [N, max_new_tokens] in [0, 1): row n's t-th token takes uniforms[n, t], so that a row's draws
    do not depend on which other rows share its batch. on_token(rows, tokens) sees each step's new tokens as
    they are drawn (streaming): the output rows still alive and their tokens.
    decode: "dynamic" grows the cache and drops finished rows (halving the batch when half have ended; with a width
    step > 1, down the row ladder, and the cache read in windows of that step: shapes.py);
    "static" keeps every row and a fixed-width cache through model.decode_step; "compiled" is static under
    torch.compile (a CUDA graph on GPU). All three sample the same distribution; given the same uniforms they
    draw the same tokens (up to float rounding), while a generator's stream differs once rows are dropped."""
    if decode not in DECODE_MODES:
        raise ValueError(f"decode must be one of {DECODE_MODES}, not {decode!r}")
    if num_samples < 1 or max_new_tokens < 0:
        raise ValueError(f"num_samples={num_samples} must be >= 1 and max_new_tokens={max_new_tokens} >= 0")
    if uniforms is not None and tuple(uniforms.shape) != (len(prompts) * num_samples, max_new_tokens):
        raise ValueError(f"uniforms must be [{len(prompts) * num_samples}, {max_new_tokens}], "
                         f"not {tuple(uniforms.shape)}")
    device = next(model.parameters()).device
    ids, key_mask = left_pad(prompts, pad_id, device)
    bad = ((ids < 0) | (ids >= model.config.vocab_size)).any(1).nonzero()
    if len(bad):
        raise ValueError(f"prompt {int(bad[0])} has token ids outside the vocabulary [0, {model.config.vocab_size})")
    B, P = ids.shape
    N = B * num_samples
    tokens = torch.full((N, max_new_tokens), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros(N, max_new_tokens, device=device)
    logprobs = torch.zeros(N, max_new_tokens, device=device)
    prompt_index = torch.arange(B, device=device).repeat_interleave(num_samples)
    if max_new_tokens == 0:
        return Samples(tokens, mask, logprobs, prompt_index)

    # bf16 on a CPU: the weights packed once for the whole call, not reordered at every product (speedrun.packed)
    with packed_linears(model, sampling_dtype(device) if decode != "compiled" else None, N):
        return _generate(model, ids, key_mask, num_samples, tokens, mask, logprobs, prompt_index, stop_id, pad_id,
                         generator, uniforms, on_token, decode, dict(temperature=temperature, top_k=top_k, top_p=top_p))


def _generate(model: GPT, ids: Tensor, key_mask: Tensor, num_samples: int, tokens: Tensor, mask: Tensor,
              logprobs: Tensor, prompt_index: Tensor, stop_id: int | None, pad_id: int,
              generator: torch.Generator | None, uniforms: Tensor | None,
              on_token: Callable[[Tensor, Tensor], None] | None, decode: str, sample_kw: dict) -> Samples:
    """generate()'s prefill and decode, its outputs allocated and its arguments checked."""
    B, P = ids.shape
    max_new_tokens, device = tokens.size(1), ids.device
    # prefill each prompt once, then give each of its samples its own copy of the cache
    cache = KVCache(model.config, B, P, device)
    last = model.logits(model.hidden(ids, key_mask=key_mask, kv_cache=cache)[:, -1])  # left padding: -1 is real
    static = decode != "dynamic"
    width = round_up(P + max_new_tokens, width_step())  # a growing cache's key windows all fit
    if static:  # few distinct widths, so a captured step is reused across batches of other prompt lengths
        width = round_up(width, STATIC_WIDTH)
    cache = cache.expand(num_samples, width)
    last = last.repeat_interleave(num_samples, 0)  # replicated BEFORE the first draw: samples differ from token 1
    decoder = static_decode if static else dynamic_decode
    t = decoder(model, cache, last, tokens, mask, logprobs, stop_id, pad_id, generator, uniforms, on_token, decode,
                sample_kw)
    # columns after the longest completion hold only padding: cut them (less work downstream)
    used = int(real_width(mask[:, :t + 1]).max()) if static and stop_id is not None else t + 1
    return Samples(tokens[:, :used], mask[:, :used], logprobs[:, :used], prompt_index)


class PrefixCache(KVCache):
    """A KV cache that concatenates instead of writing in place, so gradients flow through it: the training
    forward runs each prompt once and lets its G completions attend to the shared keys/values."""

    def __init__(self, config, batch: int, max_len: int, device: torch.device | str = "cpu"):
        super().__init__(config, batch, max_len, device)
        self.layer_kv: list[tuple[Tensor, Tensor] | None] = [None] * config.depth

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.pos + k.size(2) > self.max_len:
            raise ValueError(f"KV cache overflow: {self.pos} + {k.size(2)} tokens > max_len {self.max_len}")
        if self.layer_kv[layer] is not None:
            k0, v0 = self.layer_kv[layer]
            k, v = torch.cat([k0, k], 2), torch.cat([v0, v], 2)
        self.layer_kv[layer] = (k, v)
        return k, v

    def key_width(self, T: int) -> int:
        return self.pos + T  # concatenated, never padded

    def select(self, rows: Tensor) -> PrefixCache:
        """A cache whose row i is this cache's row rows[i] (differentiable: the copies share their gradient).
        index_select, not x[rows]: the backward of x[rows] with repeated rows adds with atomics on >1 CPU threads
        (run-to-run float noise); index_select's backward (index_add_) adds in a fixed order."""
        new = PrefixCache(self.config, rows.numel(), self.max_len, self.valid.device)
        new.pos, new.padded = self.pos, self.padded
        new.valid, new.lengths = self.valid[rows], self.lengths[rows]
        new.layer_kv = [None if kv is None else (kv[0].index_select(0, rows), kv[1].index_select(0, rows))
                        for kv in self.layer_kv]
        return new


def real_width(mask: Tensor) -> Tensor:
    """[N]: the columns up to and including each row's last nonzero entry of mask [N, T] (0 for an empty row)."""
    return ((mask != 0).long() * torch.arange(1, mask.size(1) + 1, device=mask.device)).amax(1) if mask.size(1) \
        else mask.new_zeros(mask.size(0), dtype=torch.long)


def last_real(mask: Tensor) -> Tensor:
    """[N]: each row's highest index where mask [N, T] is nonzero (a left- or right-padded row's last real token; 0 for
    an empty row)."""
    return (real_width(mask) - 1).clamp(min=0)


def continuation_hidden(model: GPT, prompts: list[list[int]] | Tensor, tokens: Tensor, prompt_index: Tensor,
                        pad_id: int = 0, lengths: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Hidden states of prompt + completion rows, each prompt computed once: (the prompt's last state [N, C],
    the completion tokens' states [N, T, C]) for row n = prompts[prompt_index[n]] + tokens[n]. The same numbers
    as one forward over the concatenated rows (up to float rounding), at B x P + N x T tokens instead of N x (P + T).
    lengths [N]: only the first lengths[n] tokens of row n are real; rows are then run in groups of similar length
    (length_groups) and the states past a row's length are 0, so padding costs (almost) nothing."""
    prompt_ids, prompt_mask = left_pad(prompts, pad_id, tokens.device)
    B, P = prompt_ids.shape
    N, T = tokens.shape
    if T and width_step() > 1 and (N - B) * P < forward_cost():  # the prompt repeated costs less than a forward
        return joint_hidden(model, prompt_ids, prompt_mask, tokens, prompt_index, pad_id, lengths)
    cache = PrefixCache(model.config, B, P + round_up(tokens.size(1), width_step()), tokens.device)
    last = model.hidden(prompt_ids, key_mask=prompt_mask, kv_cache=cache)[:, -1]  # left padding: -1 is real
    if T == 0:
        return last.index_select(0, prompt_index), last.new_zeros(N, 0, last.size(-1))
    step = width_step()
    if lengths is None and step == 1:
        return last.index_select(0, prompt_index), model.hidden(tokens, kv_cache=cache.select(prompt_index))
    if lengths is None:
        lengths = torch.full((N,), T, dtype=torch.long)
    elif step > 1:  # ladder: every row is run (one column where no state is needed): row counts stay the batch's
        lengths = lengths.clamp(min=1)
    # with a width step, columns up to a multiple of it: groups run at rounded widths (the extra columns come
    # after every real token, so causal attention keeps them out of the real states)
    Tp = round_up(T, step)
    if Tp > T:
        tokens = torch.cat([tokens, tokens.new_full((N, Tp - T), pad_id)], 1)
    hidden = last.new_zeros(N, Tp, last.size(-1))
    for rows in length_groups(lengths.clamp(max=T).tolist()):
        w = min(Tp, round_up(int(lengths[rows[-1]]), step))
        rows_t = torch.tensor(rows, device=tokens.device)
        hidden[rows_t, :w] = model.hidden(tokens[rows_t, :w], kv_cache=cache.select(prompt_index[rows_t]))
    return last.index_select(0, prompt_index), hidden[:, :T]


def joint_hidden(model: GPT, prompt_ids: Tensor, prompt_mask: Tensor, tokens: Tensor, prompt_index: Tensor,
                 pad_id: int, lengths: Tensor | None) -> tuple[Tensor, Tensor]:
    """continuation_hidden as one forward over [prompt | completion] rows at ladder widths (each prompt repeated
    for its rows): no prefill, cache gather and second forward, so on a GPU, where a small forward costs its
    launches and not its tokens, fewer launches; no device sync, so it can run compiled (shapes.forward_compile)."""
    N, T = tokens.shape
    P = prompt_ids.size(1)
    tokens = F.pad(tokens, (0, round_up(T, width_step()) - T), value=pad_id)  # pads after every real token
    ids = torch.cat([prompt_ids.index_select(0, prompt_index), tokens], 1)
    key_mask = torch.cat([prompt_mask.index_select(0, prompt_index), torch.ones_like(tokens, dtype=torch.bool)], 1)
    mode = forward_compile()
    if mode:  # the compiled forward records nothing itself (shapes.record)
        record("attention", ids.size(0), ids.size(1), ids.size(1), True)
    if mode == "reduce-overhead":  # each forward its own CUDA-graph root: not a child of whichever
        torch.compiler.cudagraph_mark_step_begin()  # decode step or forward ran last (a new capture every step)
    h = scoring_hidden(model)(ids, key_mask=key_mask, padded=True)
    states = h[:, P:P + T]
    if lengths is not None:  # as continuation_hidden: no state past a row's length
        states = states * (torch.arange(T, device=h.device) < lengths.to(h.device)[:, None])[..., None]
    return h[:, P - 1], states


def sequence_logprobs(model: GPT, prompts: list[list[int]] | Tensor, tokens: Tensor, *,
                      prompt_index: Tensor | None = None, mask: Tensor | None = None,
                      temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, pad_id: int = 0,
                      entropy: bool = False, trunk: "FrozenTrunk | None" = None  # noqa: F821
                      ) -> Tensor | tuple[Tensor, Tensor]:
    """Log-probs [N, T] of completion `tokens` [N, T] after their prompts, WITH gradients, under
    process_logits(temperature, top_k, top_p); each prompt is run once (continuation_hidden).

    Row n continues prompts[prompt_index[n]]; prompt_index defaults to Samples' layout (each prompt repeated
    N / len(prompts) times, adjacent). Where `mask` is 0 the result is 0. A sampled token that the current
    top-k/top-p would truncate keeps a finite log-prob (it stays in the support). entropy=True: also the entropy
    [N, T] of each position's whole next-token distribution (nats, with gradients), for an entropy bonus.
    trunk (speedrun.trunk.frozen_trunk of these prompts and tokens): model runs only its blocks after the trunk.
    """
    N, T = tokens.shape
    n_prompts = prompts.size(0) if isinstance(prompts, Tensor) else len(prompts)
    if prompt_index is None:
        if N % n_prompts:
            raise ValueError(f"{N} completion rows do not split evenly over {n_prompts} prompts: pass prompt_index")
        prompt_index = torch.arange(n_prompts, device=tokens.device).repeat_interleave(N // n_prompts)
    if trunk is not None:
        if mask is None:
            raise ValueError("a frozen trunk covers the masked-in tokens: pass the mask it was built with")
        hidden = trunk.completion_states(model, T)
    elif mask is None:
        last, hidden = continuation_hidden(model, prompts, tokens[:, :-1], prompt_index, pad_id)
        hidden = torch.cat([last[:, None], hidden], 1)  # the states that predict completion tokens 0 .. T-1
    else:  # only the masked-in tokens are run (rows grouped by length)
        lengths = last_real(mask > 0)  # the states needed: up to the token before the last real
        last, hidden = continuation_hidden(model, prompts, tokens[:, :-1], prompt_index, pad_id, lengths)
        hidden = torch.cat([last[:, None], hidden], 1)
    if mask is None:
        lp = process_logits(model.logits(hidden), temperature, top_k, top_p, keep=tokens)
        picked_lp = lp.gather(-1, tokens[..., None]).squeeze(-1)
        return (picked_lp, distribution_entropy(lp)) if entropy else picked_lp
    real = mask > 0  # only the masked-in tokens' logits are computed
    picked = tokens[real]
    lp = process_logits(model.logits(hidden[real]), temperature, top_k, top_p, keep=picked)
    out = lp.new_zeros(N, T)
    out[real] = lp.gather(-1, picked[:, None]).squeeze(-1)
    if not entropy:
        return out
    ent = lp.new_zeros(N, T)
    ent[real] = distribution_entropy(lp)
    return out, ent


def distribution_entropy(logprobs: Tensor) -> Tensor:
    """-sum p log p over the last dim of log-probs (-inf entries, masked tokens, count 0)."""
    finite = torch.isfinite(logprobs)
    safe = torch.where(finite, logprobs, torch.zeros_like(logprobs))
    return -(safe.exp() * safe).where(finite, torch.zeros_like(safe)).sum(-1)
