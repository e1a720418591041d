"""Batches as a pure function of the step: sample g = step * batch + j of the run is window
perm_epoch[g % n] with a permutation seeded by (seed, epoch). Resume and DDP sharding need nothing more."""
from __future__ import annotations

import math
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from speedrun.common import UserError, atomic_write, read_json, stable_seed, write_json
from speedrun.tokenizer import Tokenizer


def write_tokens(path: str | Path, texts: list[str], tok: Tokenizer) -> int:
    """The packed corpus split: one stream <|bos|> doc <|bos|> doc ... of int32, written to a raw file one document
    at a time (memory holds one document whatever the corpus size), atomically. Returns its token count. One
    document at a time, not tiktoken's threaded batch of 1,024: on 2 cores the batch was 1.8x slower
    (bench/scale.py --what pack)."""
    count = 0

    def write(tmp: str) -> None:
        nonlocal count
        with open(tmp, "wb") as f:
            for text in texts:
                a = np.asarray([tok.bos_id, *tok.encode(text)], dtype=np.int32)
                f.write(a.tobytes())
                count += len(a)
    atomic_write(path, write)
    return count


def pack_splits(tokens_dir: Path, splits: dict[str, list[str]], tok: Tokenizer) -> dict[str, int]:
    """data/tokens: each split's texts packed to <split>.bin (write_tokens), and meta.json naming the tokenizer that
    packed them (read_tokens checks it). Returns the token count per split."""
    counts = {name: write_tokens(Path(tokens_dir) / f"{name}.bin", texts, tok) for name, texts in splits.items()}
    write_json(Path(tokens_dir) / "meta.json", {"tokenizer": tok.digest, "dtype": "int32", "tokens": counts})
    return counts


def read_tokens(path: str | Path, tokenizer_digest: str) -> torch.Tensor:
    """A packed split (write_tokens) as an int32 tensor over a copy-on-write memory map: pages load when indexed and
    every process reading the file shares them (the ranks of pretrain, the adversarial stages). The folder's
    meta.json must name the tokenizer the caller holds: ids of another vocabulary would train silently."""
    meta = Path(path).parent / "meta.json"
    made_by = read_json(meta).get("tokenizer") if meta.is_file() else None
    if made_by != tokenizer_digest:
        raise UserError(f"{path}: packed by tokenizer {made_by} ({meta}), not by the one loaded ({tokenizer_digest}): "
                         "rerun the tokenizer stage")
    size = os.path.getsize(path)
    if size % 4:
        raise UserError(f"{path}: {size} bytes is not a whole number of int32 tokens (a truncated file?)")
    if size == 0:
        return torch.zeros(0, dtype=torch.int32)
    return torch.from_numpy(np.memmap(path, dtype=np.int32, mode="c"))


def windows(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Non-overlapping [n, seq_len + 1] windows (input and shifted target share one window), a view of the stream:
    indexing rows copies only them (callers take .long() of what they index)."""
    n = (len(stream) - 1) // seq_len
    if n < 1:
        raise ValueError(f"token stream of {len(stream)} tokens is shorter than one window of {seq_len + 1}")
    # window i is tokens [i*seq_len, (i+1)*seq_len]: one token shared with the next window, as its first input
    return stream.as_strided((n, seq_len + 1), (seq_len, 1))


class StepSampler:
    """Which items (of n) go into the batch of a step, and which of those this rank takes."""

    def __init__(self, n_items: int, batch_size: int, micro_batch: int, seed: int, salt: str):
        if n_items < 1:
            raise ValueError("nothing to train on: 0 items")
        self.n, self.batch, self.micro, self.seed, self.salt = n_items, batch_size, micro_batch, seed, salt
        self._perm = lru_cache(maxsize=4)(self._perm_uncached)

    def _perm_uncached(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(stable_seed(self.seed, self.salt, epoch))
        return torch.randperm(self.n, generator=g)

    def items(self, step: int, rank: int, world: int) -> list[list[int]]:
        """This rank's share of the step's batch, split into micro-batches."""
        if self.batch % world:
            raise ValueError(f"batch_size {self.batch} is not divisible by {world} processes")
        ids = []
        for j in range(step * self.batch, (step + 1) * self.batch):  # the run's j-th sample: epoch j // n, slot j % n
            ids.append(int(self._perm(j // self.n)[j % self.n]))
        mine = ids[rank::world]  # strided, so each rank's share stays the same size and the union is the batch
        m = self.micro or len(mine)
        return [mine[i:i + m] for i in range(0, len(mine), m)]


def lm_batch_fn(win: torch.Tensor, sampler: StepSampler):
    def batch_fn(step: int, rank: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = []
        for ids in sampler.items(step, rank, world):
            w = win[ids].long()
            out.append((w[:, :-1], w[:, 1:]))
        return out
    return batch_fn


def pad_conversations(rendered: list[tuple[list[int], list[int]]], max_len: int, pad_id: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded inputs and targets; targets are -1 except where the next token is an assistant token."""
    T = min(max_len, max(len(ids) for ids, _ in rendered) - 1)
    x = torch.full((len(rendered), T), pad_id, dtype=torch.long)
    y = torch.full((len(rendered), T), -1, dtype=torch.long)
    for i, (ids, mask) in enumerate(rendered):
        ids_t, mask_t = torch.tensor(ids[: T + 1]), torch.tensor(mask[: T + 1], dtype=torch.bool)
        n = len(ids_t) - 1
        x[i, :n] = ids_t[:-1]
        y[i, :n] = torch.where(mask_t[1:], ids_t[1:], -1)  # the mask marks the token predicted, not the input
    return x, y


def by_length(ids: list[int], size: list[int], max_tokens: int, rows_per_item: int = 1) -> list[list[int]]:
    """ids sorted by length, cut into groups of at most max_tokens padded tokens. The loop normalises by
    the step's target count, so re-cutting a step's micro-batches this way keeps its gradient and drops
    most of the padding."""
    groups: list[list[int]] = []
    for i in sorted(ids, key=lambda i: (size[i], i)):
        if not groups or (len(groups[-1]) + 1) * rows_per_item * size[i] > max_tokens:
            groups.append([])
        groups[-1].append(i)
    return groups


def sft_batch_fn(rendered: list[tuple[list[int], list[int]]], sampler: StepSampler, max_len: int, pad_id: int,
                 micro_tokens: int = 0):
    """Micro-batches of conversations; micro_tokens > 0 re-cuts each by length (see by_length)."""
    size = [min(len(ids) - 1, max_len) for ids, _ in rendered]

    def batch_fn(step: int, rank: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        groups = sampler.items(step, rank, world)
        if micro_tokens:
            groups = [g for ids in groups for g in by_length(ids, size, micro_tokens)]
        return [pad_conversations([rendered[i] for i in ids], max_len, pad_id) for ids in groups]
    return batch_fn


def token_bytes(tok: Tokenizer) -> torch.Tensor:
    """UTF-8 byte length of every token (0 for special tokens): the denominator of bits per byte."""
    n_special = len(tok.enc._special_tokens)
    lens = [len(tok.enc.decode_single_token_bytes(i)) for i in range(tok.vocab_size - n_special)]
    return torch.tensor(lens + [0] * n_special, dtype=torch.long)


@torch.no_grad()
def bits_per_byte(model: torch.nn.Module, win: torch.Tensor, tbytes: torch.Tensor, batch_size: int,
                  device: str) -> float:
    """Cross-entropy in bits per UTF-8 byte of the targets: comparable across tokenizers."""
    nats, nbytes = 0.0, 0
    for i in range(0, len(win), batch_size):
        w = win[i:i + batch_size].long().to(device)
        loss = model(w[:, :-1], w[:, 1:], reduction="none").float()
        b = tbytes.to(device)[w[:, 1:]]
        nats += float((loss * (b > 0)).sum())  # special tokens (0 bytes) are not text: their loss does not count
        nbytes += int(b.sum())
    return nats / (math.log(2) * max(nbytes, 1))


@torch.no_grad()
def masked_loss(model: torch.nn.Module, rendered: list[tuple[list[int], list[int]]], max_len: int, pad_id: int,
                batch_size: int, device: str) -> float:
    """Mean cross-entropy over assistant tokens (the SFT objective) on fixed conversations."""
    total, count = 0.0, 0
    for i in range(0, len(rendered), batch_size):
        x, y = pad_conversations(rendered[i:i + batch_size], max_len, pad_id)
        total += float(model(x.to(device), y.to(device), reduction="sum"))
        count += int((y != -1).sum())
    return total / max(count, 1)
