"""Stage train_rm: the preference reward model (SFT trunk + scalar head, Bradley-Terry loss) -> outs/rm/.

Trains on the 'train' split of data/prompts/pairs.parquet. Validates on the pairs of the held-out 'eval' prompts:
they are never trained on (they only pick the best of a few checkpoints), dedup keeps near-duplicates on one
side, and they are the prompts whose rewards the diversity evaluation reads. Val accuracy is reported per negative
kind beside a word-overlap baseline and beside the SFT model's own preference (log p(chosen) > log p(rejected)),
which says whether the trunk knows the answers at all."""
from pathlib import Path

import torch
import typer

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import pick_device, DTYPE_HELP, use_bf16, seed_everything, stable_hash, write_json
from speedrun.reward import preference as pref
from speedrun.train import distributed
from speedrun.train.checkpoint import load_model, save_model
from speedrun.train.data import StepSampler
from speedrun.train.loop import TrainConfig, autocast, train
from speedrun.train.outputs import write_logs
from speedrun.params import param_default


def main(
    pairs: list[Path] = typer.Option([Path("data/prompts/pairs.parquet"), Path("data/onpolicy/pairs.parquet")],
                                     help="pair files with prompt_id and train/eval split, trained on as one "
                                          "(repeat the option: dedup's pairs and the on-policy pairs)"),
    init_dir: Path = typer.Option(Path("outs/sft"), help="checkpoint whose trunk the RM starts from"),
    tokenizer_dir: Path = typer.Option(Path("outs/tokenizer"), help="trained tokenizer"),
    pool: str = typer.Option(param_default("rm.pool"),
                             help="last: the head reads the last token | mean: the mean of per-token "
                                  "scores over the response"),
    train_kinds: str = typer.Option(param_default("rm.train_kinds"),
                                    help="comma list of the pair kinds trained on (sft_sample, hard, "
                                         "random, hh, uf, se) or all; every kind of the eval split is "
                                         "scored at the end, only these pick the best checkpoint"),
    train_last_blocks: int = typer.Option(param_default("rm.train_last_blocks"),
                                          help="trunk blocks trained, counted from the top (0 = head only; "
                                               ">= depth = the whole trunk, embedding included)"),
    max_len: int = typer.Option(param_default("rm.max_len"),
                                help="prompt+response tokens; longer responses are cut, keeping the last"),
    steps: int = typer.Option(param_default("rm.steps"), help="optimizer steps (at most)"),
    batch_size: int = typer.Option(param_default("rm.batch_size"),
                                   help="pairs per optimizer step, all processes together"),
    micro_batch: int = typer.Option(0, help="pairs per forward per process (0 = the whole share)"),
    micro_tokens: int = typer.Option(4096, help="re-cut micro-batches by length to at most this many padded "
                                               "tokens (same gradient, less padding; 0 = off)"),
    lr: float = typer.Option(param_default("rm.lr"), help="peak AdamW learning rate"),
    weight_decay: float = typer.Option(0.0, help="AdamW weight decay on matrices"),
    warmup_steps: int = typer.Option(param_default("rm.warmup_steps"), help="linear warmup steps"),
    final_lr_frac: float = typer.Option(0.1, help="lr at the last step as a fraction of the peak"),
    grad_clip: float = typer.Option(1.0, help="max gradient norm"),
    eval_every: int = typer.Option(param_default("rm.eval_every"), help="steps between val evaluations"),
    eval_pairs: int = typer.Option(param_default("rm.eval_pairs"),
                                   help="val pairs per periodic evaluation, evenly spaced over the file "
                                        "(0 = all); the final metrics score every val pair"),
    patience: int = typer.Option(param_default("rm.patience"),
                                 help="evals without improvement before stopping (0 = off)"),
    min_delta: float = typer.Option(param_default("rm.min_delta"),
                                    help="improvement in val BT loss that resets patience"),
    save_every: int = typer.Option(param_default("rm.save_every"),
                                   help="steps between scratch (resume) checkpoints; 0 = off"),
    scratch_dir: Path = typer.Option(Path("scratch/rm"), help="resume state (not a DVC out)"),
    seed: int = typer.Option(param_default("seed"), help="seed of data order"),
    device: str = typer.Option(param_default("compute.device"), help="auto | cpu | cuda"),
    dtype: str = typer.Option(param_default("compute.dtype"), help=DTYPE_HELP),
    nproc: int = typer.Option(param_default("compute.nproc"), help="processes (torchrun) for DDP; 1 = plain python"),
    out_dir: Path = typer.Option(Path("outs/rm"), help="model.pt, meta.json, log.csv, eval.csv"),
    metrics: Path = typer.Option(Path("reports/metrics/rm.json"), help="metrics JSON"),
) -> None:
    if train_last_blocks < 0 or max_len <= pref.MIN_RESPONSE_TOKENS:
        raise typer.BadParameter(f"need --train-last-blocks >= 0 and --max-len > {pref.MIN_RESPONSE_TOKENS}")
    distributed.maybe_relaunch(nproc, "stages.train_rm")
    d = distributed.setup(pick_device(device))
    bf16 = use_bf16(dtype, d.device)
    tok = tokenizer_lib.load(tokenizer_dir)
    df = pref.load_pairs(*pairs)
    split = pref.split_pairs(df, tok, max_len)
    (train_pairs, train_skipped, train_cut), (val, val_skipped, val_cut) = split["train"], split["eval"]
    train_pairs, not_trained = pref.select_kinds(train_pairs, train_kinds)
    val_trained, _ = pref.select_kinds(val, train_kinds)
    if not train_pairs["id"] or not val_trained["id"]:
        raise ValueError(f"{', '.join(map(str, pairs))}: no usable 'train' and 'eval' pairs of kinds {train_kinds!r} "
                         f"(train pairs left out by kind: {not_trained}; skipped: train {train_skipped}, "
                         f"eval {val_skipped})")
    n_val = len(val_trained["id"])
    picked = sorted({i * n_val // eval_pairs for i in range(eval_pairs)}) if 0 < eval_pairs < n_val else range(n_val)
    val_periodic = {k: [v[i] for i in picked] for k, v in val_trained.items()}
    seed_everything(seed)
    gpt, init_meta = load_model(init_dir, d.device, tok.digest)
    if d.is_main:  # does the SFT model itself give the right answer a higher likelihood? (what its trunk knows)
        with autocast(d.device, bf16):
            lm = pref.response_logprob(gpt, val["chosen"] + val["rejected"], val["prompt_len"] * 2,
                                     device=d.device)
        sft_margin = lm[:len(val["id"])] - lm[len(val["id"]):]
    rm = pref.RewardModel.from_gpt(gpt, pool)
    del gpt
    rm.max_len = max_len
    pref.freeze(rm, train_last_blocks)
    cfg = TrainConfig(steps=steps, lr=lr, weight_decay=weight_decay, warmup_steps=warmup_steps,
                      final_lr_frac=final_lr_frac, grad_clip=grad_clip, eval_every=eval_every, patience=patience,
                      min_delta=min_delta, save_every=save_every, bf16=bf16, monitor="val_loss")
    sampler = StepSampler(len(train_pairs["id"]), batch_size, micro_batch, seed, "rm")
    n_trained = sum(p.numel() for p in rm.parameters() if p.requires_grad)
    if d.is_main:
        print(f"rm: {len(train_pairs['id'])} train pairs of kinds {train_kinds} (left out: {not_trained}) / "
              f"{len(val['id'])} val pairs ({len(picked)} of the trained kinds per periodic eval; "
              f"skipped train {train_skipped}, "
              f"eval {val_skipped}), training {n_trained / 1e6:.2f}M of {rm.trunk.num_params() / 1e6:.2f}M params "
              f"(last {train_last_blocks} blocks + head), {d.world} process(es) on {d.device} "
              f"in {'bf16' if bf16 else 'fp32'}")
    result = train(rm, cfg, pref.pair_batch_fn(train_pairs, sampler, micro_tokens),
                   lambda m: pref.evaluate(m, val_periodic, 64, d.device)[0], d, scratch=scratch_dir,
                   fingerprint=f"rm|{tok.digest}|{init_meta}|{stable_hash(*train_pairs['id'])}|{max_len}|"
                               f"{train_last_blocks}|{seed}|{batch_size}|{pool}|{train_kinds}",
                   loss_fn=pref.bt_loss_sum, name="rm")
    if d.is_main:
        rm.load_state_dict(result.best_state)
        rm.eval()
        with autocast(d.device, bf16):
            val_metrics, rc, rr = pref.evaluate(rm, val, 64, d.device)
        rewards = torch.cat([rc, rr])  # every val response: the scale GRPO standardises with
        baseline = torch.tensor(pref.overlap_baseline(val["prompt"], val["chosen_text"], val["rejected_text"]))
        kinds = pref.by_kind(val["kind"], acc=pref.correct(rc - rr), margin=rc - rr, baseline_acc=baseline,
                             sft_logprob_acc=pref.correct(sft_margin))
        m = {"val_acc": kinds["all"]["acc"], "val_margin": kinds["all"]["margin"],
             "val_loss": round(val_metrics["val_loss"], 5), "baseline_acc": kinds["all"]["baseline_acc"],
             "sft_logprob_acc": kinds["all"]["sft_logprob_acc"], "by_kind": kinds,
             "reward_mean": round(float(rewards.mean()), 6), "reward_std": round(float(rewards.std()), 6),
             "val_split": "eval", "train_pairs": len(train_pairs["id"]), "val_pairs": len(val["id"]),
             "train_kinds": train_kinds, "train_pairs_left_out": not_trained,
             "skipped": {"train": train_skipped, "eval": val_skipped},
             "truncated_responses": {"train": train_cut, "eval": val_cut},
             "pool": pool, "train_last_blocks": train_last_blocks, "trained_params": n_trained,
             "steps": result.steps_done,
             "best_step": result.best_eval["step"], "stopped_early": result.stopped_early, "pairs_seen": result.tokens,
             "pairs_per_s": round(result.tokens / max(result.train_seconds, 1e-9), 1)}
        val_keys = ("val_acc", "val_margin", "val_loss", "baseline_acc", "sft_logprob_acc", "by_kind")
        meta = {"tokenizer": tok.digest, "step": result.steps_done, "init": str(init_dir), "max_len": max_len,
                "pool": pool,
                "train_last_blocks": train_last_blocks, "reward_mean": m["reward_mean"],
                "reward_std": m["reward_std"], "val": {k: m[k] for k in val_keys}}
        if m["best_step"] == 0:
            print("rm: WARNING: no eval beat the untrained model (zero head, every reward equal): this RM is constant")
        save_model(out_dir, result.best_state, rm.config, meta)
        write_logs(out_dir, result)
        write_json(metrics, m)
        for k, v in kinds.items():
            print(f"rm val {k} ({v['pairs']} pairs): acc {v['acc']:.3f}, margin {v['margin']:.3f} | word-overlap "
                  f"baseline {v['baseline_acc']:.3f} | SFT log-likelihood {v['sft_logprob_acc']:.3f}")
        print(f"rm: val acc {m['val_acc']:.3f} after {m['steps']} steps (best at {m['best_step']}), "
              f"rewards {m['reward_mean']:.3f} ± {m['reward_std']:.3f}")
    distributed.teardown()


if __name__ == "__main__":
    typer.run(main)
