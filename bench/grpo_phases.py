"""Where a GRPO step's time goes on the default run's models: sampling, RM scoring, reference log-probs, policy
forward, backward + AdamW, each timed alone (the phases of rl/trainer.py's step, without its bookkeeping).

    python bench/grpo_phases.py --threads 2 [--decode compiled]
    python bench/grpo_phases.py --device cuda --decode compiled --steps 8   # on a GPU (the stages' shape settings)
Needs outs/sft, outs/rm, outs/tokenizer and data/prompts (`dvc repro grpo` or `dvc pull`). The first step is a
warm-up (a compiled decode compiles there) and is left out.
"""
import time
from pathlib import Path

import torch
import typer

from speedrun.typer_app import new_app

from speedrun import params
from speedrun import tokenizer as tokenizer_lib
from speedrun.common import pick_device, use_bf16
from speedrun.engine import generate, sequence_logprobs
from speedrun.reward.preference import RewardModel
from speedrun.rl.prompts import load_prompts
from speedrun.rl.rewards import score_samples
from speedrun.shapes import set_forward_compile, set_forward_cost, use_shapes
from speedrun.train.checkpoint import load_model
from speedrun.train.loop import autocast

PHASES = ("sampling", "RM scoring", "reference log-probs", "policy forward", "backward + AdamW")


app = new_app()


@app.command(help=__doc__)
def main(steps: int = typer.Option(10, help="steps timed (after one warm-up)"),
         threads: int = typer.Option(2, help="torch CPU threads"),
         dtype: str = typer.Option("auto", help="fp32, bf16 or auto, as params.yaml compute.dtype"),
         decode: str = typer.Option("dynamic", help="engine decode mode (params.yaml compute.decode)"),
         width_step: int = typer.Option(-1, help="params.yaml compute.width_step (0 = auto, 1 = exact shapes, -1 = "
                                        "params.yaml's value)"),
         device: str = typer.Option("cpu", help="cpu, cuda or auto"),
         forward_cost: int = typer.Option(-1, help="padded tokens one more forward costs when rows are grouped by "
                                          "length (-1: the device's value, shapes.use_shapes)"),
         stop: bool = typer.Option(True, "--stop/--no-stop", help="end completions at the stop token (--no-stop: "
                                   "every one runs to max_new_tokens)"),
         profile: int = typer.Option(0, help="> 0: profile one more step and print this many operators, by the host "
                                     "time spent in them"),
         compile_forwards: str = typer.Option("", help="torch.compile mode of the joint scoring forwards: '' eager, "
                                              "default, reduce-overhead")) -> None:
    torch.set_num_threads(threads)
    cfg = params.load().grpo.train
    device = pick_device(device)
    wstep = use_shapes(params.load().compute.width_step if width_step < 0 else width_step, device)
    if forward_cost >= 0:
        set_forward_cost(forward_cost)
    set_forward_compile(compile_forwards)
    bf16 = use_bf16(dtype, device)
    tok = tokenizer_lib.load(Path("outs/tokenizer"))
    policy, _ = load_model(Path("outs/sft"), device, tok.digest)
    ref, _ = load_model(Path("outs/sft"), device, tok.digest)
    rm = RewardModel.load(Path("outs/rm"), device)
    prompts = load_prompts(Path("data/prompts/prompts.parquet"), tok, "train", cfg.max_prompt_len)[1]
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
    B, G, kw = cfg.prompts_per_step, cfg.group_size, dict(pad_id=tok.bos_id)
    stop_id = tok.assistant_end_id if stop else None

    def one_step(step: int) -> tuple[list[float], float]:  # the phases' end times, the mean completion length
        batch = prompts[step * B:(step + 1) * B]
        uniforms = torch.rand(B * G, cfg.max_new_tokens, generator=torch.Generator().manual_seed(step)).to(device)
        marks = [mark(device)]
        with torch.no_grad(), autocast(device, bf16):
            s = generate(policy, batch, G, cfg.max_new_tokens, stop_id=stop_id, uniforms=uniforms, decode=decode, **kw)
            marks.append(mark(device))
            score_samples(rm, batch, s, tok.bos_id)
            marks.append(mark(device))
            sequence_logprobs(ref, batch, s.tokens, mask=s.mask, **kw)
            marks.append(mark(device))
        with autocast(device, bf16):
            logp = sequence_logprobs(policy, batch, s.tokens, mask=s.mask, **kw)
        marks.append(mark(device))
        (-(logp * s.mask).sum() / s.mask.sum()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        marks.append(mark(device))
        return marks, float(s.mask.sum(1).mean())

    seconds, lengths = dict.fromkeys(PHASES, 0.0), []
    for step in range(steps + 1):
        marks, length = one_step(step)
        if step:  # the first step is a warm-up
            for name, a, b in zip(PHASES, marks, marks[1:]):
                seconds[name] += b - a
            lengths.append(length)
    total = sum(seconds.values())
    print(f"{B} prompts x {G} samples x <= {cfg.max_new_tokens} tokens, {device} {'bf16' if bf16 else 'fp32'}, "
          f"decode {decode}, scoring forwards {compile_forwards or 'eager'}, width step {wstep}, {threads} threads: "
          f"{total / steps:.4f} s per step; completions "
          f"{sum(lengths) / len(lengths):.1f} tokens on average, {sum(lengths) * B * G / total:,.0f} completion tok/s"
          f"{'' if stop else ' (no stop token)'}")
    for name, sec in seconds.items():
        print(f"  {name:<20} {sec / total:6.1%} {sec / steps:7.4f} s")
    if profile:  # one more step under the profiler: which operators the host spends its time in, and how often
        from torch.profiler import ProfilerActivity, profile as torch_profile
        kinds = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with torch_profile(activities=kinds) as prof:
            one_step(steps + 1)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=profile))


def mark(device: str) -> float:
    """A time stamp after the device has done the work queued so far (a GPU runs asynchronously)."""
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


if __name__ == "__main__":
    app()
