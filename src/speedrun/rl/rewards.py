"""Reward-model scores of sampled completions, straight from token ids (no decode/re-encode)."""
from __future__ import annotations

import torch

from speedrun.engine import Samples, continuation_hidden, left_pad, real_width
from speedrun.reward.preference import RewardModel
from speedrun.tokenizer import cut_prompt


@torch.no_grad()
def score_samples(rm: RewardModel, prompts: list[list[int]], samples: Samples, pad_id: int,
                  standardise: bool = True, batch_size: int = 64) -> torch.Tensor:
    """RM reward [N] of each prompt + completion (its stop token included), on CPU.
    Rows are [left pads | prompt | completion | right pads]; the RM reads the last real token (or, pool "mean",
    the completion's tokens). When every row fits the RM's context, each prompt is run once for its samples; rows
    fit unless the completions alone leave fewer than 3 tokens of it (then the leftmost columns are dropped).
    Where the samples carry a frozen trunk (GRPO with frozen_blocks) whose blocks are the RM's own first ones, the RM
    runs only its blocks after it."""
    device = samples.tokens.device
    read = rm.read_mask(samples.tokens, samples.mask > 0)  # the completion tokens the RM reads (rm.read_end)
    t = samples.trunk  # the trunk holds the whole prompts: only where they fit the RM's context uncut
    if t is not None and max(len(p) for p in prompts) + samples.tokens.size(1) <= rm.max_len \
            and t.tokens.size(1) >= int(real_width(samples.mask).max()) and t.shares(rm.trunk):
        h = t.token_states(rm.trunk)  # the policy's frozen blocks are the RM's: only the RM's own blocks run
        r = rm.pool_scores(h, read[:, :h.size(1)], torch.zeros(len(h), dtype=torch.long, device=device))
        return rm.standardise(r.float().cpu()) if standardise else r.float().cpu()
    room = rm.max_len - samples.tokens.size(1)
    if room >= 3:  # a prompt too long for the RM's context is cut as every stage cuts one: its header and its end
        prompts = [cut_prompt(p, room) for p in prompts]
    p_ids, p_mask = left_pad(prompts, pad_id, device)
    width = max(len(p) for p in prompts) + samples.tokens.size(1)  # real tokens (left_pad may round up)
    if width <= rm.max_len:
        _, h = continuation_hidden(rm.trunk, prompts, samples.tokens, samples.prompt_index, pad_id,
                                   real_width(samples.mask))
        r = rm.pool_scores(h, read, torch.zeros(len(h), dtype=torch.long, device=device)).float().cpu()
        return rm.standardise(r) if standardise else r
    out = []
    cut = max(p_ids.size(1) + samples.tokens.size(1) - rm.max_len, 0)  # leading columns that do not fit
    start = torch.tensor(max(p_ids.size(1) - cut, 0))  # the completion's first column
    for i in range(0, len(samples.tokens), batch_size):
        rows = samples.prompt_index[i:i + batch_size]
        ids = torch.cat([p_ids[rows], samples.tokens[i:i + batch_size]], dim=1)
        mask = torch.cat([p_mask[rows], samples.mask[i:i + batch_size] > 0], dim=1)
        out.append(rm.score(ids[:, -rm.max_len:], mask[:, -rm.max_len:], start.expand(len(rows))).float().cpu())
    r = torch.cat(out)
    return rm.standardise(r) if standardise else r
