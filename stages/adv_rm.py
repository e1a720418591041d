"""Stage adv_rm@i: a natural/generated discriminator on policy i-1's trunk, trained on data/adv/cycle_i (the recipe:
speedrun.adversarial.train_disc)."""
import time
from pathlib import Path

import typer

from speedrun.adversarial.train_disc import DiscRecipe, train_discriminator
from speedrun.common import pick_device, use_bf16
from speedrun.train.loop import TrainConfig
from speedrun.params import from_options
from speedrun.cli import stage_flags


@stage_flags(init_dir=Path("outs/pretrain"), data_dir=Path("data/adv/cycle_1"),
             out_dir=Path("outs/adv/cycle_1/disc"))  # cycle 1's: dvc.yaml fills them per cycle
def main(cycle: str, init_dir: Path, data_dir: Path, tokenizer_dir: Path, head: str, train_last_blocks: int,
         steps: int, batch_size: int, lr: float, warmup_steps: int, eval_every: int, patience: int, min_delta: float,
         seed: int, device: str, dtype: str, out_dir: Path) -> None:
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
