"""Pretrain step throughput vs the machine's measured matmul peak.

Prints, for the default config (params.yaml: model + pretrain batch), tokens/s, model FLOP/s and
MFU = model FLOP/s / measured matmul peak of the dtype the step uses, in fp32 and bf16 autocast,
eager and torch.compile'd, and on a GPU whose dense bf16 peak is published (nanochat's denominator: 989 TFLOP/s
for an H100) the bf16 MFU against that too.
Usage: python bench/train_throughput.py [--steps 10] [--depth 4] [--device cpu] [--published-tflops 989]
"""
from __future__ import annotations

import time

import torch
import typer

from speedrun.typer_app import new_app
import yaml

from speedrun.model import GPT, GPTConfig
from dataclasses import replace

from speedrun.params import load as load_params
from speedrun.train.loop import autocast, make_optimizer


def matmul_peak(dtype: torch.dtype, device: str, n: int = 1024, reps: int = 20) -> float:
    """Best-of FLOP/s of an n x n x n matmul: the practical peak a model step can hope for."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


# dense bf16 peaks from the vendors' spec sheets (no sparsity), TFLOP/s, by a substring of the device name
PUBLISHED_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def published_peak(device: str, given: float) -> float | None:
    """FLOP/s: --published-tflops if given, else the spec sheet's figure for this GPU; None on a CPU."""
    if given > 0:
        return given * 1e12
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name()
    return next((t * 1e12 for key, t in PUBLISHED_BF16_TFLOPS.items() if key in name), None)


def step_throughput(cfg: GPTConfig, batch: int, steps: int, bf16: bool, compile: bool, device: str,
                    optimizer: str = "adamw") -> float:
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    opt = make_optimizer(model, replace(load_params().pretrain, steps=steps, optimizer=optimizer))
    fwd = torch.compile(model) if compile else model
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1), device=device)

    def step() -> None:
        with autocast(device, bf16):
            loss = fwd(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):  # warmup (and compilation)
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    return batch * cfg.seq_len * steps / (time.perf_counter() - t)


app = new_app()


@app.command(help=__doc__)
def main(steps: int = typer.Option(10),
         depth: int | None = typer.Option(None, show_default="params.yaml model.depth"),
         seq_len: int | None = typer.Option(None, show_default="params.yaml model.seq_len"),
         batch: int | None = typer.Option(None, show_default="params.yaml pretrain.batch_size"),
         vocab: int | None = typer.Option(None, show_default="params.yaml tokenizer.vocab_size"),
         device: str = typer.Option("cuda" if torch.cuda.is_available() else "cpu"),
         no_compile: bool = typer.Option(False, "--no-compile"),
         no_eager: bool = typer.Option(False, "--no-eager", help="time the compiled step only"),
         published_tflops: float = typer.Option(0.0, help="the device's published dense bf16 peak (default: the "
                                                "spec-sheet figure of a known GPU)"),
         dtypes: str = typer.Option("fp32,bf16", help="comma-separated step dtypes to time (bf16 is skipped where its "
                                    "matmul peak is below fp32's)"),
         optimizer: str | None = typer.Option(None, show_default="params.yaml pretrain.optimizer",
                                              help="adamw | muon (params.yaml)")) -> None:
    params = yaml.safe_load(open("params.yaml"))
    depth = params["model"]["depth"] if depth is None else depth
    seq_len = params["model"]["seq_len"] if seq_len is None else seq_len
    batch = params["pretrain"]["batch_size"] if batch is None else batch
    vocab = params["tokenizer"]["vocab_size"] if vocab is None else vocab
    optimizer = params["pretrain"]["optimizer"] if optimizer is None else optimizer
    cfg = GPTConfig(vocab_size=vocab, depth=depth, head_dim=params["model"]["head_dim"], seq_len=seq_len)
    flops_per_token = GPT(cfg).estimate_flops()
    print(f"device {device}, {torch.get_num_threads()} threads; depth {cfg.depth}, width {cfg.n_embd}, "
          f"vocab {cfg.vocab_size}, batch {batch} x {cfg.seq_len}, {optimizer}; "
          f"{flops_per_token / 1e6:.1f} MFLOP/token")
    n = 8192 if device == "cuda" else 1024  # a GPU needs big products to reach its peak (1024^3: ~1/8 of it)
    peaks = {"fp32": matmul_peak(torch.float32, device, n), "bf16": matmul_peak(torch.bfloat16, device, n)}
    for name, p in peaks.items():
        print(f"matmul peak {name}: {p / 1e9:,.1f} GFLOP/s (measured)")
    published = published_peak(device, published_tflops)
    print(f"published dense bf16 peak: {published / 1e12:,.0f} TFLOP/s" if published else
          "published dense bf16 peak: none known for this device (--published-tflops to give one)")
    # without bf16 units (no AVX512-BF16/AMX) bf16 matmuls are emulated and far slower than fp32: skip them
    dtypes = dtypes.split(",")
    if "bf16" in dtypes and peaks["bf16"] <= peaks["fp32"]:
        dtypes.remove("bf16")
        print("bf16 step skipped: the bf16 matmul peak is below fp32 here, so the pipeline trains in fp32")
    for compile in [c for c, off in ((False, no_eager), (True, no_compile)) if not off]:
        for dtype in dtypes:
            tps = step_throughput(cfg, batch, steps, dtype == "bf16", compile, device, optimizer)
            flops = tps * flops_per_token
            print(f"{dtype} {'compiled' if compile else 'eager':8s}: {tps:8,.0f} tokens/s  "
                  f"{flops / 1e9:8,.1f} GFLOP/s  MFU {flops / peaks[dtype]:6.1%} (of the measured {dtype} peak)"
                  + (f", {flops / published:6.1%} of the published bf16 peak" if published and dtype == "bf16" else ""))


if __name__ == "__main__":
    app()
