"""Tokens/s of engine.generate() for a depth-4 GPT: what one GRPO sampling step can do.

    python bench/engine_throughput.py --threads 2 --shapes 8x8 --dtype bf16
Prints, per batch shape and decode mode (engine.generate's decode: dynamic, static, compiled), the whole
generate() call (prefill + decode) and the decode part alone (total minus a max_new_tokens=1 call, which is the
prefill plus one draw), per wall second and per CPU second of this process (the latter is what a quiet machine
would give with --threads 1), and the first call's seconds (a compiled step's compile time). The modes of a
shape run one after another, repeats alternating between them, so machine noise hits them alike.
"""
import argparse
import os
import time
from contextlib import nullcontext

import torch

from speedrun.common import pick_device
from speedrun.engine import generate
from speedrun.model import GPT, GPTConfig


def main(depth: int = 4, vocab: int = 4096, prompt_len: int = 32, new_tokens: int = 64,
         shapes: str = "8x8,32x8,64x16", repeats: int = 3, threads: int = 1, device: str = "auto", dtype: str = "bf16",
         decodes: str = "dynamic,static,compiled") -> None:
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, default=4, help="model depth (width 64 * depth)")
    ap.add_argument("--vocab", type=int, default=4096, help="vocabulary size")
    ap.add_argument("--prompt-len", type=int, default=32,
                    help="tokens per prompt (prompt lengths vary from half of it to all of it)")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens sampled per row")
    ap.add_argument("--shapes", type=str, default="8x8,32x8,64x16", help="comma-separated PROMPTSxSAMPLES batch shapes")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per shape (median reported)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--device", type=str, default="auto", help="auto, cpu or cuda")
    ap.add_argument("--dtype", type=str, default="bf16",
                    help="fp32 or bf16 (autocast, as the stages run when compute.dtype picks it)")
    ap.add_argument("--decodes", type=str, default="dynamic,static,compiled",
                    help="comma-separated decode modes to compare")
    main(**vars(ap.parse_args()))
