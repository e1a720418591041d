"""DDP plumbing: one process per device under torchrun (gloo on CPU, nccl on CUDA); rank 0 writes."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int
    world: int
    device: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def maybe_relaunch(nproc: int, module: str) -> None:
    """With nproc > 1 and not yet under torchrun, re-exec this stage under torchrun (same arguments)."""
    if nproc > 1 and "LOCAL_RANK" not in os.environ:
        args = ["torchrun", "--standalone", f"--nproc_per_node={nproc}", "-m", module, *sys.argv[1:]]
        sys.stdout.flush()
        os.execvp(args[0], args)


def setup(device: str) -> Dist:
    """Init the process group when launched by torchrun; plain single process otherwise."""
    if "LOCAL_RANK" not in os.environ:
        return Dist(0, 1, device)
    local_rank = int(os.environ["LOCAL_RANK"])
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), device)


def all_reduce_sum(x: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.world > 1:
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def barrier(d: Dist) -> None:
    if d.world > 1:
        dist.barrier()


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
