"""The attention of one decode step on a CPU (issue 91), in the forms measured for it, at SmolLM2-135M's shapes: the
engine's (speedrun.model.one_query_attention over the cache's whole width: the compiled kernel of speedrun.kernels,
each row reading its prompt's keys from the prompt's first copy, as KVCache.source tells it), the same kernel with
each row reading its own copy ("own copies": the engine before it read one copy a prompt), the batched products it
replaced (speedrun.model.batched_attention), those under torch.compile, PyTorch's SDPA, and a shared-prefix form,
where the samples of a prompt score their queries together against one copy of the prompt's keys and apart against
their own answers' keys, with one softmax over both.

    python bench/decode_attention.py                 # bf16, 8 prompts x 8 samples, a 42-token prompt, 64 new tokens
    python bench/decode_attention.py --dtype fp32
    python bench/decode_attention.py --against 8b12aea   # and on that revision's kernels: before and after

Why the shared-prefix form was a candidate: the cache copies a prompt's keys to each of its samples, and each batch
entry of the two batched products has only the 3 query heads of one key/value head as rows. It reads the prompt's
keys once per prompt, with 24 rows a product. A timed call runs every layer's attention, each over its own layer's
cache (as a decode step reads them from memory, not from the CPU's caches), at contexts spread over the decode (the
prompt's length to prompt + new - 2: the last token drawn is never run); the forms alternate call by call. Every
form's output is checked against the engine's first, with prompts of different padding and rows of different answer
lengths. --against REV builds the kernels' C++ of git revision REV (its library renamed, so both load in this process)
and times the engine's call on them as one more form, after a check of their bits against this checkout's: a kernel
change's before and after, alternating in one process. The last line gives each form's time per decode step and its
ratio to the engine's, paired by round."""
from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
import typer
from torch import Tensor

from speedrun.kernels import HEADER, SOURCES, build, kernels_built
from speedrun.model import batched_attention, one_query_attention
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


def inputs(prompts: int, samples: int, prompt_len: int, new: int, heads: int, kv_heads: int, head_dim: int,
           depth: int, dtype: torch.dtype) -> dict:
    """Every layer's queries and caches in both layouts: the engine's (each prompt's keys copied to its samples, then
    the answers' keys, [depth, N, Hkv, P + new, D]) and the shared one (prefix [depth, B, Hkv, P, D], answers [depth,
    N, Hkv, new, D]); q as the engine has it, a view of the rotated query and key heads. Prompt b has b % 7 pads."""
    B, n, P, D = prompts, samples, prompt_len, head_dim

    def r(*shape: int) -> Tensor:
        return torch.randn(*shape).to(dtype)

    prefix_k, prefix_v = r(depth, B, kv_heads, P, D), r(depth, B, kv_heads, P, D)
    own_k, own_v = r(depth, B * n, kv_heads, new, D), r(depth, B * n, kv_heads, new, D)
    prefix_mask = torch.arange(P)[None] >= (torch.arange(B) % 7)[:, None]
    return {"q": r(depth, B * n, heads + kv_heads, 1, D)[:, :, :heads], "prefix_k": prefix_k, "prefix_v": prefix_v,
            "own_k": own_k, "own_v": own_v, "prefix_mask": prefix_mask, "samples": n,
            "k": torch.cat([prefix_k.repeat_interleave(n, 1), own_k], 3),
            "v": torch.cat([prefix_v.repeat_interleave(n, 1), own_v], 3)}


def masks(x: dict, written: int, ragged: bool = False) -> tuple[Tensor, Tensor]:
    """(the engine's key mask [N, P + new], the answers' own [N, new]) once `written` answer tokens are in the cache
    and this step's token is written too; ragged: row i has i % 3 fewer (a check that rows are not mixed up)."""
    N, new = x["own_k"].size(1), x["own_k"].size(3)
    fewer = torch.arange(N) % 3 if ragged else torch.zeros(N, dtype=torch.long)
    own = torch.arange(new)[None] <= written - fewer[:, None]
    return torch.cat([x["prefix_mask"].repeat_interleave(x["samples"], 0), own], 1), own


def forms(x: dict) -> dict[str, Callable[[int, Tensor, Tensor], Tensor]]:
    """Each form as f(layer, the engine's mask, the answers' mask): that layer's attention output [N, H, 1, D]."""
    compiled = torch.compile(batched_attention, dynamic=False)
    P, n = x["prefix_k"].size(3), x["samples"]
    source = torch.arange(x["k"].size(1)) // n * n  # each row's prompt's first copy (KVCache.source)
    return {"engine": lambda i, m, own: one_query_attention(x["q"][i], x["k"][i], x["v"][i], m[:, None, None],
                                                            source, P),
            "own copies": lambda i, m, own: one_query_attention(x["q"][i], x["k"][i], x["v"][i], m[:, None, None]),
            "products": lambda i, m, own: batched_attention(x["q"][i], x["k"][i], x["v"][i], m[:, None, None]),
            "compiled products": lambda i, m, own: compiled(x["q"][i], x["k"][i], x["v"][i], m[:, None, None]),
            "SDPA": lambda i, m, own: sdpa_attention(x["q"][i], x["k"][i], x["v"][i], m[:, None, None]),
            "shared prefix": lambda i, m, own: shared_prefix_attention(
                x["q"][i], x["prefix_k"][i], x["prefix_v"][i], x["prefix_mask"], x["own_k"][i], x["own_v"][i], own)}


def revision_attention(rev: str) -> Callable:
    """one_query_attention's call (q [B, H, 1, D], k, v, mask [B, 1, 1, S], source, shared) on the kernels of git
    revision rev: its C++ sources built under a library of their own (a revision with decode_attention's source rows:
    372b76f or later)."""
    root = Path(__file__).resolve().parent.parent
    lib = "speedrun_kernels_at_" + subprocess.run(["git", "rev-parse", "--short=10", rev], cwd=root, check=True,
                                                  capture_output=True, text=True).stdout.strip()
    texts = {f.name: subprocess.run(["git", "show", f"{rev}:src/speedrun/{f.name}"], cwd=root, check=True,
                                    capture_output=True, text=True).stdout for f in SOURCES + [HEADER]}
    build(lib, {f: text.replace("TORCH_LIBRARY_FRAGMENT(speedrun_kernels,", f"TORCH_LIBRARY_FRAGMENT({lib},")
                for f, text in texts.items()})
    op = getattr(torch.ops, lib).decode_attention

    def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, source: Tensor | None = None,
                  shared: int = 0) -> Tensor:
        B, H, _, D = q.shape
        y = op(q.reshape(B, k.size(1), H // k.size(1), D).contiguous(), k, v, mask.reshape(B, -1).contiguous(),
               D ** -0.5, source, shared)
        return y.reshape(B, H, 1, D)
    return attention


def same_bits(x: dict, fs: dict, name: str) -> bool:
    """Whether form `name` gives the engine's output bit for bit over every layer, at three contexts, ragged rows."""
    for written in (0, x["own_k"].size(3) // 2, x["own_k"].size(3) - 2):
        m, own = masks(x, written, ragged=True)
        if not all(torch.equal(fs["engine"](i, m, own), fs[name](i, m, own)) for i in range(x["q"].size(0))):
            return False
    return True


def check(dtype: torch.dtype, **shape: int) -> None:
    """Every form gives the engine's output (up to bf16 rounding), at 4 prompts x 16 samples, ragged rows."""
    x = inputs(4, 16, dtype=dtype, depth=1, **shape)
    fs = forms(x)
    for written in (0, x["own_k"].size(3) // 2, x["own_k"].size(3) - 2):
        m, own = masks(x, written, ragged=True)
        ref = fs["engine"](0, m, own).float()
        for name, f in fs.items():
            err = (f(0, m, own).float() - ref).abs().max().item()
            if err > (0.02 if dtype == torch.bfloat16 else 1e-4):
                raise SystemExit(f"{name} differs from the engine's attention by {err:.3g} ({written} tokens written)")


@app.command(help=__doc__)
def main(dtype: str = typer.Option("bf16", help="bf16 or fp32"),
         prompts: int = typer.Option(8, help="prompts per batch"),
         samples: int = typer.Option(8, help="samples per prompt"),
         prompt_len: int = typer.Option(42, help="the prompts' width, padding included (the decode bench's: 36-42)"),
         new: int = typer.Option(64, help="tokens sampled per row (the cache's width is prompt_len + new)"),
         heads: int = typer.Option(9, help="query heads (SmolLM2-135M: 9)"),
         kv_heads: int = typer.Option(3, help="key/value heads (SmolLM2-135M: 3)"),
         head_dim: int = typer.Option(64, help="a head's width"),
         depth: int = typer.Option(30, help="layers: one attention each per decode step"),
         contexts: int = typer.Option(4, help="contexts timed, spread over the decode"),
         rounds: int = typer.Option(3, help="rounds; each times every form at every context"),
         calls: int = typer.Option(5, help="timed calls (decode steps' attention) per form, context and round"),
         threads: int = typer.Option(2, help="torch CPU threads"),
         against: str = typer.Option("", help="a git revision whose kernels to time too (372b76f or later)")) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if not kernels_built():  # the engine's form is then the products: both columns time the same code
        print("the CPU kernels could not be built (the message above): the engine runs the batched products")
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    shape = dict(prompt_len=prompt_len, new=new, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    check(dt, **shape)
    x = inputs(prompts, samples, dtype=dt, depth=depth, **shape)
    fs = forms(x)
    if against:
        before = revision_attention(against)
        source, P = torch.arange(x["k"].size(1)) // samples * samples, prompt_len
        name = f"at {against}"
        fs[name] = lambda i, m, own: before(x["q"][i], x["k"][i], x["v"][i], m[:, None, None], source, P)
        print(f"the engine's call on {against}'s kernels gives this checkout's bits: {same_bits(x, fs, name)}")
    points = [round(i * (new - 2) / max(contexts - 1, 1)) for i in range(contexts)]
    print(f"{dtype}, {prompts * samples} rows ({prompts} prompts x {samples} samples), {heads} query heads on "
          f"{kv_heads} key/value heads of {head_dim}, {depth} layers, a {prompt_len}-token prompt, cache width "
          f"{prompt_len + new}, answer tokens written {points}, {threads} threads", flush=True)
    per_round: dict[str, list[float]] = {name: [] for name in fs}
    for rnd in range(rounds):
        times: dict[str, list[float]] = {name: [] for name in fs}
        for written in points:
            m, own = masks(x, written)
            for c in range(calls + 1):  # the first call of each form warms up
                for name, f in fs.items():
                    t = time.perf_counter()
                    for layer in range(depth):
                        f(layer, m, own)
                    if c:
                        times[name].append(time.perf_counter() - t)
        for name, v in times.items():
            per_round[name].append(statistics.median(v) * 1e3)
        print(f"round {rnd + 1}: " + ", ".join(f"{k} {v[-1]:.1f} ms" for k, v in per_round.items()), flush=True)
    summary = []
    for name, v in per_round.items():
        ratio = [a / b for a, b in zip(v, per_round["engine"])]
        summary.append(f"{name} {statistics.median(v):.1f} ms ({statistics.median(ratio):.2f}x, "
                       f"{min(ratio):.2f}-{max(ratio):.2f})")
    print(f"decode_attention ({dtype}): a decode step's attention, {depth} layers: " + ", ".join(summary) +
          f" (n = {rounds}; ratios to the engine paired by round)")


if __name__ == "__main__":
    app()
