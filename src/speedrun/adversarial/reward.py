"""The self-supervised reward: a frozen discriminator's P(natural) of a policy's completion of a natural prefix.

Prompts come from data.prompt_pool: a context token, then P natural tokens. The discriminator sees the P natural
tokens and the first N - P completion tokens (N tokens, as in its training data) and the reward is the mean
per-token P(natural) over the completion (or the mean log-odds, kind="logit").

The reward leaves out the token head's position prior (late tokens were mostly generated in the training data,
whatever they say): it is the same for every completion of a prompt, so it carries no signal, and without it a
completion the discriminator cannot tell from natural text scores 0.5 and a confidently fooled one near 1.
"""
from __future__ import annotations

import torch
from torch import Tensor

from speedrun.engine import Samples, generate
from speedrun.model import GPT
from speedrun.reward.discriminator import Discriminator, completion_reward


def disc_inputs(prompts: list[list[int]], completions: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """(sequences [R, n], completion starts [R]) for row r = prompts[r] (context token + P natural tokens)
    continued by completions[r] (at least n - P tokens)."""
    seqs, starts = [], []
    for r, p in enumerate(prompts):
        P = len(p) - 1
        if not 1 <= P < n or completions.size(1) < n - P:
            raise ValueError(f"row {r}: prefix of {P} tokens with {completions.size(1)} completion tokens "
                             f"cannot make a {n}-token sequence with a non-empty completion")
        seqs.append(p[1:] + completions[r, :n - P].tolist())
        starts.append(P)
    return torch.tensor(seqs, dtype=torch.long), torch.tensor(starts, dtype=torch.long)


@torch.no_grad()
def score(disc: Discriminator, seqs: Tensor, starts: Tensor, kind: str = "prob", batch_size: int = 64) -> Tensor:
    """completion_reward of every row, in batches, on the discriminator's device; [R] on CPU."""
    device = next(disc.parameters()).device
    out = [completion_reward(disc(seqs[i:i + batch_size].to(device), prior=False), starts[i:i + batch_size], kind).cpu()
           for i in range(0, len(seqs), batch_size)]
    return torch.cat(out).float()


def grpo_reward_fn(disc: Discriminator, n: int, kind: str = "prob"):
    """RewardFn for rl.trainer.grpo_train, whose completions are max_new_tokens = n - 1 long (enough for the
    shortest prefix, P = 1). Each completion is cut at n tokens in total by zeroing its mask past n - P in
    place: grpo_train computes the reference log-probs, the loss and the logged lengths after scoring, from
    that mask, so exactly the scored tokens are trained on."""
    def reward_fn(prompts: list[list[int]], s: Samples) -> Tensor:
        rows = [prompts[i] for i in s.prompt_index.tolist()]
        seqs, starts = disc_inputs(rows, s.tokens.cpu(), n)
        keep = torch.arange(s.mask.size(1))[None] < (n - starts)[:, None]
        s.mask.mul_(keep.to(s.mask.device, s.mask.dtype))
        return score(disc, seqs, starts, kind)
    return reward_fn


@torch.no_grad()
def complete(policy: GPT, prompts: list[list[int]], n: int, seed: int, temperature: float = 1.0,
             batch_size: int = 64, pad_id: int = 0) -> Tensor:
    """One completion per prompt, long enough for n tokens in total: [R, n - min P] token ids on CPU.
    Batch b samples from a generator seeded by seed + b."""
    device = next(policy.parameters()).device
    new = n - min(len(p) - 1 for p in prompts)
    out = []
    for b, i in enumerate(range(0, len(prompts), batch_size)):
        g = torch.Generator(device=device).manual_seed(seed + b)
        s = generate(policy, prompts[i:i + batch_size], 1, new, temperature=temperature, pad_id=pad_id, generator=g)
        out.append(s.tokens.cpu())
    return torch.cat(out)
