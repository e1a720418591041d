"""Stage grpo@<variant>-<seed>: one GRPO run from the SFT model against the reward model. Variants differ only
in how prompts are drawn (density-aware or uniform; params.yaml grpo.variants), runs of a variant only in the
training seed (grpo.seeds). A run takes about a minute on CPU and keeps no resume state: an interrupted run starts
over."""
import dataclasses

import pandas as pd
import torch

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import pick_device, seed_everything, use_bf16, write_json, write_parquet, write_text
from speedrun.reward.preference import RewardModel
from speedrun.rl.density import draw_prompts, effective_sample_size, group_shares, share_entropy
from speedrun.rl.grpo import require_reward_signal
from speedrun.rl.prompts import load_prompts, sampling_weights
from speedrun.rl.rewards import score_samples
from speedrun.rl.trainer import grpo_train
from speedrun.stage import run_stage
from speedrun.train.checkpoint import load_model, save_model

# not `seed` (the run's seed is its id) nor grpo.seeds: adding a seed leaves the other runs as they are
READS = ("beta", "compute.device", "compute.dtype", "grpo.train", "grpo.density", "grpo.variants.{variant}")
PATHS = {"sft_dir": "outs/sft", "rm_dir": "outs/rm", "tokenizer_dir": "outs/tokenizer",
         "prompts": "data/prompts/prompts.parquet", "out_dir": "outs/grpo/{variant}_s{seed}",
         "metrics": "reports/metrics/grpo/{variant}_s{seed}.json"}


def main(p, io, variant: str, seed: int) -> None:
    sampling = p.grpo.variants[variant].sampling
    dev = pick_device(p.compute.device)
    cfg = dataclasses.replace(p.grpo.train, beta=p.beta, seed=seed, bf16=use_bf16(p.compute.dtype, dev))
    seed_everything(seed)
    tok = tokenizer_lib.load(io.tokenizer_dir)
    df, ids = load_prompts(io.prompts, tok, "train", cfg.max_prompt_len)
    policy, meta = load_model(io.sft_dir, dev, tok.digest)
    ref, _ = load_model(io.sft_dir, dev, tok.digest)
    rm = RewardModel.load(io.rm_dir, dev)
    require_reward_signal(rm.head.weight, rm.reward_std, str(io.rm_dir))
    texts = [msgs[-1]["content"] for msgs in df["prompt"]]
    weights = sampling_weights(sampling, ref, ids, texts, p.grpo.density, dev)
    draws = torch.zeros(len(ids), dtype=torch.long)

    def draw(step: int, g: torch.Generator) -> torch.Tensor:
        idx = draw_prompts(weights, cfg.prompts_per_step, g)
        draws[idx] += 1
        return idx

    ess = effective_sample_size(weights)
    print(f"grpo {variant} seed {seed} ({sampling}): {len(ids)} train prompts, weight ESS {ess:.0f} "
          f"({ess / len(ids):.1%}), {dev} in {'bf16' if cfg.bf16 else 'fp32'}")
    result = grpo_train(policy, ref, ids, draw,
                        lambda batch, s: score_samples(rm, batch, s, tok.bos_id, standardise=True), cfg, dev,
                        tok.assistant_end_id, tok.bos_id, extra_stats=lambda idx: {"weight_ess": ess},
                        name=f"grpo_{variant}_s{seed}", stream="grpo")  # every variant: the same random numbers
    log = pd.DataFrame(result.log)
    groups = df["group"].tolist()
    shares_w = group_shares(weights, groups)
    shares_d = group_shares(draws.double() / draws.sum(), groups)
    k = max(1, len(log) // 5)
    m = {"variant": variant, "sampling": sampling, "seed": seed, "steps": len(log),
         "reward_start": round(float(log["reward_mean"][:k].mean()), 4),
         "reward_end": round(float(log["reward_mean"][-k:].mean()), 4),
         "kl_end": round(float(log["kl"][-k:].mean()), 5),
         "completion_len_end": round(float(log["completion_len"][-k:].mean()), 2),
         "truncated_frac_end": round(float(log["truncated_frac"][-k:].mean()), 4),
         "truncated": cfg.truncated,
         "weight_ess": round(ess, 1), "weight_ess_frac": round(ess / len(ids), 4),
         "group_share_entropy": round(share_entropy(shares_w), 4),
         "drawn_group_share_entropy": round(share_entropy(shares_d), 4),
         "completion_tokens_per_s": round(result.completion_tokens / result.seconds, 1),
         "seconds": round(result.seconds, 1)}
    save_model(io.out_dir, policy.state_dict(), policy.config,
               {"tokenizer": tok.digest, "init": str(io.sft_dir), "variant": variant, "sampling": sampling,
                "seed": seed, "steps": len(log), "beta": p.beta})
    write_text(io.out_dir / "log.csv", log.drop(columns=["tokens_per_s", "sample_frac_time"]).to_csv(
        index=False, float_format="%.6g"))
    write_parquet(io.out_dir / "weights.parquet", pd.DataFrame(
        {"prompt_id": df["prompt_id"], "group": df["group"], "weight": weights.numpy(), "draws": draws.numpy()}))
    write_json(io.metrics, m)
    print(f"grpo {variant} seed {seed}: reward {m['reward_start']:+.3f} -> {m['reward_end']:+.3f} in {m['steps']} "
          f"steps, {m['completion_tokens_per_s']:.0f} completion tok/s")


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS, ids={"variant": str, "seed": int})
