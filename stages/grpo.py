"""Stage grpo@<arm>-<seed>: one GRPO run from the SFT model against the reward model (side by side with the track's
other stale runs on CPU: speedrun.runs). The arms (params.yaml grpo.variants, those of grpo.run trained) differ in
how prompts are drawn (density-aware, uniform, group-balanced) and, for the controls, in what is rewarded (a planted
tic, shuffled rewards, an entropy bonus, a bonus for distinct answers); runs of an arm only in the training seed
(grpo.seeds). A run takes about a minute on CPU and keeps no resume state: an interrupted run starts over."""

import pandas as pd
import torch

from speedrun.engine import completion_texts
from speedrun.common import stable_seed
from speedrun.reward.preference import RewardModel
from speedrun.rl.controls import dense_groups, distinctness, plant_tic, shuffle_rewards
from speedrun.rl.density import effective_sample_size, group_shares, share_entropy
from speedrun.rl.grpo import require_reward_signal
from speedrun.rl.prompts import load_prompts, pool_subset, sampling_weights
from speedrun.rl.rewards import score_samples
from speedrun.rl.trainer import grpo_train, log_means
from speedrun.rl.run import PromptDraws, finish_run, start_run
from speedrun.stage import run_stage
from speedrun.train import distributed
from speedrun.train.checkpoint import load_model

# not `seed` (the run's seed is its id) nor grpo.seeds: adding a seed leaves the other runs as they are
READS = ("beta", "compute.nproc", "compute.device", "compute.dtype", "compute.decode", "compute.width_step",
         "compute.run_threads",
         "grpo.train", "grpo.density", "grpo.controls",
         "grpo.variants.{arm}")
PATHS = {"sft_dir": "outs/sft", "rm_dir": "outs/rm", "tokenizer_dir": "outs/base/tokenizer",
         "prompts": "data/prompts/prompts.parquet", "out_dir": "outs/grpo/{arm}_s{seed}",
         "metrics": "reports/metrics/grpo/{arm}_s{seed}.json"}
IDS = {"arm": str, "seed": int}  # run ids: the DVC foreach/matrix keys


def main(p, io, arm: str, seed: int) -> None:
    v = p.grpo.variants[arm]
    sampling = v.sampling
    d, cfg, tok = start_run(p, io, p.grpo.train, "grpo.train", "stages.grpo", seed, v.entropy_bonus)
    dev = d.device
    df, ids = load_prompts(io.prompts, tok, "train", cfg.max_prompt_len)
    df, ids = pool_subset(df, ids, cfg.pool)
    policy, meta = load_model(io.sft_dir, dev, tok.digest)
    ref, _ = load_model(io.sft_dir, dev, tok.digest)
    rm = RewardModel.load(io.rm_dir, dev)
    require_reward_signal(rm.head.weight, rm.reward_std, str(io.rm_dir))
    texts = [msgs[-1]["content"] for msgs in df["prompt"]]
    groups = df["group"].tolist()
    weights = sampling_weights(sampling, ref, ids, texts, groups, p.grpo.density, dev, d, where="grpo.density")
    draw = PromptDraws(weights, cfg.prompts_per_step)
    dense = dense_groups(groups, p.grpo.controls.dense_modules)
    in_scope = torch.tensor([v.tic_scope == "all" or g in dense for g in groups])
    shuffler = torch.Generator().manual_seed(stable_seed(seed, "shuffled_reward"))
    tic_rows: list[float] = []
    distinct_rows: list[float] = []  # the step's mean distinctness: the bonus arm's manipulation, every arm's trace

    def reward(batch: list[list[int]], s) -> torch.Tensor:  # this process's share of the step's prompts
        r = score_samples(rm, batch, s, tok.bos_id, standardise=True)
        if v.reward == "shuffled":  # (across processes: within each process's share)
            r = shuffle_rewards(r, shuffler)
        eligible = in_scope[draw.step_idx[distributed.rank_share(len(draw.step_idx), d)]][s.prompt_index.cpu()]
        texts = completion_texts(s, tok)
        r, has = plant_tic(r, texts, p.grpo.controls.tic, v.tic_bonus, eligible)
        n_tic = distributed.all_reduce_sum(has.double().sum().to(dev), d)  # over every process's completions
        tic_rows.append(float(n_tic) / (len(draw.step_idx) * cfg.group_size))
        far = distinctness(texts, cfg.group_size)  # a process holds whole groups (its share of the step's prompts)
        r = r + v.distinct_bonus * far.to(r.dtype) if v.distinct_bonus else r
        distinct_rows.append(float(distributed.all_reduce_sum(far.double().sum().to(dev), d))
                             / (len(draw.step_idx) * cfg.group_size))
        return r

    ess = effective_sample_size(weights)
    if d.is_main:
        print(f"grpo {arm} seed {seed} ({sampling}, reward {v.reward}, tic bonus {v.tic_bonus} on "
              f"{v.tic_scope}, entropy bonus {v.entropy_bonus}, distinct bonus {v.distinct_bonus}): "
              f"{len(ids)} train prompts, weight ESS {ess:.0f} "
              f"({ess / len(ids):.1%}), {d.world} process(es) on {dev} in {'bf16' if cfg.bf16 else 'fp32'}")
    result = grpo_train(policy, ref, ids, draw, reward, cfg, dev, tok.assistant_end_id, tok.bos_id,
                        extra_stats=lambda idx: {"weight_ess": ess, "tic_share": tic_rows[-1],
                                                 "distinctness": distinct_rows[-1]},
                        name=f"grpo_{arm}_s{seed}", stream="grpo", d=d)  # every arm: the same random numbers
    if not d.is_main:
        distributed.teardown()
        return
    log = pd.DataFrame(result.log)
    shares_w = group_shares(weights, groups)
    draws = draw.counts
    shares_d = group_shares(draws.double() / draws.sum(), groups)
    m = {"arm": arm, "sampling": sampling, "seed": seed, "steps": len(log), "truncated": cfg.truncated,
         **log_means(log, start={"reward_start": ("reward_mean", 4), "tic_share_start": ("tic_share", 4),
                                 "distinctness_start": ("distinctness", 4)},
                     end={"reward_end": ("reward_mean", 4), "kl_end": ("kl", 5),
                          "completion_len_end": ("completion_len", 2), "truncated_frac_end": ("truncated_frac", 4),
                          "tic_share_end": ("tic_share", 4), "distinctness_end": ("distinctness", 4)}),
         "epochs": round(float(draws.sum()) / len(ids), 4), "draws_per_prompt_max": int(draws.max()),
         "weight_ess": round(ess, 1), "weight_ess_frac": round(ess / len(ids), 4),
         "group_share_entropy": round(share_entropy(shares_w), 4),
         "drawn_group_share_entropy": round(share_entropy(shares_d), 4),
         "completion_tokens_per_s": round(result.completion_tokens / result.seconds, 1),
         "seconds": round(result.seconds, 1)}
    finish_run(io, policy, {"tokenizer": tok.digest, "init": str(io.sft_dir), "arm": arm, "sampling": sampling,
                            "seed": seed, "steps": len(log), "beta": p.beta}, log, df, draw, m,
               f"grpo {arm} seed {seed}: reward {m['reward_start']:+.3f} -> {m['reward_end']:+.3f} in "
               f"{m['steps']} steps, {m['completion_tokens_per_s']:.0f} completion tok/s")


if __name__ == "__main__":  # one bare run (`speedrun <stage>` runs it beside the track's other stale runs)
    run_stage(main, __doc__, READS, PATHS, IDS)
