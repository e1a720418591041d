"""Tokens/s of engine.generate() for a depth-4 GPT: what one GRPO sampling step can do.

    python bench/engine_throughput.py --threads 2 --shapes 8x8 --dtype bf16
Prints, per batch shape and decode mode (engine.generate's decode: dynamic, static, compiled), the whole
generate() call (prefill + decode) and the decode part alone (total minus a max_new_tokens=1 call, which is the
prefill plus one draw), per wall second and per CPU second of this process (the latter is what a quiet machine
would give with --threads 1), and the first call's seconds (a compiled step's compile time). The modes of a
shape run one after another, repeats alternating between them, so machine noise hits them alike.
"""
import os
import time
from contextlib import nullcontext

import torch
import typer

from speedrun.typer_app import new_app

from speedrun.common import pick_device
from speedrun.engine import generate
from speedrun.model import GPT, GPTConfig


app = new_app()


@app.command(help=__doc__)
def main(depth: int = typer.Option(4, help="model depth (width 64 * depth)"),
         vocab: int = typer.Option(4096, help="vocabulary size"),
         prompt_len: int = typer.Option(32, help="tokens per prompt (prompt lengths vary from half of it to all of "
                                        "it)"),
         new_tokens: int = typer.Option(64, help="tokens sampled per row"),
         shapes: str = typer.Option("8x8,32x8,64x16", help="comma-separated PROMPTSxSAMPLES batch shapes"),
         repeats: int = typer.Option(3, help="timed runs per shape (median reported)"),
         threads: int = typer.Option(1, help="torch CPU threads"),
         device: str = typer.Option("auto", help="auto, cpu or cuda"),
         dtype: str = typer.Option("bf16", help="fp32 or bf16 (autocast, as the stages run when compute.dtype picks "
                                   "it)"),
         decodes: str = typer.Option("dynamic,static,compiled",
                                     help="comma-separated decode modes to compare")) -> None:
    torch.set_num_threads(threads)
    device = pick_device(device)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab, depth=depth)).to(device).eval()
    amp = torch.autocast(device, dtype=torch.bfloat16) if dtype == "bf16" else nullcontext()
    print(f"GPT depth {depth}, {model.num_params() / 1e6:.2f}M params, vocab {vocab}, {device} {dtype}, "
          f"{threads} thread(s), "
          f"prompts of {prompt_len // 2}-{prompt_len} tokens, {new_tokens} new tokens, no stop token; "
          f"load average {os.getloadavg()[0]:.2f} (other jobs on the machine skew the figures)", flush=True)
    for shape in shapes.split(","):
        n_prompts, n_samples = (int(x) for x in shape.split("x"))
        g = torch.Generator(device=device)
        prompts = [torch.randint(1, vocab, (prompt_len // 2 + i * (prompt_len // 2) // max(n_prompts - 1, 1),),
                                 generator=torch.Generator().manual_seed(i)).tolist() for i in range(n_prompts)]

        def run(n: int, decode: str) -> None:
            g.manual_seed(0)
            with amp:
                generate(model, prompts, n_samples, n, temperature=1.0, generator=g, decode=decode)
            if device == "cuda":
                torch.cuda.synchronize()

        modes = decodes.split(",")
        first = {}
        for mode in modes:  # warm-up: the first call of a compiled mode compiles
            t0 = time.perf_counter()
            run(new_tokens, mode)
            first[mode] = time.perf_counter() - t0
        times = {m: ([], [], [], []) for m in modes}  # total wall, total cpu, prefill wall, prefill cpu
        for _ in range(repeats):
            for mode in modes:
                for n, (w, c) in ((new_tokens, times[mode][:2]), (1, times[mode][2:])):
                    t0, c0 = time.perf_counter(), time.process_time()
                    run(n, mode)
                    w.append(time.perf_counter() - t0)
                    c.append(time.process_time() - c0)
        rows = n_prompts * n_samples
        for mode in modes:
            total, total_cpu, prefill, prefill_cpu = (sorted(x)[len(x) // 2] for x in times[mode])
            print(f"{n_prompts:>3} prompts x {n_samples:>2} samples = {rows:>4} rows, {mode:>8}: "
                  f"{rows * new_tokens / total:>7,.0f} tok/s end to end ({total:.2f} s; "
                  f"first call {first[mode]:.1f} s), decode {rows * (new_tokens - 1) / (total - prefill):>7,.0f} "
                  f"tok/s, prefill {prefill * 1e3:.0f} ms | "
                  f"per CPU-second: {rows * new_tokens / total_cpu:>7,.0f} end to end", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    app()
