"""Stage adv_grpo@i: GRPO on policy i-1 against the frozen discriminator of cycle i -> policy i."""
import math
from pathlib import Path

import pandas as pd
import torch
import typer

from speedrun import tokenizer as tokenizer_lib
from speedrun.adversarial import data as adv
from speedrun.adversarial.reward import grpo_reward_fn
from speedrun.common import pick_device, use_bf16, seed_everything, write_json, write_text
from speedrun.reward.discriminator import load_discriminator
from speedrun.rl.grpo import require_reward_signal
from speedrun.rl.trainer import GRPOConfig, grpo_train
from speedrun.train.checkpoint import load_model, save_model
from speedrun.cli import stage_flags
from speedrun.params import from_options

WALL_CLOCK = ["tokens_per_s", "sample_frac_time"]  # left out of log.csv: a rerun writes identical bytes


@stage_flags(init_dir=Path("outs/pretrain"), disc_dir=Path("outs/adv/cycle_1/disc"),
             out_dir=Path("outs/adv/cycle_1/policy"))  # cycle 1's: dvc.yaml fills them per cycle
def main(cycle: str, init_dir: Path, disc_dir: Path, corpus_dir: Path, tokenizer_dir: Path, seq_len: int,
         prompts: int, steps: int, prompts_per_step: int, group_size: int, lr: float, beta: float, clip_eps: float,
         inner_updates: int, warmup_steps: int, temperature: float, reward: str, reward_threshold: float,
         patience: int, min_delta: float, seed: int, device: str, dtype: str, out_dir: Path) -> None:
    device = pick_device(device)
    tok = tokenizer_lib.load(tokenizer_dir)
    win = adv.corpus_windows(pd.read_parquet(corpus_dir / "train.parquet")["text"].tolist(), tok, seq_len)
    pool, _ = adv.prompt_pool(win, prompts, seed, "adv_grpo", cycle)
    seed_everything(seed)
    policy, meta = load_model(init_dir, device, tok.digest)
    ref, _ = load_model(init_dir, device, tok.digest)
    disc, disc_meta = load_discriminator(disc_dir, device, tok.digest)
    require_reward_signal(disc.head[-1].weight, None, str(disc_dir))
    if disc_meta.get("seq_len", seq_len) != seq_len:
        raise ValueError(f"{disc_dir} was trained on {disc_meta['seq_len']}-token windows, not --seq-len {seq_len}")
    # the threshold is a P(natural); with logit rewards compare the mean log-odds to its log-odds
    threshold = reward_threshold if reward == "prob" else math.log(reward_threshold / (1 - reward_threshold))
    cfg = from_options(GRPOConfig, locals(), max_new_tokens=seq_len - 1, bf16=use_bf16(dtype, device),
                       reward_threshold=threshold)
    draw = lambda step, g: torch.randperm(len(pool), generator=g)[:prompts_per_step]  # noqa: E731
    print(f"adv_grpo@{cycle}: policy {init_dir} vs discriminator {disc_dir} ({disc_meta['head']} head), "
          f"{len(pool)} prompts, reward {reward}, beta {beta}")
    result = grpo_train(policy, ref, pool, draw, grpo_reward_fn(disc, seq_len, reward), cfg, device,
                        stop_id=None, pad_id=tok.bos_id, name=f"adv_grpo@{cycle}")
    log = pd.DataFrame(result.log)
    rewards = log["reward_mean"]
    m = {"cycle": cycle, "init": str(init_dir), "reward": reward, "beta": beta, "steps": len(log),
         "stop_reason": result.stop_reason, "reward_first": round(float(rewards.iloc[0]), 5),
         "reward_last": round(float(rewards.iloc[-1]), 5), "reward_max": round(float(rewards.max()), 5),
         "kl_last": round(float(log["kl"].iloc[-1]), 6), "completion_tokens": result.completion_tokens}
    save_model(out_dir, policy.state_dict(), policy.config,
               {"tokenizer": tok.digest, "cycle": cycle, "init": str(init_dir), "disc": str(disc_dir),
                "step": len(log), "stop_reason": result.stop_reason})
    log_csv = log.drop(columns=WALL_CLOCK, errors="ignore").to_csv(index=False, float_format="%.6g")
    write_text(out_dir / "log.csv", log_csv)
    write_json(out_dir / "metrics.json", m)
    print(f"adv_grpo@{cycle}: reward {m['reward_first']:.3f} -> {m['reward_last']:.3f} in {m['steps']} steps "
          f"(stopped: {m['stop_reason']}), {result.completion_tokens / result.seconds:.0f} tok/s, "
          f"{result.seconds:.1f}s")


if __name__ == "__main__":
    typer.run(main)
