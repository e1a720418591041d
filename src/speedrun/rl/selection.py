"""Prompt selection that reads the policy's own rewards: the samplers RL trainers ship (task.variants sampling filter,
band, gate). Each is a rule on a draw's groups of rewards; speedrun.rl.trainer.rollout refills the dropped ones.

- filter: DAPO's dynamic sampling (arXiv 2503.14476; verl algorithm.filter_groups, open-instruct
  filter_zero_std_samples): a group whose rewards are all equal has zero advantage, so it is dropped.
- band: online difficulty filtering (arXiv 2504.03380; OpenRLHF --dynamic_filtering_range): a group trains only when
  its pass rate lies in a band around 1/2, where a binary reward's variance, hence its signal, is largest.
- gate: zero-success gating in the manner of BBG (arXiv 2606.15455): only items with no passing completion seen yet
  in the run are drawn; an item leaves the pool once solved, so training stops sharpening what the policy already
  answers. Once fewer items than a step's prompts are unsolved the gate opens: draws are the base sampler's again
  (the steps counted).

A completion passes when its reward exceeds `threshold`: 0.5 for the checker's 0/1 (and its shuffled control),
0 for the standardised reward model's score (above its mean over validation responses)."""
from __future__ import annotations

import torch

SELECTING = ("filter", "band", "gate")  # the task.variants samplings that read the policy's rewards


def pass_rates(rewards: torch.Tensor, group_size: int, threshold: float) -> torch.Tensor:
    """Each group's share of completions whose reward exceeds threshold: float [n] of rewards [n * group_size]."""
    return (rewards.view(-1, group_size) > threshold).double().mean(1)


def keep_spread(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """bool [n]: the groups whose rewards are not all equal (filter)."""
    g = rewards.view(-1, group_size)
    return g.amax(1) > g.amin(1)


def keep_band(rewards: torch.Tensor, group_size: int, band: list[float], threshold: float) -> torch.Tensor:
    """bool [n]: the groups whose pass rate lies in [band[0], band[1]] (band)."""
    rate = pass_rates(rewards, group_size, threshold)
    return (rate >= band[0]) & (rate <= band[1])


class Gate:
    """Zero-success gating: the items with no passing completion yet, and the draws' weights over them."""

    def __init__(self, n: int, threshold: float):
        self.solved = torch.zeros(n, dtype=torch.bool)
        self.threshold, self.open_steps = threshold, 0  # steps drawn with every item solved (the gate open)

    def weights(self, base: torch.Tensor, per_step: int) -> torch.Tensor:
        """The base weights on the unsolved items, renormalised; fewer than per_step unsolved: the base weights."""
        w = base * (~self.solved).to(base.dtype)
        if int((w > 0).sum()) < per_step:
            self.open_steps += 1
            return base
        return w / w.sum()

    def observe(self, idx: torch.Tensor, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        """Mark the drawn items with a passing completion solved; every group trains (bool [n] all True)."""
        self.solved[idx[pass_rates(rewards, group_size, self.threshold) > 0]] = True
        return torch.ones(len(idx), dtype=torch.bool)


class Selector:
    """The trainer's select function of a selecting arm, and the counts of its groups: seen (every group generated)
    and kept (the groups trained)."""

    def __init__(self, sampling: str, group_size: int, band: list[float], threshold: float, gate: Gate | None):
        self.sampling, self.group_size, self.band, self.gate = sampling, group_size, band, gate
        self.threshold = threshold
        self.counts = {"seen": 0, "kept": 0}

    def __call__(self, idx: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
        if self.sampling == "filter":
            keep = keep_spread(rewards, self.group_size)
        elif self.sampling == "band":
            keep = keep_band(rewards, self.group_size, self.band, self.threshold)
        else:
            keep = self.gate.observe(idx, rewards, self.group_size)
        self.counts["seen"] += len(idx)
        self.counts["kept"] += int(keep.sum())
        return keep


def selector(sampling: str, group_size: int, band: list[float], threshold: float, gate: Gate | None
             ) -> Selector | None:
    """The select function of an arm: None (every draw trains as drawn) unless its sampling reads rewards."""
    return Selector(sampling, group_size, band, threshold, gate) if sampling in SELECTING else None
