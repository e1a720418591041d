"""Stage adv_grpo@i: GRPO on policy i-1 against the frozen discriminator of cycle i -> policy i."""
import math
from pathlib import Path

import pandas as pd
import torch
import typer

from speedrun import tokenizer as tokenizer_lib
from speedrun.adversarial import data as adv
from speedrun.adversarial.reward import grpo_reward_fn
from speedrun.common import pick_device, DTYPE_HELP, use_bf16, seed_everything, write_json, write_text
from speedrun.reward.discriminator import load_discriminator
from speedrun.rl.grpo import require_reward_signal
from speedrun.rl.trainer import GRPOConfig, grpo_train
from speedrun.train.checkpoint import load_model, save_model
from speedrun.params import param_default

WALL_CLOCK = ["tokens_per_s", "sample_frac_time"]  # left out of log.csv: a rerun writes identical bytes


def main(
    cycle: str = typer.Option(..., help="cycle id (the key in adversarial.cycles)"),
    init_dir: Path = typer.Option(Path("outs/pretrain"), help="policy i-1: the starting point and the KL reference"),
    disc_dir: Path = typer.Option(Path("outs/adv/cycle_1/disc"), help="this cycle's discriminator (frozen)"),
    corpus_dir: Path = typer.Option(Path("data/corpus"), help="train.parquet: natural prefixes"),
    tokenizer_dir: Path = typer.Option(Path("outs/tokenizer"), help="trained tokenizer"),
    seq_len: int = typer.Option(param_default("adversarial.seq_len"),
                                help="N: prefix + completion tokens, as in the discriminator's data"),
    prompts: int = typer.Option(param_default("adversarial.grpo.prompts"),
                                help="prompt pool: natural prefixes of random length in [1, N/2]"),
    steps: int = typer.Option(param_default("adversarial.grpo.steps"), help="GRPO steps (at most)"),
    prompts_per_step: int = typer.Option(param_default("adversarial.grpo.prompts_per_step"), help="prompts per step"),
    group_size: int = typer.Option(param_default("adversarial.grpo.group_size"), help="completions per prompt"),
    lr: float = typer.Option(param_default("adversarial.grpo.lr"), help="AdamW learning rate"),
    beta: float = typer.Option(param_default("beta"), help="k3 KL coefficient to policy i-1"),
    clip_eps: float = typer.Option(param_default("adversarial.grpo.clip_eps"), help="PPO ratio clip"),
    inner_updates: int = typer.Option(1, help="optimizer passes per batch of samples"),
    warmup_steps: int = typer.Option(param_default("adversarial.grpo.warmup_steps"), help="linear lr warmup steps"),
    temperature: float = typer.Option(param_default("adversarial.temperature"),
                                      help="sampling temperature (same as adv_data's)"),
    reward: str = typer.Option(param_default("adversarial.grpo.reward"),
                               help="prob: mean P(natural) of the completion | logit: mean log D/(1-D)"),
    reward_threshold: float = typer.Option(param_default("adversarial.grpo.reward_threshold"),
                                           help="stop when a step's mean P(natural) reaches this"),
    patience: int = typer.Option(param_default("adversarial.grpo.patience"),
                                 help="steps without the reward's moving average improving before stopping"),
    min_delta: float = typer.Option(param_default("adversarial.grpo.min_delta"),
                                    help="improvement of the moving average that resets patience"),
    seed: int = typer.Option(param_default("seed"), help="seed of prompts and sampling"),
    device: str = typer.Option(param_default("compute.device"), help="auto | cpu | cuda"),
    dtype: str = typer.Option(param_default("compute.dtype"), help=DTYPE_HELP),
    out_dir: Path = typer.Option(Path("outs/adv/cycle_1/policy"), help="model.pt, meta.json, log.csv, metrics.json"),
) -> None:
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
    cfg = GRPOConfig(steps=steps, prompts_per_step=prompts_per_step, group_size=group_size,
                     max_new_tokens=seq_len - 1, temperature=temperature, lr=lr, beta=beta, clip_eps=clip_eps,
                     inner_updates=inner_updates, warmup_steps=warmup_steps, seed=seed, bf16=use_bf16(dtype, device),
                     reward_threshold=threshold, patience=patience, min_delta=min_delta)
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
