"""Tokens/s of engine.generate() for a depth-4 GPT: what one GRPO sampling step can do.

    python bench/engine_throughput.py --threads 1
Prints, per batch shape, the whole generate() call (prefill + decode) and the decode part alone
(total minus a max_new_tokens=1 call, which is the prefill plus one draw), per wall second and per CPU
second of this process (the latter is what a quiet machine would give with --threads 1).
"""
import os
import time
from contextlib import nullcontext

import torch
import typer

from speedrun.common import pick_device
from speedrun.engine import generate
from speedrun.model import GPT, GPTConfig


def timed(fn, repeats: int) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds of fn(); on a shared machine CPU time is what we really got."""
    fn()  # warm-up
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return sorted(wall)[len(wall) // 2], sorted(cpu)[len(cpu) // 2]


def main(
    depth: int = typer.Option(4, help="model depth (width 64 * depth)"),
    vocab: int = typer.Option(4096, help="vocabulary size"),
    prompt_len: int = typer.Option(32, help="tokens per prompt (prompt lengths vary from half of it to all of it)"),
    new_tokens: int = typer.Option(64, help="tokens sampled per row"),
    shapes: str = typer.Option("8x8,32x8,64x16", help="comma-separated PROMPTSxSAMPLES batch shapes"),
    repeats: int = typer.Option(3, help="timed runs per shape (median reported)"),
    threads: int = typer.Option(1, help="torch CPU threads"),
    device: str = typer.Option("auto", help="auto, cpu or cuda (cuda runs under bf16 autocast)"),
) -> None:
    torch.set_num_threads(threads)
    device = pick_device(device)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab, depth=depth)).to(device).eval()
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else nullcontext()
    print(f"GPT depth {depth}, {model.num_params() / 1e6:.2f}M params, vocab {vocab}, {device}, {threads} thread(s), "
          f"prompts of {prompt_len // 2}-{prompt_len} tokens, {new_tokens} new tokens, no stop token; "
          f"load average {os.getloadavg()[0]:.2f} (other jobs on the machine skew the figures)", flush=True)
    for shape in shapes.split(","):
        n_prompts, n_samples = (int(x) for x in shape.split("x"))
        g = torch.Generator(device=device)
        prompts = [torch.randint(1, vocab, (prompt_len // 2 + i * (prompt_len // 2) // max(n_prompts - 1, 1),),
                                 generator=torch.Generator().manual_seed(i)).tolist() for i in range(n_prompts)]

        def run(n: int) -> None:
            g.manual_seed(0)
            with amp:
                generate(model, prompts, n_samples, n, temperature=1.0, generator=g)

        total, total_cpu = timed(lambda: run(new_tokens), repeats)
        prefill, prefill_cpu = timed(lambda: run(1), repeats)
        rows = n_prompts * n_samples
        print(f"{n_prompts:>3} prompts x {n_samples:>2} samples = {rows:>4} rows: "
              f"{rows * new_tokens / total:>7,.0f} tok/s end to end ({total:.2f} s), "
              f"decode {rows * (new_tokens - 1) / (total - prefill):>7,.0f} tok/s, prefill {prefill * 1e3:.0f} ms | "
              f"per CPU-second: {rows * new_tokens / total_cpu:>7,.0f} end to end, "
              f"decode {rows * (new_tokens - 1) / (total_cpu - prefill_cpu):>7,.0f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    typer.run(main)
