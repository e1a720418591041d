"""Stage adv_rm@i: a natural/generated discriminator on policy i-1's trunk, trained on data/adv/cycle_i."""
import time
from pathlib import Path

import pandas as pd
import torch
import typer

from speedrun import tokenizer as tokenizer_lib
from speedrun.adversarial import data as adv
from speedrun.common import pick_device, DTYPE_HELP, use_bf16, read_json, seed_everything, write_json
from speedrun.reward.discriminator import Discriminator, metrics, save_discriminator
from speedrun.train import data
from speedrun.train.checkpoint import load_model
from speedrun.train.distributed import Dist
from speedrun.train.loop import TrainConfig, autocast, train
from speedrun.train.outputs import write_logs
from speedrun.params import param_default


@torch.no_grad()
def logits_of(disc: Discriminator, x: torch.Tensor, device: str, bf16: bool, batch_size: int = 64) -> torch.Tensor:
    with autocast(device, bf16):
        return torch.cat([disc.from_prefix(x[i:i + batch_size].to(device)).float().cpu()
                          for i in range(0, len(x), batch_size)])


def main(
    cycle: str = typer.Option(..., help="cycle id (the key in adversarial.cycles)"),
    init_dir: Path = typer.Option(Path("outs/pretrain"), help="policy i-1: the trunk is initialised from it"),
    data_dir: Path = typer.Option(Path("data/adv/cycle_1"), help="adv_data output: train/val.parquet, stats.json"),
    tokenizer_dir: Path = typer.Option(Path("outs/tokenizer"), help="trained tokenizer"),
    head: str = typer.Option(param_default("adversarial.rm.head"),
                             help="token (per-token BCE, mean estimates K/N) | pooled (last token, 2-way)"),
    train_last_blocks: int = typer.Option(param_default("adversarial.rm.train_last_blocks"),
                                          help="trunk blocks trained with the head (0 = frozen trunk)"),
    steps: int = typer.Option(param_default("adversarial.rm.steps"), help="optimizer steps (at most)"),
    batch_size: int = typer.Option(param_default("adversarial.rm.batch_size"), help="sequences per step"),
    lr: float = typer.Option(param_default("adversarial.rm.lr"), help="peak AdamW learning rate"),
    warmup_steps: int = typer.Option(param_default("adversarial.rm.warmup_steps"), help="linear warmup steps"),
    eval_every: int = typer.Option(param_default("adversarial.rm.eval_every"), help="steps between val evaluations"),
    patience: int = typer.Option(param_default("adversarial.rm.patience"),
                                 help="evals without val-loss improvement before stopping (0 = off)"),
    min_delta: float = typer.Option(param_default("adversarial.rm.min_delta"),
                                    help="improvement in val loss that resets patience"),
    seed: int = typer.Option(param_default("seed"), help="seed of head init and batch order"),
    device: str = typer.Option(param_default("compute.device"), help="auto | cpu | cuda"),
    dtype: str = typer.Option(param_default("compute.dtype"), help=DTYPE_HELP),
    out_dir: Path = typer.Option(Path("outs/adv/cycle_1/disc"), help="model.pt, meta.json, log/eval.csv, metrics.json"),
) -> None:
    t0 = time.perf_counter()
    device = pick_device(device)
    bf16 = use_bf16(dtype, device)
    tok = tokenizer_lib.load(tokenizer_dir)
    n = read_json(data_dir / "stats.json")["seq_len"]
    split = {s: adv.load_split(pd.read_parquet(data_dir / f"{s}.parquet"), n, str(data_dir / f"{s}.parquet"))
             for s in ("train", "val")}
    trunk, _ = load_model(init_dir, device, tok.digest)
    seed_everything(seed)
    disc = Discriminator(trunk, head, train_last_blocks, n).to(device)
    with autocast(device, bf16):  # the frozen part runs once per sequence, not once per step
        x = {s: torch.cat([disc.prefix(t[i:i + 64].to(device)).float().cpu() for i in range(0, len(t), 64)])
             for s, (t, *_) in split.items()}
    # targets: per-token labels for the token head, K/N per sequence for the pooled head
    y = {s: (lab if head == "token" else k.float() / n) for s, (_, lab, k, _) in split.items()}
    _, _, val_k, val_pure = split["val"]

    def eval_fn(m: Discriminator) -> dict[str, float]:
        logits = logits_of(m, x["val"], device, bf16)
        loss = float(m.loss_sum(logits, y["val"])) / y["val"].numel()
        return {"val_loss": loss, "val_mae_k_frac": metrics(logits, val_k, val_pure, n)["mae_k_frac"]}

    sampler = data.StepSampler(len(x["train"]), batch_size, 0, seed, f"adv_rm{cycle}")
    batch_fn = lambda step, rank, world: [(x["train"][ids], y["train"][ids])  # noqa: E731
                                          for ids in sampler.items(step, rank, world)]
    cfg = TrainConfig(steps=steps, lr=lr, warmup_steps=warmup_steps, eval_every=eval_every, patience=patience,
                      min_delta=min_delta, bf16=bf16, monitor="val_loss")
    print(f"adv_rm@{cycle}: {head} head, {train_last_blocks} trainable blocks, "
          f"{sum(p.numel() for p in disc.parameters() if p.requires_grad):,} trainable params, "
          f"{len(x['train'])} train / {len(x['val'])} val sequences of {n}")
    result = train(disc, cfg, batch_fn, eval_fn, Dist(0, 1, device),
                   loss_fn=lambda m, xb, yb: m.loss_sum(m.from_prefix(xb), yb), log_every=50, name=f"adv_rm@{cycle}")
    disc.load_state_dict(result.best_state)
    m = {"cycle": cycle, "init": str(init_dir), "head": head, "train_last_blocks": train_last_blocks,
         "steps": result.steps_done, "stopped_early": result.stopped_early, "best_step": result.best_eval["step"],
         "val_loss": round(result.best_eval["val_loss"], 5), "train_rows": len(x["train"]), "val_rows": len(x["val"]),
         **{k: (round(v, 5) if isinstance(v, float) else v)
            for k, v in metrics(logits_of(disc, x["val"], device, bf16), val_k, val_pure, n).items()}}
    save_discriminator(out_dir, disc, {"tokenizer": tok.digest, "cycle": cycle, "init": str(init_dir)})
    write_logs(out_dir, result)
    write_json(out_dir / "metrics.json", m)
    print(f"adv_rm@{cycle}: val MAE of K/N {m['mae_k_frac']:.3f} "
          f"(predicting the mean: {m['mae_k_frac_baseline']:.3f}), "
          f"AUC pure natural vs generated {m['auc_pure']}, switch error {m['switch_error_tokens']:.1f} tokens, "
          f"{m['steps']} steps in {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    typer.run(main)
