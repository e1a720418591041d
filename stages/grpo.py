"""Stage grpo@<variant>-<seed>: one GRPO run from the SFT model against the reward model. Variants differ only
in how prompts are drawn (density-aware or uniform; params.yaml grpo.variants), runs of a variant only in the
training seed (grpo.seeds)."""
from pathlib import Path

import pandas as pd
import torch
import typer

from speedrun import params as params_lib
from speedrun import tokenizer as tokenizer_lib
from speedrun.common import pick_device, use_bf16, seed_everything, write_json, write_parquet, write_text
from speedrun.reward.preference import RewardModel
from speedrun.rl.rewards import score_samples
from speedrun.rl.density import draw_prompts, effective_sample_size, group_shares, share_entropy
from speedrun.rl.prompts import load_prompts, sampling_weights
from speedrun.rl.grpo import require_reward_signal
from speedrun.rl.trainer import GRPOConfig, grpo_train
from speedrun.train.checkpoint import load_model, save_model
from speedrun.cli import stage_flags
from speedrun.params import from_options


@stage_flags(seed=1, out_dir=Path("outs/grpo/density_s1"),  # run density-1's: dvc.yaml fills them per run
             metrics=Path("reports/metrics/grpo/density_s1.json"))
def main(variant: str, sampling: str, params: Path, sft_dir: Path, rm_dir: Path, tokenizer_dir: Path, prompts: Path,
         max_prompt_len: int, steps: int, prompts_per_step: int, group_size: int, max_new_tokens: int,
         temperature: float, top_k: int, top_p: float, lr: float, beta: float, clip_eps: float, inner_updates: int,
         adv_scale: str, truncated: str, density_k: int, density_alpha: float, density_max_ratio: float,
         density_pooling: str, seed: int, device: str, dtype: str, out_dir: Path, metrics: Path) -> None:
    if not sampling:
        by_variant = params_lib.grpo_variants(params_lib.load(params), str(params))[0]
        if variant not in by_variant:
            raise typer.BadParameter(f"{params}: no grpo.variants.{variant} (have {sorted(by_variant)}; "
                                     "or pass --sampling)")
        sampling = by_variant[variant]
    if truncated not in ("mask", "keep"):
        raise typer.BadParameter(f"--truncated must be mask or keep, not {truncated!r}")
    dev = pick_device(device)
    seed_everything(seed)
    tok = tokenizer_lib.load(tokenizer_dir)
    df, ids = load_prompts(prompts, tok, "train", max_prompt_len)
    policy, meta = load_model(sft_dir, dev, tok.digest)
    ref, _ = load_model(sft_dir, dev, tok.digest)
    rm = RewardModel.load(rm_dir, dev)
    require_reward_signal(rm.head.weight, rm.reward_std, str(rm_dir))
    weights = sampling_weights(sampling, ref, ids, density_k, density_alpha, density_max_ratio, dev,
                               density_pooling)
    draws = torch.zeros(len(ids), dtype=torch.long)

    def draw(step: int, g: torch.Generator) -> torch.Tensor:
        idx = draw_prompts(weights, prompts_per_step, g)
        draws[idx] += 1
        return idx

    cfg = from_options(GRPOConfig, locals(), bf16=use_bf16(dtype, dev), mask_truncated=truncated == "mask")
    ess = effective_sample_size(weights)
    print(f"grpo {variant} seed {seed} ({sampling}): {len(ids)} train prompts, weight ESS {ess:.0f} ({ess / len(ids):.1%}), "
          f"{dev} in {'bf16' if cfg.bf16 else 'fp32'}")
    result = grpo_train(policy, ref, ids, draw,
                        lambda batch, s: score_samples(rm, batch, s, tok.bos_id, standardise=True), cfg, dev,
                        tok.assistant_end_id, tok.bos_id, extra_stats=lambda idx: {"weight_ess": ess},
                        name=f"grpo_{variant}_s{seed}")
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
         "truncated": truncated,
         "weight_ess": round(ess, 1), "weight_ess_frac": round(ess / len(ids), 4),
         "group_share_entropy": round(share_entropy(shares_w), 4),
         "drawn_group_share_entropy": round(share_entropy(shares_d), 4),
         "completion_tokens_per_s": round(result.completion_tokens / result.seconds, 1),
         "seconds": round(result.seconds, 1)}
    save_model(out_dir, policy.state_dict(), policy.config,
               {"tokenizer": tok.digest, "init": str(sft_dir), "variant": variant, "sampling": sampling, "seed": seed,
                "steps": len(log), "beta": beta})
    write_text(out_dir / "log.csv", log.drop(columns=["tokens_per_s", "sample_frac_time"]).to_csv(
        index=False, float_format="%.6g"))
    write_parquet(out_dir / "weights.parquet", pd.DataFrame(
        {"prompt_id": df["prompt_id"], "group": df["group"], "weight": weights.numpy(), "draws": draws.numpy()}))
    write_json(metrics, m)
    print(f"grpo {variant} seed {seed}: reward {m['reward_start']:+.3f} -> {m['reward_end']:+.3f} in {m['steps']} steps, "
          f"{m['completion_tokens_per_s']:.0f} completion tok/s")


if __name__ == "__main__":
    typer.run(main)
