"""The discriminator recipe of stage adv_rm@i: which tokens of a window did policy i-1 write? Trained on its trunk.

The frozen blocks run once per sequence (their outputs are cached), so only the trained top and the head run per
step."""
from __future__ import annotations

from pathlib import Path

import torch

from speedrun import tokenizer as tokenizer_lib
from speedrun.adversarial import data as adv
from speedrun.common import read_json, read_parquet, seed_everything, write_json
from speedrun.reward.discriminator import Discriminator, metrics, save_discriminator
from speedrun.train.checkpoint import load_model
from speedrun.train.data import StepSampler
from speedrun.train.distributed import Dist
from speedrun.config_tracks import DiscConfig
from speedrun.train.loop import autocast, train
from speedrun.train.outputs import write_logs


@torch.no_grad()
def logits_of(disc: Discriminator, x: torch.Tensor, device: str, bf16: bool, batch_size: int = 64) -> torch.Tensor:
    with autocast(device, bf16):
        return torch.cat([disc.from_prefix(x[i:i + batch_size].to(device)).float().cpu()
                          for i in range(0, len(x), batch_size)])


def train_discriminator(init_dir: Path, data_dir: Path, tokenizer_dir: Path, cfg: DiscConfig, cycle: str,
                        seed: int, device: str, out_dir: Path) -> dict:
    """Train on data_dir/{train,val}.parquet, keep the best checkpoint; writes out_dir (model.pt, meta.json,
    log.csv, eval.csv, metrics.json) and returns the metrics."""
    r = cfg
    tok = tokenizer_lib.load(tokenizer_dir)
    n = read_json(data_dir / "stats.json")["seq_len"]
    split = {s: adv.load_split(read_parquet(data_dir / f"{s}.parquet"), n, str(data_dir / f"{s}.parquet"))
             for s in ("train", "val")}
    trunk, _ = load_model(init_dir, device, tok.digest)
    seed_everything(seed)
    disc = Discriminator(trunk, r.head, r.train_last_blocks, n).to(device)
    with autocast(device, cfg.bf16):  # the frozen part runs once per sequence, not once per step
        x = {s: torch.cat([disc.prefix(t[i:i + 64].to(device)).float().cpu() for i in range(0, len(t), 64)])
             for s, (t, *_) in split.items()}
    # targets: per-token labels for the token head, K/N per sequence for the pooled head
    y = {s: (lab if r.head == "token" else k.float() / n) for s, (_, lab, k, _) in split.items()}
    _, _, val_k, val_pure = split["val"]

    def eval_fn(m: Discriminator) -> dict[str, float]:
        logits = logits_of(m, x["val"], device, cfg.bf16)
        loss = float(m.loss_sum(logits, y["val"])) / y["val"].numel()
        return {"val_loss": loss, "val_mae_k_frac": metrics(logits, val_k, val_pure, n)["mae_k_frac"]}

    sampler = StepSampler(len(x["train"]), r.batch_size, 0, seed, f"adv_rm{cycle}")
    batch_fn = lambda step, rank, world: [(x["train"][ids], y["train"][ids])  # noqa: E731
                                          for ids in sampler.items(step, rank, world)]
    print(f"adv_rm@{cycle}: {r.head} head, {r.train_last_blocks} trainable blocks, "
          f"{sum(p.numel() for p in disc.parameters() if p.requires_grad):,} trainable params, "
          f"{len(x['train'])} train / {len(x['val'])} val sequences of {n}")
    result = train(disc, cfg, batch_fn, eval_fn, Dist(0, 1, device),
                   loss_fn=lambda m, xb, yb: m.loss_sum(m.from_prefix(xb), yb), log_every=50,
                   name=f"adv_rm@{cycle}")
    disc.load_state_dict(result.best_state)
    m = {"cycle": cycle, "init": str(init_dir), "head": r.head, "train_last_blocks": r.train_last_blocks,
         "steps": result.steps_done, "stopped_early": result.stopped_early, "best_step": result.best_step,
         "val_loss": round(result.best_eval["val_loss"], 5), "train_rows": len(x["train"]), "val_rows": len(x["val"]),
         **{k: (round(v, 5) if isinstance(v, float) else v)
            for k, v in metrics(logits_of(disc, x["val"], device, cfg.bf16), val_k, val_pure, n).items()}}
    save_discriminator(out_dir, disc, {"tokenizer": tok.digest, "cycle": cycle, "init": str(init_dir)})
    write_logs(out_dir, result)
    write_json(out_dir / "metrics.json", m)
    return m
