"""Completion tokens/s of whole GRPO steps (sample with the KV-cache engine, score with the reward model,
reference log-probs, clipped loss, backward, AdamW update) for the default config.

    python bench/grpo_throughput.py --threads 2
    python bench/grpo_throughput.py --threads 2 --trained   # the default run's SFT model, RM and prompts
Random-init depth-4 GPT (vocab 4096) as policy, reference and reward-model trunk; B prompts x G samples
x max-new-tokens with no stop token, so every step does the full token budget. --trained: the pipeline's own
outs/sft, outs/rm and train prompts, with the stop token, so completions end as in the default run (most after
~15 tokens, the longest at the budget): the work a GRPO stage does. Prints per-step figures
and the share of each step spent sampling+scoring. For scale (issue 5): HF TRL's GRPOTrainer on a
6.3M-param model, 8 completions x 64 tokens per step, ran ~700 completion tokens/s on this machine.
"""
import os
from dataclasses import replace
import time
from pathlib import Path

import torch
import typer

from speedrun.typer_app import new_app

from speedrun import params
from speedrun import tokenizer as tokenizer_lib
from speedrun.common import pick_device, use_bf16
from speedrun.model import GPT, GPTConfig
from speedrun.reward.preference import RewardModel
from speedrun.rl.prompts import load_prompts
from speedrun.rl.rewards import score_samples
from speedrun.rl.trainer import grpo_train
from speedrun.shapes import forward_cost as current_forward_cost, set_forward_compile, set_forward_cost, use_shapes
from speedrun.shapes import width_step as current_width_step
from speedrun.train.checkpoint import load_model


app = new_app()


@app.command(help=__doc__)
def main(depth: int = typer.Option(4, help="model depth (width 64 * depth)"),
         vocab: int = typer.Option(4096, help="vocabulary size"),
         prompt_len: int = typer.Option(24, help="tokens per prompt (lengths vary from half of it to all of it)"),
         prompts_per_step: int = typer.Option(8, help="B (params.yaml grpo.prompts_per_step)"),
         group_size: int = typer.Option(8, help="G (params.yaml grpo.group_size)"),
         max_new_tokens: int = typer.Option(48, help="completion tokens per sample (params.yaml grpo.max_new_tokens)"),
         steps: int = typer.Option(6, help="timed GRPO steps (after one warm-up step)"),
         threads: int = typer.Option(2, help="torch CPU threads"),
         device: str = typer.Option("auto", help="auto, cpu or cuda"),
         dtype: str = typer.Option("auto", help="fp32, bf16 or auto (bf16 where the hardware has it), as params.yaml"),
         decode: str = typer.Option("dynamic", help="dynamic, static or compiled (params.yaml compute.decode)"),
         trained: bool = typer.Option(False, "--trained/--no-trained", help="use outs/sft, outs/rm and data/prompts "
                                      "(run `dvc repro grpo` first)"),
         stop: bool = typer.Option(True, "--stop/--no-stop", help="--trained: end completions at the stop token "
                                   "(--no-stop: every completion runs to max_new_tokens, the same step with fixed "
                                   "shapes)"),
         width_step: int = typer.Option(-1, help="pad widths to multiples of this, rows to powers of two (params.yaml "
                                        "compute.width_step; 0 = auto, 1 = exact shapes, -1 = params.yaml's value)"),
         cudnn_sdpa: bool = typer.Option(False, "--cudnn-sdpa/--no-cudnn-sdpa", help="on CUDA, let "
                                         "scaled_dot_product_attention pick its cuDNN backend (the stages turn it off: "
                                         "shapes.use_shapes; --no-cudnn-sdpa: flash / memory-efficient / math only)"),
         forward_cost: int = typer.Option(-1, help="padded tokens one more forward costs when rows are grouped by "
                                          "length (-1: the device's value, shapes.use_shapes: 32 on CPU, one forward "
                                          "per batch on CUDA)"),
         compile_forwards: str = typer.Option("", help="torch.compile mode of the joint scoring forwards "
                                              "(shapes.set_forward_compile): '' eager, default, reduce-overhead (CUDA "
                                              "graphs)")) -> None:
    torch.set_num_threads(threads)
    device = pick_device(device)
    use_shapes(params.load().compute.width_step if width_step < 0 else width_step, device)  # the stages' settings
    if forward_cost >= 0:
        set_forward_cost(forward_cost)
    set_forward_compile(compile_forwards)
    if device == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(cudnn_sdpa)
    torch.manual_seed(0)
    stop_id, pad_id = None, 0
    if trained:
        tok = tokenizer_lib.load(Path("outs/tokenizer"))
        policy, _ = load_model(Path("outs/sft"), device, tok.digest)
        ref, _ = load_model(Path("outs/sft"), device, tok.digest)
        rm = RewardModel.load(Path("outs/rm"), device)
        prompts = load_prompts(Path("data/prompts/prompts.parquet"), tok, "train", 128)[1]
        stop_id, pad_id = (tok.assistant_end_id if stop else None), tok.bos_id
    else:
        config = GPTConfig(vocab_size=vocab, depth=depth)
        policy, ref = GPT(config).to(device), GPT(config).to(device)
        ref.load_state_dict(policy.state_dict())
        rm = RewardModel.from_gpt(GPT(config).to(device)).eval()
        torch.nn.init.normal_(rm.head.weight, std=0.02)  # a non-constant reward, so advantages are not all zero
        prompts = [torch.randint(1, vocab, (prompt_len // 2 + i % (prompt_len // 2 + 1),),
                                 generator=torch.Generator().manual_seed(i)).tolist()
                   for i in range(max(64, prompts_per_step))]
    cfg = replace(params.load().grpo.train, steps=steps + 1, prompts_per_step=prompts_per_step,
                  group_size=group_size, max_new_tokens=max_new_tokens, beta=params.load().beta, seed=0,
                  bf16=use_bf16(dtype, device), entropy_bonus=0.0, decode=decode,
                  warm_up=current_width_step() > 1 and device == "cuda")
    what = f"trained outs/sft + outs/rm, {'stop token' if stop_id is not None else 'no stop token'}" if trained else \
        "random init, no stop token"
    print(f"{what}: GPT depth "
          f"{policy.config.depth}, {policy.num_params() / 1e6:.2f}M params, vocab {policy.config.vocab_size}, {device} "
          f"{'bf16' if cfg.bf16 else 'fp32'}, {threads} thread(s)"
          f"{'' if device != 'cuda' else ', cuDNN attention ' + ('allowed' if cudnn_sdpa else 'off')}, "
          f"width step {current_width_step()}, forward cost {current_forward_cost()}, decode {decode}, "
          f"scoring forwards {compile_forwards or 'eager'}; "
          f"{prompts_per_step} prompts x {group_size} samples x {max_new_tokens} new tokens per step; "
          f"load average {os.getloadavg()[0]:.2f} (other jobs on the machine skew the figures)", flush=True)
    t0, c0 = time.perf_counter(), time.process_time()
    draw = lambda step, g: torch.randperm(len(prompts), generator=g)[:prompts_per_step]  # noqa: E731
    result = grpo_train(policy, ref, prompts, draw, lambda batch, s: score_samples(rm, batch, s, pad_id), cfg, device,
                        stop_id=stop_id, pad_id=pad_id, name="bench")
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    timed = result.log[1:]  # the first step pays one-off allocation costs
    tok_s = [r["tokens_per_s"] for r in timed]
    sample_frac = sum(r["sample_frac_time"] for r in timed) / len(timed)
    print(f"GRPO step: {sorted(tok_s)[len(tok_s) // 2]:,.0f} completion tok/s (median of {len(timed)} steps; "
          f"min {min(tok_s):,.0f}, max {max(tok_s):,.0f}); sampling + scoring + reference = {sample_frac:.0%} "
          "of a step")
    print(f"all {len(result.log)} steps: {result.completion_tokens / wall:,.0f} tok/s wall, "
          f"{result.completion_tokens / cpu:,.0f} per CPU-second of this process / {threads} threads; "
          f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    app()
