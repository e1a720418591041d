"""Stage grpo@<variant>-<seed>: one GRPO run from the SFT model against the reward model. Variants differ only
in how prompts are drawn (density-aware or uniform; params.yaml grpo.variants), runs of a variant only in the
training seed (grpo.seeds)."""
from pathlib import Path

import pandas as pd
import torch
import typer

from speedrun import params as params_lib
from speedrun import tokenizer as tokenizer_lib
from speedrun.common import pick_device, DTYPE_HELP, use_bf16, seed_everything, write_json, write_parquet, write_text
from speedrun.reward.preference import RewardModel
from speedrun.rl.rewards import score_samples
from speedrun.rl.density import draw_prompts, effective_sample_size, group_shares, share_entropy
from speedrun.rl.prompts import load_prompts, sampling_weights
from speedrun.rl.grpo import require_reward_signal
from speedrun.rl.trainer import GRPOConfig, grpo_train
from speedrun.train.checkpoint import load_model, save_model
from speedrun.params import param_default


def main(
    variant: str = typer.Option("density", help="variant name in --params' grpo.variants (its prompt sampling)"),
    sampling: str = typer.Option("", help="density (∝ kNN distance^alpha) | uniform; empty = the variant's"),
    params: Path = typer.Option(Path("params.yaml"), help="where the variants are defined"),
    sft_dir: Path = typer.Option(Path("outs/sft"), help="policy init and frozen reference"),
    rm_dir: Path = typer.Option(Path("outs/rm"), help="reward model"),
    tokenizer_dir: Path = typer.Option(Path("outs/tokenizer"), help="trained tokenizer"),
    prompts: Path = typer.Option(Path("data/prompts/prompts.parquet"), help="deduplicated prompts (train split used)"),
    max_prompt_len: int = typer.Option(128, help="prompts are cut to their last N tokens"),
    steps: int = typer.Option(param_default("grpo.steps"), help="GRPO steps"),
    prompts_per_step: int = typer.Option(param_default("grpo.prompts_per_step"), help="B: prompts drawn per step"),
    group_size: int = typer.Option(param_default("grpo.group_size"), help="G: completions sampled per prompt"),
    max_new_tokens: int = typer.Option(param_default("grpo.max_new_tokens"), help="completion token budget"),
    temperature: float = typer.Option(param_default("grpo.temperature"),
                                      help="sampling temperature (the loss uses the same distribution)"),
    top_k: int = typer.Option(0, help="top-k sampling (0 = off)"),
    top_p: float = typer.Option(param_default("grpo.top_p"), help="nucleus sampling mass (1 = off)"),
    lr: float = typer.Option(param_default("grpo.lr"), help="AdamW learning rate"),
    beta: float = typer.Option(param_default("beta"), help="KL coefficient (k3 estimator) against the SFT reference"),
    clip_eps: float = typer.Option(param_default("grpo.clip_eps"), help="PPO-style ratio clip"),
    inner_updates: int = typer.Option(param_default("grpo.inner_updates"),
                                      help="mu: gradient passes over each sampled batch"),
    adv_scale: str = typer.Option(param_default("grpo.adv_scale"), help="group | batch | none (Dr. GRPO)"),
    truncated: str = typer.Option(param_default("grpo.truncated"),
                                  help="completions that hit --max-new-tokens without the stop token: "
                                       "keep (in the loss) | mask (out of the loss; they still count in "
                                       "their group's advantages)"),
    density_k: int = typer.Option(param_default("grpo.density_k"), help="neighbours for the density estimate"),
    density_alpha: float = typer.Option(param_default("grpo.density_alpha"), help="weight ∝ distance^alpha"),
    density_max_ratio: float = typer.Option(param_default("grpo.density_max_ratio"),
                                            help="max/min weight ratio after clipping"),
    density_pooling: str = typer.Option(param_default("grpo.density_pooling"),
                                        help="prompt embedding: idf-weighted (template tokens shared by "
                                             "most prompts weigh ~0) or plain mean of the hidden states"),
    seed: int = typer.Option(1, help="training seed: policy sampling and prompt draws (one run per grpo.seeds)"),
    device: str = typer.Option(param_default("compute.device"), help="auto | cpu | cuda"),
    dtype: str = typer.Option(param_default("compute.dtype"), help=DTYPE_HELP),
    out_dir: Path = typer.Option(Path("outs/grpo/density_s1"), help="model.pt, meta.json, log.csv, weights.parquet"),
    metrics: Path = typer.Option(Path("reports/metrics/grpo/density_s1.json"), help="metrics JSON"),
) -> None:
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

    cfg = GRPOConfig(steps=steps, prompts_per_step=prompts_per_step, group_size=group_size,
                     max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, lr=lr,
                     beta=beta, clip_eps=clip_eps, inner_updates=inner_updates, adv_scale=adv_scale, seed=seed,
                     bf16=use_bf16(dtype, dev), mask_truncated=truncated == "mask")
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
