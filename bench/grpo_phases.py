"""Where a GRPO step's time goes on the default run's models: sampling, RM scoring, reference log-probs, policy
forward, backward + AdamW, each timed alone (the phases of rl/trainer.py's step, without its bookkeeping).

    python bench/grpo_phases.py --threads 2 [--decode compiled]
Needs outs/sft, outs/rm, outs/tokenizer and data/prompts (`dvc repro grpo` or `dvc pull`). The first step is a
warm-up (a compiled decode compiles there) and is left out.
"""
import argparse
import time
from pathlib import Path

import torch

from speedrun import params
from speedrun import tokenizer as tokenizer_lib
from speedrun.common import use_bf16
from speedrun.engine import generate, sequence_logprobs
from speedrun.reward.preference import RewardModel
from speedrun.rl.prompts import load_prompts
from speedrun.rl.rewards import score_samples
from speedrun.shapes import resolve_width_step, set_width_step
from speedrun.train.checkpoint import load_model
from speedrun.train.loop import autocast

PHASES = ("sampling", "RM scoring", "reference log-probs", "policy forward", "backward + AdamW")


def main(steps: int = 10, threads: int = 2, dtype: str = "auto", decode: str = "dynamic", width_step: int = -1) -> None:
    torch.set_num_threads(threads)
    cfg = params.load().grpo.train
    set_width_step(resolve_width_step(params.load().compute.width_step if width_step < 0 else width_step, "cpu"))
    bf16 = use_bf16(dtype, "cpu")
    tok = tokenizer_lib.load(Path("outs/tokenizer"))
    policy, _ = load_model(Path("outs/sft"), "cpu", tok.digest)
    ref, _ = load_model(Path("outs/sft"), "cpu", tok.digest)
    rm = RewardModel.load(Path("outs/rm"), "cpu")
    prompts = load_prompts(Path("data/prompts/prompts.parquet"), tok, "train", cfg.max_prompt_len)[1]
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
    B, G, kw = cfg.prompts_per_step, cfg.group_size, dict(pad_id=tok.bos_id)
    seconds, lengths = dict.fromkeys(PHASES, 0.0), []
    for step in range(steps + 1):
        batch = prompts[step * B:(step + 1) * B]
        marks = [time.perf_counter()]
        with torch.no_grad(), autocast("cpu", bf16):
            s = generate(policy, batch, G, cfg.max_new_tokens, stop_id=tok.assistant_end_id,
                         generator=torch.Generator().manual_seed(step), decode=decode, **kw)
            marks.append(time.perf_counter())
            score_samples(rm, batch, s, tok.bos_id)
            marks.append(time.perf_counter())
            sequence_logprobs(ref, batch, s.tokens, mask=s.mask, **kw)
            marks.append(time.perf_counter())
        with autocast("cpu", bf16):
            logp = sequence_logprobs(policy, batch, s.tokens, mask=s.mask, **kw)
        marks.append(time.perf_counter())
        (-(logp * s.mask).sum() / s.mask.sum()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        marks.append(time.perf_counter())
        if step:
            for name, a, b in zip(PHASES, marks, marks[1:]):
                seconds[name] += b - a
            lengths.append(float(s.mask.sum(1).mean()))
    total = sum(seconds.values())
    print(f"{B} prompts x {G} samples x <= {cfg.max_new_tokens} tokens, {'bf16' if bf16 else 'fp32'}, decode "
          f"{decode}, {threads} threads: {total / steps:.3f} s per step; completions {sum(lengths) / len(lengths):.1f} "
          "tokens on average")
    for name, sec in seconds.items():
        print(f"  {name:<20} {sec / total:6.1%} {sec / steps:6.3f} s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="steps timed (after one warm-up)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--dtype", type=str, default="auto", help="fp32, bf16 or auto, as params.yaml compute.dtype")
    ap.add_argument("--decode", type=str, default="dynamic", help="engine decode mode (params.yaml compute.decode)")
    ap.add_argument("--width-step", type=int, default=-1,
                    help="params.yaml compute.width_step (0 = auto, 1 = exact shapes, -1 = params.yaml's value)")
    main(**vars(ap.parse_args()))
