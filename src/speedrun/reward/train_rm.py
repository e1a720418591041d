"""The preference reward model recipe (stage train_rm): SFT trunk + scalar head, Bradley-Terry loss.

Trains on the 'train' split of the pair files and picks its best checkpoint on the 'val' split (modules SFT also
only validated on; dedup keeps near-duplicates on one side). The 'eval' split, the diversity evaluation's prompts,
is never read here. Val accuracy is reported per pair kind beside a word-overlap baseline
and beside the SFT model's own preference (log p(chosen) > log p(rejected)): does the trunk know the answers at all?"""
from __future__ import annotations

from pathlib import Path

import torch

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import UserError, seed_everything, write_json
from speedrun.reward import preference as pref
from speedrun.train.checkpoint import load_model, save_model
from speedrun.train.data import StepSampler
from speedrun.train.distributed import Dist
from speedrun.config import RMConfig
from speedrun.train.loop import autocast, train
from speedrun.train.outputs import write_logs


def train_reward_model(pairs: list[Path], init_dir: Path, tokenizer_dir: Path, cfg: RMConfig, seed: int,
                       d: Dist, scratch_dir: Path, out_dir: Path, metrics_path: Path, fingerprint: str) -> dict | None:
    """Train, keep the best checkpoint, score every val pair of every kind; the main process writes out_dir
    (model.pt, meta.json, log.csv, eval.csv) and the metrics JSON and returns the metrics (None elsewhere)."""
    r = cfg
    if r.train_last_blocks < 0 or r.max_len < pref.MIN_RESPONSE_TOKENS + 3:
        raise ValueError(f"need train_last_blocks >= 0 and max_len >= {pref.MIN_RESPONSE_TOKENS + 3}")
    tok = tokenizer_lib.load(tokenizer_dir)
    split = pref.split_pairs(pref.load_pairs(*pairs), tok, r.max_len)
    (train_pairs, train_skipped, train_cut), (val, val_skipped, val_cut) = split["train"], split["val"]
    train_pairs, not_trained = pref.select_kinds(train_pairs, r.train_kinds)
    val_trained, _ = pref.select_kinds(val, r.train_kinds)
    if not train_pairs["id"] or not val_trained["id"]:
        raise UserError(f"{', '.join(map(str, pairs))}: no usable 'train' and 'val' pairs of kinds "
                         f"{', '.join(map(repr, r.train_kinds))} (train pairs left out by kind: {not_trained}; "
                         f"skipped: train {train_skipped}, val {val_skipped})")
    n_val = len(val_trained["id"])
    picked = sorted({i * n_val // r.eval_pairs for i in range(r.eval_pairs)}) if 0 < r.eval_pairs < n_val \
        else range(n_val)
    val_periodic = {k: [v[i] for i in picked] for k, v in val_trained.items()}
    seed_everything(seed)
    gpt, init_meta = load_model(init_dir, d.device, tok.digest)
    if d.is_main:  # does the SFT model itself give the right answer a higher likelihood? (what its trunk knows)
        with autocast(d.device, cfg.bf16):
            lm = pref.response_logprob(gpt, val["chosen"] + val["rejected"], val["prompt_len"] * 2, device=d.device)
        sft_margin = lm[:len(val["id"])] - lm[len(val["id"]):]
    rm = pref.RewardModel.from_gpt(gpt, r.pool)
    del gpt
    rm.max_len, rm.end_id = r.max_len, None if r.read_end else tok.assistant_end_id
    pref.freeze(rm, r.train_last_blocks)
    sampler = StepSampler(len(train_pairs["id"]), r.batch_size, r.micro_batch, seed, "rm")
    n_trained = sum(p.numel() for p in rm.parameters() if p.requires_grad)
    if d.is_main:
        print(f"rm: {len(train_pairs['id'])} train pairs of kinds {r.train_kinds} (left out: {not_trained}) / "
              f"{len(val['id'])} val pairs ({len(picked)} of the trained kinds per periodic eval; "
              f"skipped train {train_skipped}, eval {val_skipped}), training {n_trained / 1e6:.2f}M of "
              f"{rm.trunk.num_params() / 1e6:.2f}M params (last {r.train_last_blocks} blocks + head), "
              f"{d.world} process(es) on {d.device} in {'bf16' if cfg.bf16 else 'fp32'}")
    result = train(rm, cfg, pref.pair_batch_fn(train_pairs, sampler, r.micro_tokens),
                   lambda m: pref.evaluate(m, val_periodic, 64, d.device)[0], d, scratch=scratch_dir,
                   fingerprint=fingerprint,
                   loss_fn=pref.bt_loss_sum, name="rm")
    if not d.is_main:
        return None
    rm.load_state_dict(result.best_state)
    rm.eval()
    with autocast(d.device, cfg.bf16):
        val_metrics, rc, rr = pref.evaluate(rm, val, 64, d.device)
    rewards = torch.cat([rc, rr])  # every val response: the scale GRPO standardises with
    baseline = torch.tensor(pref.overlap_baseline(val["prompt"], val["chosen_text"], val["rejected_text"]))
    kinds = pref.by_kind(val["kind"], acc=pref.correct(rc - rr), margin=rc - rr, baseline_acc=baseline,
                         sft_logprob_acc=pref.correct(sft_margin))
    m = {"val_acc": kinds["all"]["acc"], "val_margin": kinds["all"]["margin"],
         "val_loss": round(val_metrics["val_loss"], 5), "baseline_acc": kinds["all"]["baseline_acc"],
         "sft_logprob_acc": kinds["all"]["sft_logprob_acc"], "by_kind": kinds,
         "reward_mean": round(float(rewards.mean()), 6), "reward_std": round(float(rewards.std()), 6),
         "val_split": "val", "train_pairs": len(train_pairs["id"]), "val_pairs": len(val["id"]),
         "train_kinds": r.train_kinds, "train_pairs_left_out": not_trained,
         "skipped": {"train": train_skipped, "val": val_skipped},
         "cut_to_max_len": {"train": train_cut, "val": val_cut},
         "pool": r.pool, "read_end": r.read_end, "train_last_blocks": r.train_last_blocks,
         "trained_params": n_trained,
         "steps": result.steps_done,
         "best_step": result.best_step, "stopped_early": result.stopped_early, "pairs_seen": result.tokens,
         "pairs_per_s": round(result.tokens / max(result.train_seconds, 1e-9), 1)}
    val_keys = ("val_acc", "val_margin", "val_loss", "baseline_acc", "sft_logprob_acc", "by_kind")
    meta = {"tokenizer": tok.digest, "step": result.best_step, "init": str(init_dir), "max_len": r.max_len,
            "train_kinds": r.train_kinds, "pool": r.pool, "end_id": rm.end_id,
            "train_last_blocks": r.train_last_blocks, "reward_mean": m["reward_mean"],
            "reward_std": m["reward_std"], "val": {k: m[k] for k in val_keys}}
    if m["best_step"] == 0:
        print("rm: WARNING: no eval beat the untrained model (zero head, every reward equal): this RM is constant")
    save_model(out_dir, result.best_state, rm.config, meta)
    write_logs(out_dir, result)
    write_json(metrics_path, m)
    for k, v in kinds.items():
        print(f"rm val {k} ({v['pairs']} pairs): acc {v['acc']:.3f}, margin {v['margin']:.3f} | word-overlap "
              f"baseline {v['baseline_acc']:.3f} | SFT log-likelihood {v['sft_logprob_acc']:.3f}")
    print(f"rm: val acc {m['val_acc']:.3f} after {m['steps']} steps (best at {m['best_step']}), "
          f"rewards {m['reward_mean']:.3f} ± {m['reward_std']:.3f}")
    return m
