"""What every GRPO run of a track stage (stages/grpo.py, stages/task_grpo.py) does around its own reward: the start
(processes, threads, shapes, the run's config, seeds, tokenizer), the prompt draws, and the end (outs, metrics)."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import pick_device, seed_everything, set_run_threads, use_bf16, write_json
from speedrun.config import GRPOConfig
from speedrun.rl.density import draw_prompts
from speedrun.rl.trainer import save_run
from speedrun.shapes import use_shapes
from speedrun.tokenizer import Tokenizer
from speedrun.train import distributed
from speedrun.train.checkpoint import context_length
from speedrun.train.distributed import Dist

if TYPE_CHECKING:
    from speedrun.rl.selection import Gate


def start_run(p, io: SimpleNamespace, t: GRPOConfig, key: str, module: str, seed: int,
              entropy_bonus: float, nproc: int | None = None) -> tuple[Dist, GRPOConfig, Tokenizer]:
    """Processes (torchrun for compute.nproc > 1, or `nproc` where the run needs its own), a run's fixed CPU threads,
    the shape ladder; the run's config `t` (params key `key`: grpo.train, task.train) with what the stage sets at run
    time; the seed; the tokenizer."""
    nproc = p.compute.nproc if nproc is None else nproc
    distributed.maybe_relaunch(nproc, module)
    d = distributed.setup(pick_device(p.compute.device))
    set_run_threads(p.compute.run_threads, nproc, d.device)
    use_shapes(p.compute.width_step, d.device)
    cfg = dataclasses.replace(t, beta=p.beta, seed=seed, bf16=use_bf16(p.compute.dtype, d.device),
                              entropy_bonus=entropy_bonus, decode=p.compute.decode,
                              warm_up=d.device.startswith("cuda"), max_prompt_len=context_length(
                                  t.max_prompt_len, io.sft_dir, t.max_new_tokens, f"{key}.max_prompt_len"))
    seed_everything(seed)
    return d, cfg, tokenizer_lib.load(io.tokenizer_dir)


class PromptDraws:
    """The draw function of grpo_train: each step's prompts from the sampling weights, counted per prompt; with a
    gate (speedrun.rl.selection.Gate), from those weights on the items it leaves open."""

    def __init__(self, weights: torch.Tensor, per_step: int, gate: Gate | None = None):
        self.weights, self.per_step, self.gate = weights, per_step, gate
        self.counts = torch.zeros(len(weights), dtype=torch.long)
        self.step_idx = torch.zeros(0, dtype=torch.long)  # the prompts of the draw being scored

    def __call__(self, step: int, g: torch.Generator) -> torch.Tensor:
        w = self.weights if self.gate is None else self.gate.weights(self.weights, self.per_step)
        self.step_idx = draw_prompts(w, self.per_step, g)
        self.counts[self.step_idx] += 1
        return self.step_idx


def finish_run(io: SimpleNamespace, policy: torch.nn.Module, meta: dict, log: "pd.DataFrame",  # noqa: F821
               prompts: "pd.DataFrame", draws: PromptDraws, metrics: dict, line: str) -> None:  # noqa: F821
    """The main process's end of a run: its outs (speedrun.rl.trainer.save_run), then its metrics, then one line."""
    save_run(io.out_dir, policy, meta, log, prompts, draws.weights, draws.counts)
    write_json(io.metrics, metrics)
    print(line)
    distributed.teardown()
