"""Stage train_rm: the preference reward model (SFT trunk + scalar head, Bradley-Terry loss) -> outs/rm/.
The recipe (what it trains on, how it validates, what it reports) is speedrun.reward.train_rm."""
from pathlib import Path

import typer

from speedrun.common import pick_device, DTYPE_HELP, use_bf16
from speedrun.reward.train_rm import RMRecipe, train_reward_model
from speedrun.train import distributed
from speedrun.train.loop import TrainConfig
from speedrun.params import param_default, from_options


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
    distributed.maybe_relaunch(nproc, "stages.train_rm")
    d = distributed.setup(pick_device(device))
    cfg = from_options(TrainConfig, locals(), bf16=use_bf16(dtype, d.device), monitor="val_loss")
    train_reward_model(pairs, init_dir, tokenizer_dir, from_options(RMRecipe, locals()), cfg, d, scratch_dir, out_dir,
                       metrics)
    distributed.teardown()


if __name__ == "__main__":
    typer.run(main)
