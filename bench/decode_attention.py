"""The attention of one decode step on a CPU (issue 91), in the forms measured for it, at SmolLM2-135M's shapes: the
engine's (speedrun.model.one_query_attention over the cache's whole width), the same under torch.compile, PyTorch's
SDPA, and a shared-prefix form, where the samples of a prompt score their queries together against one copy of the
prompt's keys and apart against their own answers' keys, with one softmax over both.

    python bench/decode_attention.py                 # bf16, 8 prompts x 8 samples, a 42-token prompt, 64 new tokens
    python bench/decode_attention.py --dtype fp32

Why the shared-prefix form was a candidate: the cache copies a prompt's keys to each of its samples, and each batch
entry of the engine's two products has only the 3 query heads of one key/value head as rows. It reads the prompt's
keys once per prompt, with 24 rows a product. Each form runs in rounds, alternating, at contexts spread over the
decode (the prompt's length to prompt + new - 1); every form's output is checked against the engine's. The last line
gives each form's time per decode step (depth layers, the mean over the contexts) and its ratio to the engine's."""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
import typer
from torch import Tensor

from speedrun.model import one_query_attention
from speedrun.typer_app import new_app

app = new_app()


def shared_prefix_attention(q: Tensor, prefix_k: Tensor, prefix_v: Tensor, prefix_mask: Tensor, k: Tensor, v: Tensor,
                            mask: Tensor) -> Tensor:
    """one_query_attention with each prompt's keys held once: q [B * n, H, 1, D] (a prompt's n samples adjacent);
    prefix_k, prefix_v [B, Hkv, P, D] and prefix_mask [B, P]; the answers' own k, v [B * n, Hkv, W, D] and mask
    [B * n, W]. The n samples' queries are the rows of one product per (prompt, key/value head)."""
    B, Hkv, P, D = prefix_k.shape
    N, H, _, _ = q.shape
    n, G, W = N // B, H // Hkv, k.size(2)
    grouped = q.view(B, n, Hkv, G, D).transpose(1, 2).reshape(B, Hkv, n * G, D)
    shared = (grouped @ prefix_k.transpose(-1, -2)).view(B, Hkv, n, G, P).transpose(1, 2)  # [B, n, Hkv, G, P]
    own = (q.view(N, Hkv, G, D) @ k.transpose(-1, -2)).view(B, n, Hkv, G, W)
    keep = torch.cat([prefix_mask[:, None].expand(B, n, P), mask.view(B, n, W)], -1)[:, :, None, None]
    scores = torch.cat([shared, own], -1).float() * D ** -0.5
    p = scores.masked_fill(~keep, float("-inf")).softmax(-1).to(v.dtype)
    y_shared = (p[..., :P].transpose(1, 2).reshape(B, Hkv, n * G, P) @ prefix_v).view(B, Hkv, n, G, D)
    y_own = p[..., P:].reshape(N, Hkv, G, W) @ v
    return (y_shared.transpose(1, 2).reshape(N, Hkv, G, D) + y_own).reshape(N, H, 1, D)


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """The engine's attention through PyTorch's SDPA (its CPU kernel), grouped-query without copying the cache."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def median_us(fn, calls: int) -> float:
    """Median microseconds of `calls` calls after a warm-up."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


@app.command(help=__doc__)
def main(dtype: str = typer.Option("bf16", help="bf16 or fp32"),
         prompts: int = typer.Option(8, help="prompts per batch"),
         samples: int = typer.Option(8, help="samples per prompt"),
         prompt_len: int = typer.Option(42, help="tokens of every prompt (the decode bench's chat prompts: 36-42)"),
         new: int = typer.Option(64, help="tokens sampled per row (the cache's width is prompt_len + new)"),
         heads: int = typer.Option(9, help="query heads (SmolLM2-135M: 9)"),
         kv_heads: int = typer.Option(3, help="key/value heads (SmolLM2-135M: 3)"),
         head_dim: int = typer.Option(64, help="a head's width"),
         depth: int = typer.Option(30, help="layers: one attention each per decode step"),
         contexts: int = typer.Option(4, help="contexts timed, spread over the decode"),
         rounds: int = typer.Option(3, help="rounds; each times every form once at every context"),
         calls: int = typer.Option(50, help="timed calls per (form, context, round)"),
         threads: int = typer.Option(2, help="torch CPU threads")) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    B, n, P, D = prompts, samples, prompt_len, head_dim
    N, S = B * n, prompt_len + new

    def r(*shape):
        return torch.randn(*shape).to(dt)

    prefix_k, prefix_v = r(B, kv_heads, P, D), r(B, kv_heads, P, D)
    own_k, own_v = r(N, kv_heads, new, D), r(N, kv_heads, new, D)
    q = r(N, heads, 1, D)
    # the engine's cache: each prompt's keys copied to its samples, then the answers' keys; 3 pad tokens on the left
    cache_k = torch.cat([prefix_k.repeat_interleave(n, 0), own_k], 2)
    cache_v = torch.cat([prefix_v.repeat_interleave(n, 0), own_v], 2)
    prefix_mask = torch.ones(B, P, dtype=torch.bool)
    prefix_mask[:, :3] = False
    compiled = torch.compile(one_query_attention, dynamic=False)
    forms = {"engine": lambda m, own: one_query_attention(q, cache_k, cache_v, m[:, None, None]),
             "compiled": lambda m, own: compiled(q, cache_k, cache_v, m[:, None, None]),
             "SDPA": lambda m, own: sdpa_attention(q, cache_k, cache_v, m[:, None, None]),
             "shared prefix": lambda m, own: shared_prefix_attention(q, prefix_k, prefix_v, prefix_mask, own_k, own_v,
                                                                     own)}
    points = [P + round(i * (new - 1) / max(contexts - 1, 1)) for i in range(contexts)]
    masks = []
    for filled in points:  # the keys written so far: the prompt's real ones, then filled - P answer tokens + this one
        own = torch.arange(new)[None].expand(N, new) <= filled - P
        masks.append((torch.cat([prefix_mask.repeat_interleave(n, 0), own], 1), own))
    for m, own in masks:  # every form computes the engine's numbers
        ref = forms["engine"](m, own).float()
        for name, fn in forms.items():
            err = (fn(m, own).float() - ref).abs().max().item()
            if err > (0.02 if dt == torch.bfloat16 else 1e-4):
                raise SystemExit(f"{name} differs from the engine's attention by {err:.3g}")
    print(f"{dtype}, {N} rows ({B} prompts x {n} samples), {heads} query heads on {kv_heads} key/value heads of "
          f"{D}, a {P}-token prompt, cache width {S}, contexts {points}, {threads} threads", flush=True)
    seen: dict[str, list[float]] = {name: [] for name in forms}
    for rnd in range(rounds):
        line = []
        for name, fn in forms.items():
            us = statistics.mean(median_us(lambda: fn(m, own), calls) for m, own in masks)
            seen[name].append(us)
            line.append(f"{name} {us:.0f} us")
        print(f"round {rnd + 1}: " + ", ".join(line), flush=True)
    engine = statistics.median(seen["engine"])
    summary = [f"{name} {statistics.median(v) * depth / 1e3:.1f} ms ({statistics.median(v) / engine:.2f}x)"
               for name, v in seen.items()]
    print(f"decode_attention ({dtype}): per decode step of {depth} layers, " + ", ".join(summary) +
          f" (n = {rounds})")


if __name__ == "__main__":
    app()
