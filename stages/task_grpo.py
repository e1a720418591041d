"""Stage task_grpo@<arm>-<seed>: one GRPO run of the task track from the task SFT model, on the task's train items (side
by side with the track's other stale runs on CPU: speedrun.runs). The arms (task.variants, those of task.run trained)
differ in how items are drawn (density-aware from the prompt text, uniform, cluster-balanced, or selected by the
policy's own rewards: speedrun.rl.selection), what is paid (the checker, RLVR; the checker's rewards shuffled within
each group, the negative control; or the reward model trained with the task pairs, the RLHF way, the checker then the
gold reward, never trained on) and how (GRPO's advantage or pass@k's, clip-higher, an entropy bonus, a bonus for right
values rare in their group). The log's gold_pass is the checker's share of right answers over each step's draws,
gold_distinct its distinct right values per group; rollouts counts the completions generated."""

import dataclasses

import pandas as pd
import torch

from speedrun.common import (read_json, stable_seed)
from speedrun.data import task
from speedrun.engine import completion_texts
from speedrun.reward.preference import RewardModel
from speedrun.rl.controls import rare_value_bonus, shuffle_within_groups
from speedrun.data.paraphrases import PARAPHRASES, nearest_share
from speedrun.rl.density import group_shares, neighbour_purity
from speedrun.rl.grpo import require_reward_signal
from speedrun.embeddings import prompt_embeddings
from speedrun.rl.prompts import load_prompts, pool_subset, sampling_weights
from speedrun.rl.rewards import score_samples
from speedrun.rl.trainer import grpo_train, log_means
from speedrun.rl.run import PromptDraws, finish_run, start_run
from speedrun.rl.selection import SELECTING, Gate, selector
from speedrun.stage import run_stage
from speedrun.train import distributed
from speedrun.train.checkpoint import load_model

READS = ("beta", "compute.nproc", "compute.device", "compute.dtype", "compute.decode", "compute.width_step",
         "compute.run_threads",
         "task.source", "task.train", "task.train_clusters", "task.density", "task.variants.{arm}")
PATHS = {"sft_dir": "outs/task_sft", "rm_dir": "outs/task_rm", "tokenizer_dir": "outs/task_base/tokenizer",
         "items": "data/task/items.parquet", "out_dir": "outs/task_grpo/{arm}_s{seed}",
         "metrics": "reports/metrics/task_grpo/{arm}_s{seed}.json"}
IDS = {"arm": str, "seed": int}  # run ids: the DVC foreach/matrix keys


def load_task_rm(rm_dir, device: str) -> RewardModel:
    """The reward model, refused when it never trained on the task pairs: the arm would follow a blind reward."""
    rm = RewardModel.load(rm_dir, device)
    require_reward_signal(rm.head.weight, rm.reward_std, str(rm_dir))
    kinds = read_json(rm_dir / "meta.json").get("train_kinds", [])
    if not {"all", "task"} & set(kinds):
        raise SystemExit(f"{rm_dir}: trained on pair kinds {kinds!r}, not on the task pairs: add task to "
                         "task.rm.train_kinds for the rm arm")
    return rm


def trained_clusters(df: pd.DataFrame, ids: list[list[int]], by_id: dict, clusters: list[str]
                     ) -> tuple[pd.DataFrame, list[list[int]]]:
    """The train items of `clusters` (empty: all), refused when a named cluster has none."""
    if not clusters:
        return df, ids
    have = {by_id[pid].cluster for pid in df["prompt_id"]}
    missing = [c for c in clusters if c not in have]
    if missing:
        raise SystemExit(f"task.train_clusters: no train item in {missing} (the items have {sorted(have)})")
    keep = [k for k, pid in enumerate(df["prompt_id"]) if by_id[pid].cluster in clusters]
    return df.iloc[keep].reset_index(drop=True), [ids[k] for k in keep]


def embedding_checks(density, model, tok, ids: list[list[int]], texts: list[str], groups: list[str], dev: str) -> dict:
    """How the density embedding places the train prompts: the share of each prompt's k nearest in its own cluster
    (text_neighbour_purity), and the share of the hand-written paraphrases of the trained clusters whose nearest
    train prompt is in their cluster (paraphrase_purity: by meaning, not by template words; data/paraphrases.py)."""
    paras = [(c, t) for c, ts in PARAPHRASES.items() if c in set(groups) for t in ts]
    para_ids = [tok.render_prompt([{"role": "user", "content": t}]) for _, t in paras]
    emb = prompt_embeddings(density.embedding, model, ids + para_ids, texts + [t for _, t in paras], dev).cpu()
    emb = emb.to_dense() if emb.layout == torch.sparse_csr else emb  # words / names: rows are sliced below
    train = emb[:len(ids)]
    return {"embedding": density.embedding,
            "text_neighbour_purity": round(neighbour_purity(train, groups, density.k), 4),
            "paraphrase_purity": round(nearest_share(train, emb[len(ids):], groups, [c for c, _ in paras]), 4)
            if paras else None}


def main(p, io, arm: str, seed: int) -> None:
    v = p.task.variants[arm]
    selects = v.sampling in SELECTING  # uniform draws, then the policy's rewards select: one process reads them all
    if selects and p.compute.nproc > 1:
        print(f"task_grpo {arm}: {v.sampling} reads each draw's rewards before the next draw: one process, not "
              f"compute.nproc {p.compute.nproc}")
    d, cfg, tok = start_run(p, io, p.task.train, "task.train", "stages.task_grpo", seed, v.entropy_bonus,
                            nproc=1 if selects else None)
    cfg = dataclasses.replace(cfg, advantage=v.advantage, clip_high=v.clip_high)
    dev = d.device
    by_id = {i.item_id: i for i in task.load_items(io.items)}
    clusters = p.task.train_clusters if p.task.source == "embedded" else []  # a hub task: every cluster
    df, ids = trained_clusters(*load_prompts(io.items, tok, "train", cfg.max_prompt_len), by_id, clusters)
    df, ids = pool_subset(df, ids, cfg.pool)
    items = [by_id[pid] for pid in df["prompt_id"]]
    policy, _ = load_model(io.sft_dir, dev, tok.digest)
    ref, _ = load_model(io.sft_dir, dev, tok.digest)
    rm = load_task_rm(io.rm_dir, dev) if v.reward == "rm" else None
    texts = [i.prompt() for i in items]
    groups = [i.cluster for i in items]
    weights = sampling_weights("uniform" if selects else v.sampling, ref, ids, texts, groups, p.task.density, dev, d,
                               where="task.density")
    threshold = 0.0 if v.reward == "rm" else 0.5  # a passing completion (speedrun.rl.selection)
    gate = Gate(len(ids), threshold) if v.sampling == "gate" else None
    draw = PromptDraws(weights, cfg.prompts_per_step, gate)
    select = selector(v.sampling, cfg.group_size, p.task.train.band, threshold, gate)
    trained = torch.zeros(len(ids), dtype=torch.long)  # each item's groups trained
    shuffler = torch.Generator().manual_seed(stable_seed(seed, "shuffled_reward"))
    gold_rows: list[float] = []  # the checker's share of right answers per draw, whatever the arm is paid
    distinct_rows: list[float] = []  # distinct right values per group, per draw

    def reward(batch: list[list[int]], s) -> torch.Tensor:  # this process's share of the step's prompts
        mine = draw.step_idx[distributed.rank_share(len(draw.step_idx), d)][s.prompt_index.cpu()]
        values = [task.check(items[i], t) for i, t in zip(mine.tolist(), completion_texts(s, tok))]
        gold = torch.tensor([float(x is not None) for x in values])
        rare = rare_value_bonus(values, cfg.group_size)  # sums to each group's distinct right values
        n_right = distributed.all_reduce_sum(gold.double().sum().to(dev), d)
        n_distinct = distributed.all_reduce_sum(rare.double().sum().to(dev), d)
        gold_rows.append(float(n_right) / (len(draw.step_idx) * cfg.group_size))
        distinct_rows.append(float(n_distinct) / len(draw.step_idx))
        if rm is not None:
            paid = score_samples(rm, batch, s, tok.bos_id, standardise=True)
        else:
            paid = shuffle_within_groups(gold, cfg.group_size, shuffler) if v.reward == "shuffled" else gold
        return paid + v.distinct_bonus * rare.to(paid.device) if v.distinct_bonus else paid

    def step_stats(idx: torch.Tensor) -> dict:  # the step's trained items; gold over every draw it generated
        trained[idx] += 1
        gold, distinct = sum(gold_rows) / len(gold_rows), sum(distinct_rows) / len(distinct_rows)
        gold_rows.clear()
        distinct_rows.clear()
        return {"gold_pass": gold, "gold_distinct": distinct}

    if d.is_main:
        print(f"task_grpo {arm} seed {seed} ({v.sampling}, reward {v.reward}, advantage {v.advantage}): {len(ids)} "
              f"train items, {d.world} process(es) on {dev} in {'bf16' if cfg.bf16 else 'fp32'}")
    result = grpo_train(policy, ref, ids, draw, reward, cfg, dev, tok.assistant_end_id, tok.bos_id,
                        extra_stats=step_stats, name=f"task_grpo_{arm}_s{seed}", stream="task_grpo", d=d,
                        select=select)  # arms share random numbers
    if not d.is_main:
        distributed.teardown()
        return
    log = pd.DataFrame(result.log)
    m = {"arm": arm, "sampling": v.sampling, "reward": v.reward, "advantage": v.advantage, "clip_high": v.clip_high,
         "entropy_bonus": v.entropy_bonus, "distinct_bonus": v.distinct_bonus, "seed": seed, "steps": len(log),
         # what the arm spent: every completion generated, and the groups that trained (a selection arm drops some)
         "rollouts": int(log["rollouts"].sum()), "groups_trained": int(log["groups_trained"].sum()),
         **({"gate_open_steps": gate.open_steps, "items_solved": int(gate.solved.sum())} if gate else {}),
         **log_means(log, start={"reward_start": ("reward_mean", 4), "gold_pass_start": ("gold_pass", 4),
                                 "gold_distinct_start": ("gold_distinct", 4)},
                     end={"reward_end": ("reward_mean", 4), "gold_pass_end": ("gold_pass", 4), "kl_end": ("kl", 5),
                          "gold_distinct_end": ("gold_distinct", 4), "completion_len_end": ("completion_len", 2)}),
         "cluster_share_weights": {g: round(x, 4) for g, x in group_shares(weights, groups).items()},
         "cluster_share_draws": {g: round(x, 4) for g, x in group_shares(draw.counts.double() / draw.counts.sum(),
                                                                          groups).items()},
         "cluster_share_trained": {g: round(x, 4) for g, x in group_shares(
             trained.double() / max(1, int(trained.sum())), groups).items()},
         **(embedding_checks(p.task.density, ref, tok, ids, texts, groups, dev) if v.sampling == "density" else {}),
         "completion_tokens_per_s": round(result.completion_tokens / result.seconds, 1),
         "seconds": round(result.seconds, 1)}
    finish_run(io, policy, {"tokenizer": tok.digest, "init": str(io.sft_dir), "arm": arm, "seed": seed,
                            "steps": len(log), "beta": p.beta}, log, df, draw, m,
               f"task_grpo {arm} seed {seed}: reward {m['reward_start']:+.3f} -> {m['reward_end']:+.3f}, gold pass "
               f"{m['gold_pass_start']:.3f} -> {m['gold_pass_end']:.3f} in {m['steps']} steps ({m['seconds']:.0f} s)")


if __name__ == "__main__":  # one bare run (`speedrun <stage>` runs it beside the track's other stale runs)
    run_stage(main, __doc__, READS, PATHS, IDS)
