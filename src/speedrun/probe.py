"""Can a model copy from its context? The induction probe of Olsson et al. (2022), used by the training stages'
metrics and by the gold task's report (the task is to pick a listed name and copy it)."""
from __future__ import annotations

import torch

from speedrun.common import stable_seed
from speedrun.tokenizer import SPECIAL_TOKENS, Tokenizer

COPY_GAIN = 1.0  # nats/token a model that copies from its context gains on a repeated sequence's second copy


@torch.no_grad()
def copy_probe(model: torch.nn.Module, first_id: int, end_id: int, seed: int, device: str, rows: int = 32,
               length: int = 48) -> dict:
    """Random sequences of token ids [first_id, end_id) shown twice: a model with induction heads predicts the
    second copy far better than the first. Mean loss (nats/token) on each copy, their gap, and whether it copies."""
    g = torch.Generator().manual_seed(stable_seed(seed, "copy_probe"))
    x = torch.randint(first_id, end_id, (rows, length), generator=g)
    seq = torch.cat([x, x], 1).to(device)
    loss = model(seq[:, :-1], seq[:, 1:], reduction="none").float().cpu()
    first, second = float(loss[:, :length - 1].mean()), float(loss[:, length:].mean())
    return {"first_copy": first, "second_copy": second, "gain": first - second, "copies": first - second >= COPY_GAIN,
            "rows": rows, "length": length}


def merged_tokens(tok: Tokenizer) -> tuple[int, int]:
    """The id range of the tokenizer's merged tokens (neither raw bytes nor special tokens): the probe's tokens."""
    return 256, tok.vocab_size - len(SPECIAL_TOKENS)


def copy_gain(model: torch.nn.Module, tok: Tokenizer, seed: int, device: str) -> float:
    """copy_probe's gain, for a training stage's metrics."""
    return round(copy_probe(model.eval(), *merged_tokens(tok), seed, device)["gain"], 4)
