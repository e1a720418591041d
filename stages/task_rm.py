"""Stage task_rm: the task track's reward model (the rm arm's proxy reward): the task SFT trunk + a scalar head,
Bradley-Terry on the task pairs (a right answer over a wrong one; train items, best checkpoint on the val items)
-> outs/task_rm. The recipe is the chat RM's (speedrun.reward.train_rm); the eval items have no pairs."""
import dataclasses

from speedrun.common import files_digest, pick_device, use_bf16
from speedrun.reward.train_rm import train_reward_model
from speedrun.stage import run_stage
from speedrun.train import distributed
from speedrun.train.checkpoint import context_length

READS = ("compute", "task.rm", "task.sft.seed")
PATHS = {"pairs": ["data/task/pairs.parquet"], "init_dir": "outs/task_sft", "tokenizer_dir": "outs/task_base/tokenizer",
         "scratch_dir": "scratch/task_rm", "out_dir": "outs/task_rm", "metrics": "reports/metrics/task_rm.json"}


def main(p, io) -> None:
    distributed.maybe_relaunch(p.compute.nproc, "stages.task_rm")
    d = distributed.setup(pick_device(p.compute.device))
    cfg = dataclasses.replace(p.task.rm, bf16=use_bf16(p.compute.dtype, d.device), compile=p.compute.compile,
                              monitor="val_loss", max_len=context_length(p.task.rm.max_len, io.init_dir,
                                                                         key="task.rm.max_len"))
    inputs = files_digest(*io.pairs, io.init_dir / "model.pt", io.tokenizer_dir)
    train_reward_model(io.pairs, io.init_dir, io.tokenizer_dir, cfg, p.task.sft.seed, d, io.scratch_dir, io.out_dir,
                       io.metrics, fingerprint=f"task_rm|{p.digest()}|{inputs}")
    distributed.teardown()


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
