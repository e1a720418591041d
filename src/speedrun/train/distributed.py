"""DDP plumbing: one process per device under torchrun (gloo on CPU, nccl on CUDA); rank 0 writes."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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
    """With nproc > 1 and not yet under torchrun, run this stage under torchrun (same arguments) and exit with its
    status. A child, not an exec: this process keeps watching what started it (common.die_with_parent), and torchrun
    dies with it."""
    if nproc > 1 and "LOCAL_RANK" not in os.environ:
        import subprocess

        from speedrun.common import die_with_parent
        args = ["torchrun", "--standalone", f"--nproc_per_node={nproc}", "-m", module, *sys.argv[1:]]
        sys.stdout.flush()
        linux = sys.platform.startswith("linux")
        sys.exit(subprocess.call(args, preexec_fn=die_with_parent if linux else None))


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


def all_gather_cat(x: torch.Tensor, d: Dist) -> torch.Tensor:
    """Every rank's x (same shape on every rank) concatenated along dim 0, in rank order."""
    if d.world == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(d.world)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def broadcast(x: torch.Tensor, d: Dist) -> torch.Tensor:
    """Rank 0's x on every rank (same shape and dtype on every rank), on x's device."""
    if d.world == 1:
        return x
    y = x.to(d.device).contiguous()  # nccl moves device tensors only
    dist.broadcast(y, 0)
    return y.to(x.device)


def all_reduce_grads(params: list[torch.nn.Parameter], d: Dist) -> None:
    """Sum the gradients over ranks, in one flat buffer (a parameter without a gradient counts as zeros)."""
    if d.world == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = all_reduce_sum(torch.cat([g.reshape(-1) for g in grads]), d)
    for p, g in zip(params, flat.split([g.numel() for g in grads])):
        p.grad = g.view_as(p).clone()


def rank_share(n: int, d: Dist) -> slice:
    """This rank's contiguous share of n items (n must split evenly)."""
    if n % d.world:
        raise ValueError(f"{n} items do not split evenly over {d.world} processes")
    k = n // d.world
    return slice(d.rank * k, (d.rank + 1) * k)


def map_jobs(fn: Callable[[Any], Any], jobs: Sequence, d: Dist) -> list:
    """[fn(job) for job in jobs] with job i run on rank i % world; every rank gets every result, in job order (the
    results are pickled over the process group). A job's result does not depend on the number of processes."""
    mine = {i: fn(job) for i, job in enumerate(jobs) if i % d.world == d.rank}
    if d.world == 1:
        return [mine[i] for i in range(len(jobs))]
    parts: list = [None] * d.world
    dist.all_gather_object(parts, mine)
    done = {i: r for part in parts for i, r in part.items()}
    return [done[i] for i in range(len(jobs))]


def barrier(d: Dist) -> None:
    if d.world > 1:
        dist.barrier()


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
