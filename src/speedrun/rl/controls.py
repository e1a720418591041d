"""What the control arms change (params.yaml grpo.variants): a planted tic, a reward with no information, the
group-balanced sampler and a bonus for distinct answers. Pure functions of rewards, texts and prompt groups;
stages/grpo.py and stages/task_grpo.py wire them in.

Why these: a planted tic (a bonus for a corpus-native string) is a collapse the evaluation must see (positive
control); paying it only on the densest modules asks whether a sampler that draws those modules less spreads it
less (mechanism control); shuffled rewards keep GRPO's updates and KL anchor but carry no preference (negative
control: drift, not reward-driven collapse); a bonus for answers unlike the rest of their group raises diversity at
an equal reward by construction (positive control for a diversity mechanism, in the spirit of DARLING, Li et al.
2025, which pays quality times the share of the group in another meaning class); on the task track, a bonus for a
right answer whose value is rare in its group does the same for right values (stages/task_grpo.py)."""
from __future__ import annotations

import re
from collections import Counter
from typing import Sequence

import torch


def balanced_weights(groups: Sequence[str]) -> torch.Tensor:
    """Sampling weights float64 [N] summing to 1 that give every group the same total: 1 / (groups * group size)."""
    if not len(groups):
        raise ValueError("balanced_weights: no prompts")
    size = Counter(groups)
    return torch.tensor([1.0 / (len(size) * size[g]) for g in groups], dtype=torch.float64)


def dense_groups(groups: Sequence[str], n: int) -> set[str]:
    """The n groups holding the most prompts (ties broken by name, so the choice is deterministic)."""
    if n < 1:
        raise ValueError(f"dense_groups: n must be >= 1, got {n}")
    return {g for g, _ in sorted(Counter(groups).items(), key=lambda kv: (-kv[1], kv[0]))[:n]}


def plant_tic(rewards: torch.Tensor, texts: Sequence[str], tic: str, bonus: float,
              eligible: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewards + bonus where a text holds `tic` and its row is eligible, the bool [N] of texts holding it)."""
    if len(texts) != rewards.numel():
        raise ValueError(f"plant_tic: {len(texts)} texts for {rewards.numel()} rewards")
    if not tic:
        raise ValueError("plant_tic: the tic is empty (params.yaml grpo.controls.tic)")
    has = torch.tensor([tic in t for t in texts], dtype=torch.bool)
    paid = has if eligible is None else has & eligible.to(torch.bool).cpu()
    return rewards + bonus * paid.to(rewards.dtype), has


def shuffle_rewards(rewards: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The step's rewards permuted across all its completions: the same values (scale, spread) with no link to the
    completion they are paid to."""
    return rewards[torch.randperm(rewards.numel(), generator=generator)]


def shuffle_within_groups(rewards: torch.Tensor, group_size: int, generator: torch.Generator) -> torch.Tensor:
    """Each prompt's group of rewards permuted among its own completions: no link to the completion paid, and the
    same groups with zero spread (so the same number of zero-advantage groups) as the unshuffled rewards."""
    g = rewards.view(-1, group_size)
    perm = torch.argsort(torch.rand(g.shape, generator=generator), dim=1)
    return g.gather(1, perm).reshape(-1)


WORD_RE = re.compile(r"\b\w+\b")  # the evaluation's words (eval/diversity.py), lower-cased


def _shingles(text: str) -> set:
    w = WORD_RE.findall(text.lower())
    return set(w) | set(zip(w, w[1:]))


def distinctness(texts: Sequence[str], group_size: int) -> torch.Tensor:
    """float32 [N]: per completion, the mean over the other completions to its prompt (groups of group_size in a
    row) of 1 - the Jaccard similarity of their sets of words and word bigrams: 0 when the group says one thing, 1
    when no two answers share a word. Two empty answers are alike."""
    if group_size < 2 or len(texts) % group_size:
        raise ValueError(f"distinctness: {len(texts)} texts do not split into groups of {group_size} (>= 2)")
    sets = [_shingles(t) for t in texts]
    out = torch.zeros(len(texts))
    for start in range(0, len(texts), group_size):
        group = sets[start:start + group_size]
        for i, a in enumerate(group):
            far = [1.0 - (len(a & b) / len(a | b) if a | b else 1.0) for j, b in enumerate(group) if j != i]
            out[start + i] = sum(far) / len(far)
    return out


def rare_value_bonus(values: Sequence[str | None], group_size: int) -> torch.Tensor:
    """float32 [N]: per completion, 1 / how many of its group's right answers (groups of group_size in a row) share
    its value; 0 for a wrong answer (None). A right value said once in the group earns 1, one said by all eight 1/8,
    so a group's sum is its number of distinct right values (the task track's coverage of one group)."""
    if group_size < 1 or len(values) % group_size:
        raise ValueError(f"rare_value_bonus: {len(values)} answers do not split into groups of {group_size}")
    out = torch.zeros(len(values))
    for start in range(0, len(values), group_size):
        counts = Counter(v for v in values[start:start + group_size] if v is not None)
        for i, v in enumerate(values[start:start + group_size]):
            out[start + i] = 1.0 / counts[v] if v is not None else 0.0
    return out
