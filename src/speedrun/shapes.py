"""Bounded tensor shapes: the ladder every batched forward pads to, and a counter of the shapes a run presents.

Why: on a GPU, cuDNN attention builds an execution plan and a CUDA graph is captured per new shape, so a step
whose shapes change every time (rows ending at different lengths, exact length groups) pays that cost every step.
Row counts go to a ladder (1, 2, 3, 4, 6, 8, ...) and widths to multiples of a step, so a run meets a few dozen
shapes, all in its first steps; padding rows and columns are masked out, so the numbers are those of the unpadded
forward up to float rounding.

    with count_shapes() as shapes:  # every attention call (scaled_dot_product_attention or the static decode
        ...                         # step's written-out attention) records its (kind, query, key) shape
    shapes.distinct, shapes.calls
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import torch

_ACTIVE: list[ShapeCounter] = []
_STEP = [1]  # the process's width step (compute.width_step, set by the stage); 1 = exact shapes, no ladder


def width_step() -> int:
    """Widths (prompt, completion, cache, key window) are padded to multiples of this and row counts to the ladder
    when it is > 1; 1 keeps every forward at its exact size."""
    return _STEP[0]


def set_width_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"width step must be an int >= 1, not {step!r}")
    _STEP[0] = step


def resolve_width_step(step: int, device: str) -> int:
    """compute.width_step with 0 (auto) resolved: 64 on CUDA, where a new shape costs a plan or a capture and
    padding is nearly free; 1 (exact shapes) on CPU, where a shape costs nothing and every padded token does (the
    GRPO step was 5-10% slower at step 16: docs/method.md#speed)."""
    return step or (64 if str(device).startswith("cuda") else 1)


def use_shapes(step: int, device: str) -> int:
    """A stage's shape settings: compute.width_step resolved for this device, and on CUDA PyTorch's cuDNN attention
    backend off: it builds an execution plan per new shape, and without it the GRPO step was 7-8x faster at exact
    shapes and 1.2-1.3x with the ladder (reports/gpu/README.md); flash / memory-efficient attention take its place."""
    set_width_step(resolve_width_step(step, device))
    if str(device).startswith("cuda"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    return width_step()


@contextmanager
def using_width_step(step: int) -> Iterator[None]:
    old = width_step()
    set_width_step(step)
    try:
        yield
    finally:
        set_width_step(old)


def round_up(n: int, step: int) -> int:
    """n rounded up to a multiple of step (step 1: n itself)."""
    return -(-n // step) * step


def ladder(n: int) -> int:
    """The smallest row count >= n on the ladder 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (powers of two and 1.5x them):
    a few dozen sizes up to thousands of rows, each less than 1.5x the rows it holds."""
    if n <= 2:
        return max(n, 1)
    p = 1 << (n - 1).bit_length()  # the power of two >= n
    return 3 * p // 4 if 3 * p // 4 >= n else p


def ladder_sizes(n: int) -> list[int]:
    """The ladder's sizes <= n, ascending."""
    sizes, s = [], 1
    while s <= n:
        sizes.append(s)
        s = ladder(s + 1)
    return sizes


class ShapeCounter:
    """Distinct shapes (and calls of each) recorded while it is active."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.first_seen: dict[tuple, int] = {}  # shape -> the mark() (e.g. GRPO step) when it first appeared
        self.mark_value = 0

    def mark(self, value: int) -> None:
        self.mark_value = value

    @property
    def distinct(self) -> int:
        return len(self.counts)

    @property
    def calls(self) -> int:
        return sum(self.counts.values())

    def new_since(self, mark: int) -> int:
        """Shapes first seen at or after mark."""
        return sum(m >= mark for m in self.first_seen.values())


def record(kind: str, *shape: object) -> None:
    """Note one call's shape in every active counter (a no-op, one list check, when none is)."""
    if _ACTIVE:
        key = (kind, *shape)
        for c in _ACTIVE:
            c.counts[key] += 1
            c.first_seen.setdefault(key, c.mark_value)


@contextmanager
def count_shapes() -> Iterator[ShapeCounter]:
    counter = ShapeCounter()
    _ACTIVE.append(counter)
    try:
        yield counter
    finally:
        _ACTIVE.remove(counter)
