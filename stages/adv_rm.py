"""Stage adv_rm@i: a natural/generated discriminator on policy i-1's trunk, trained on data/adv/cycle_i (the recipe:
speedrun.adversarial.train_disc)."""
import time
from pathlib import Path

import typer

from speedrun.adversarial.train_disc import DiscRecipe, train_discriminator
from speedrun.common import pick_device, DTYPE_HELP, use_bf16
from speedrun.train.loop import TrainConfig
from speedrun.params import param_default, from_options


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
    cfg = from_options(TrainConfig, locals(), bf16=use_bf16(dtype, device), monitor="val_loss")
    m = train_discriminator(init_dir, data_dir, tokenizer_dir, from_options(DiscRecipe, locals()), cfg, device,
                            out_dir)
    print(f"adv_rm@{cycle}: val MAE of K/N {m['mae_k_frac']:.3f} "
          f"(predicting the mean: {m['mae_k_frac_baseline']:.3f}), "
          f"AUC pure natural vs generated {m['auc_pure']}, switch error {m['switch_error_tokens']:.1f} tokens, "
          f"{m['steps']} steps in {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    typer.run(main)
