"""Stage adv_grpo@i: GRPO on policy i-1 against the frozen discriminator of cycle i -> policy i. Under a minute on
CPU: it keeps no resume state."""
import dataclasses
import math

import pandas as pd
import torch

from speedrun import tokenizer as tokenizer_lib
from speedrun.adversarial import data as adv
from speedrun.adversarial.reward import grpo_reward_fn
from speedrun.common import pick_device, seed_everything, use_bf16, write_json, write_text
from speedrun.reward.discriminator import load_discriminator
from speedrun.rl.grpo import require_reward_signal
from speedrun.rl.trainer import grpo_train
from speedrun.stage import run_stage
from speedrun.shapes import use_shapes
from speedrun.train.checkpoint import load_model, save_model

READS = ("seed", "beta", "compute.device", "compute.dtype", "compute.decode", "compute.width_step",
         "adversarial.cycles.{cycle}", "adversarial.seq_len", "adversarial.temperature", "adversarial.train")
PATHS = {"init_dir": None, "disc_dir": "outs/adv/cycle_{cycle}/disc", "tokens_dir": "data/tokens",
         "tokenizer_dir": "outs/tokenizer", "out_dir": "outs/adv/cycle_{cycle}/policy"}
IDS = {"cycle": str}  # run ids: the DVC foreach/matrix keys
WALL_CLOCK = ["tokens_per_s", "sample_frac_time"]  # left out of log.csv: a rerun writes identical bytes


def main(p, io, cycle: str) -> None:
    a, c = p.adversarial, p.adversarial.train
    init_dir = io.init_dir or a.cycles[cycle].init
    device = pick_device(p.compute.device)
    use_shapes(p.compute.width_step, device)
    tok = tokenizer_lib.load(io.tokenizer_dir)
    win = adv.corpus_windows(io.tokens_dir / "train.bin", tok.digest, a.seq_len)
    pool, _ = adv.prompt_pool(win, c.prompts, p.seed, "adv_grpo", cycle)
    seed_everything(p.seed)
    policy, meta = load_model(init_dir, device, tok.digest)
    ref, _ = load_model(init_dir, device, tok.digest)
    disc, disc_meta = load_discriminator(io.disc_dir, device, tok.digest)
    require_reward_signal(disc.head[-1].weight, None, str(io.disc_dir))
    if disc_meta.get("seq_len", a.seq_len) != a.seq_len:
        raise ValueError(f"{io.disc_dir} was trained on {disc_meta['seq_len']}-token windows, not "
                         f"adversarial.seq_len {a.seq_len}")
    # the threshold is a P(natural); with logit rewards compare the mean log-odds to its log-odds
    threshold = c.reward_threshold if c.reward == "prob" else math.log(c.reward_threshold / (1 - c.reward_threshold))
    cfg = dataclasses.replace(c, temperature=a.temperature, max_new_tokens=a.seq_len - 1, beta=p.beta, seed=p.seed,
                              bf16=use_bf16(p.compute.dtype, device), reward_threshold=threshold,
                              entropy_bonus=0.0, decode=p.compute.decode, warm_up=device.startswith("cuda"))
    draw = lambda step, g: torch.randperm(len(pool), generator=g)[:c.prompts_per_step]  # noqa: E731
    print(f"adv_grpo@{cycle}: policy {init_dir} vs discriminator {io.disc_dir} ({disc_meta['head']} head), "
          f"{len(pool)} prompts, reward {c.reward}, beta {p.beta}")
    result = grpo_train(policy, ref, pool, draw, grpo_reward_fn(disc, a.seq_len, c.reward), cfg, device,
                        stop_id=None, pad_id=tok.bos_id, name=f"adv_grpo@{cycle}")
    log = pd.DataFrame(result.log)
    rewards = log["reward_mean"]
    m = {"cycle": cycle, "init": str(init_dir), "reward": c.reward, "beta": p.beta, "steps": len(log),
         "stop_reason": result.stop_reason, "reward_first": round(float(rewards.iloc[0]), 5),
         "reward_last": round(float(rewards.iloc[-1]), 5), "reward_max": round(float(rewards.max()), 5),
         "kl_last": round(float(log["kl"].iloc[-1]), 6), "completion_tokens": result.completion_tokens}
    save_model(io.out_dir, policy.state_dict(), policy.config,
               {"tokenizer": tok.digest, "cycle": cycle, "init": str(init_dir), "disc": str(io.disc_dir),
                "step": len(log), "stop_reason": result.stop_reason})
    log_csv = log.drop(columns=WALL_CLOCK, errors="ignore").to_csv(index=False, float_format="%.6g")
    write_text(io.out_dir / "log.csv", log_csv)
    write_json(io.out_dir / "metrics.json", m)
    print(f"adv_grpo@{cycle}: reward {m['reward_first']:.3f} -> {m['reward_last']:.3f} in {m['steps']} steps "
          f"(stopped: {m['stop_reason']}), {result.completion_tokens / result.seconds:.0f} tok/s, "
          f"{result.seconds:.1f}s")


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS, IDS)
