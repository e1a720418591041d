"""Stage train_rm: the preference reward model (SFT trunk + scalar head, Bradley-Terry loss) -> outs/rm/.
The recipe (what it trains on, how it validates, what it reports) is speedrun.reward.train_rm."""
import dataclasses

from speedrun.common import files_digest, pick_device, use_bf16
from speedrun.reward.train_rm import train_reward_model
from speedrun.stage import run_stage
from speedrun.train import distributed
from speedrun.train.checkpoint import context_length

READS = ("seed", "compute", "rm")
PATHS = {"pairs": ["data/prompts/pairs.parquet", "data/onpolicy/pairs.parquet"], "init_dir": "outs/sft",
         "tokenizer_dir": "outs/base/tokenizer", "scratch_dir": "scratch/rm", "out_dir": "outs/rm",
         "metrics": "reports/metrics/rm.json"}


def main(p, io) -> None:
    distributed.maybe_relaunch(p.compute.nproc, "stages.train_rm")
    d = distributed.setup(pick_device(p.compute.device))
    cfg = dataclasses.replace(p.rm, bf16=use_bf16(p.compute.dtype, d.device), compile=p.compute.compile,
                              monitor="val_loss", max_len=context_length(p.rm.max_len, io.init_dir, key="rm.max_len"))
    inputs = files_digest(*io.pairs, io.init_dir / "model.pt", io.tokenizer_dir)
    train_reward_model(io.pairs, io.init_dir, io.tokenizer_dir, cfg, p.seed, d, io.scratch_dir, io.out_dir, io.metrics,
                       fingerprint=f"rm|{p.digest()}|{inputs}")
    distributed.teardown()


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
