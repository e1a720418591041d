"""Sampled tokens/s of the onpolicy_pairs stage's sampling (reward.onpolicy.sample_rejected) on the default run's
SFT model, with exact shapes and with the shape ladder (compute.width_step), and the attention shapes each meets.

    python bench/onpolicy_throughput.py --prompts 512 --steps 1,16
    python bench/onpolicy_throughput.py --device cuda --prompts 2048 --steps 1,64
Needs outs/sft, outs/tokenizer and data/prompts/pairs.parquet (`dvc repro onpolicy_pairs`). The width steps run
one after another, --repeats times alternating, so machine noise hits them alike; the first round of each is a
warm-up (a GPU builds an attention plan per new shape there, so the first-round figure is the cold one).
"""
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch
import typer

from speedrun.typer_app import new_app

from speedrun import params
from speedrun import tokenizer as tokenizer_lib
from speedrun.common import pick_device
from speedrun.reward.onpolicy import reference_answers, sample_rejected
from speedrun.shapes import count_shapes, using_width_step
from speedrun.train.checkpoint import load_model


app = new_app()


@app.command(help=__doc__)
def main(prompts: int = typer.Option(512, help="train/val prompts sampled (the stage samples all of them)"),
         steps: str = typer.Option("1,16", help="comma-separated compute.width_step values (1 = exact shapes)"),
         repeats: int = typer.Option(2, help="rounds of every width step (the first is the cold one)"),
         threads: int = typer.Option(2, help="torch CPU threads"),
         device: str = typer.Option("auto", help="auto, cpu or cuda")) -> None:
    torch.set_num_threads(threads)
    device = pick_device(device)
    if device == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)  # as the stage runs (shapes.use_shapes)
    c = params.load().onpolicy
    tok = tokenizer_lib.load(Path("outs/tokenizer"))
    model, _ = load_model(Path("outs/sft"), device, tok.digest)
    path = Path("data/prompts/pairs.parquet")
    refs = [r for r in reference_answers(pq.read_table(path).to_pylist(), str(path)) if r["split"] != "eval"]
    refs = refs[:prompts]
    print(f"onpolicy sampling: {len(refs)} prompts x {c.samples_per_prompt} samples, batches of {c.batch_prompts}, "
          f"<= {c.max_new_tokens} new tokens, depth {model.config.depth}, {device}", flush=True)
    for r in range(repeats):
        for step in [int(s) for s in steps.split(",")]:
            with using_width_step(step), count_shapes() as shapes:
                t0 = time.perf_counter()
                rows, stats = sample_rejected(model, tok, refs, c.samples_per_prompt, c.max_new_tokens, c.temperature,
                                              c.top_p, 0, c.batch_prompts, c.max_prompt_len, device)
                if device == "cuda":
                    torch.cuda.synchronize()
                wall = time.perf_counter() - t0
            n_tok = stats["mean_sample_tokens"] * stats["pairs"]
            print(f"round {r + 1}{' (cold)' if r == 0 else ''}, width step {step}: {n_tok / wall:,.0f} sampled "
                  f"tokens/s ({wall:.1f} s), {shapes.distinct} distinct attention shapes in {shapes.calls} calls",
                  flush=True)


if __name__ == "__main__":
    app()
