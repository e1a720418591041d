"""Stage train_rm: the preference reward model (SFT trunk + scalar head, Bradley-Terry loss) -> outs/rm/.
The recipe (what it trains on, how it validates, what it reports) is speedrun.reward.train_rm."""
from pathlib import Path

import typer

from speedrun.common import pick_device, use_bf16
from speedrun.reward.train_rm import RMRecipe, train_reward_model
from speedrun.train import distributed
from speedrun.train.loop import TrainConfig
from speedrun.params import from_options
from speedrun.cli import stage_flags


@stage_flags(micro_tokens=4096, scratch_dir=Path("scratch/rm"))
def main(pairs: list[Path], init_dir: Path, tokenizer_dir: Path, pool: str, train_kinds: str, train_last_blocks: int,
         max_len: int, steps: int, batch_size: int, micro_batch: int, micro_tokens: int, lr: float,
         weight_decay: float, warmup_steps: int, final_lr_frac: float, grad_clip: float, eval_every: int,
         eval_pairs: int, patience: int, min_delta: float, save_every: int, scratch_dir: Path, seed: int, device: str,
         dtype: str, nproc: int, out_dir: Path, metrics: Path) -> None:
    distributed.maybe_relaunch(nproc, "stages.train_rm")
    d = distributed.setup(pick_device(device))
    cfg = from_options(TrainConfig, locals(), bf16=use_bf16(dtype, d.device), monitor="val_loss")
    train_reward_model(pairs, init_dir, tokenizer_dir, from_options(RMRecipe, locals()), cfg, d, scratch_dir, out_dir,
                       metrics)
    distributed.teardown()


if __name__ == "__main__":
    typer.run(main)
