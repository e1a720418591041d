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
from typing import Callable, Iterator

import torch

_ACTIVE: list[ShapeCounter] = []
_STEP = [1]  # the process's width step (compute.width_step, set by the stage); 1 = exact shapes, no ladder
# what one more forward costs, in padded tokens (length_groups): on a CPU about 32 tokens' compute; on a GPU
# a small forward is bound by its kernel launches, so a batch runs in one forward (set by use_shapes)
_FORWARD_COST = [32]
ONE_FORWARD = 1 << 30
_FORWARD_COMPILE = [""]  # the torch.compile mode of the joint scoring forwards ("" = eager; a bench flag for now)


def width_step() -> int:
    """Widths (prompt, completion, cache, key window) are padded to multiples of this and row counts to the ladder
    when it is > 1; 1 keeps every forward at its exact size."""
    return _STEP[0]


def set_width_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"width step must be an int >= 1, not {step!r}")
    _STEP[0] = step


def forward_cost() -> int:
    """The fixed cost of one forward in padded tokens, for grouping rows of different lengths (length_groups):
    32 on CPU; on CUDA ONE_FORWARD (every group of a batch costs launches, not compute)."""
    return _FORWARD_COST[0]


def set_forward_cost(tokens: int) -> None:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"forward cost must be an int >= 0, not {tokens!r}")
    _FORWARD_COST[0] = tokens


def forward_compile() -> str:
    """The torch.compile mode the joint scoring forwards (engine.joint_hidden) run in; "" = eager."""
    return _FORWARD_COMPILE[0]


def set_forward_compile(mode: str) -> None:
    if mode not in ("", "default", "reduce-overhead", "max-autotune-no-cudagraphs"):
        raise ValueError(f"forward compile mode must be '', default, reduce-overhead or max-autotune-no-cudagraphs, "
                         f"not {mode!r}")
    _FORWARD_COMPILE[0] = mode


def scoring_hidden(model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """model.hidden, or, where forward_compile() names a torch.compile mode, model.hidden compiled in it (one
    per model, static shapes: the ladder keeps them few)."""
    mode = forward_compile()
    if not mode:
        return model.hidden
    if getattr(model, "_compiled_hidden", (None,))[0] != mode:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)  # models x widths
        model._compiled_hidden = (mode, torch.compile(model.hidden, mode=mode, dynamic=False))
    return model._compiled_hidden[1]


def resolve_width_step(step: int, device: str) -> int:
    """compute.width_step with 0 (auto) resolved: 64 on CUDA, where a new shape costs a plan or a capture and
    padding is nearly free; 1 (exact shapes) on CPU, where a shape costs nothing and every padded token does (at
    step 16 a GRPO run meets about 50 shapes instead of about 850, for 27% more continuation tokens: docs/LOG.md)."""
    return step or (64 if str(device).startswith("cuda") else 1)


def use_shapes(step: int, device: str) -> int:
    """A stage's shape settings: compute.width_step resolved for this device, and on CUDA PyTorch's cuDNN attention
    backend off: it builds an execution plan per new shape, and without it the GRPO step was 7-8x faster at exact
    shapes and 1.2-1.3x with the ladder (reports/gpu/README.md); flash / memory-efficient attention take its place."""
    set_width_step(resolve_width_step(step, device))
    cuda = str(device).startswith("cuda")
    set_forward_cost(ONE_FORWARD if cuda else 32)
    if cuda:
        torch.backends.cuda.enable_cudnn_sdp(False)
    return width_step()


@contextmanager
def using_width_step(step: int, forward_cost: int | None = None) -> Iterator[None]:
    """The width step (and, if given, the forward cost) set inside the block, restored after it."""
    old = width_step(), _FORWARD_COST[0]
    set_width_step(step)
    if forward_cost is not None:
        set_forward_cost(forward_cost)
    try:
        yield
    finally:
        set_width_step(old[0])
        set_forward_cost(old[1])


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
    """Note one call's shape in every active counter (a no-op, one list check, when none is). Not inside code that
    torch.compile traces (it would guard on the counters' state and recompile every step): the caller records."""
    if _ACTIVE and not torch.compiler.is_compiling():
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


def length_groups(lengths: list[int], group_cost: int | None = None) -> list[list[int]]:
    """Row indices sorted by length and cut into contiguous groups that minimise the padded tokens of one forward
    per group (group size x its longest row) plus group_cost tokens per extra forward (its fixed overhead).
    Rows of length 0 are left out. Exact (dynamic programming over the distinct lengths); with a width step > 1,
    ladder_groups instead. group_cost: shapes.forward_cost() unless given."""
    group_cost = forward_cost() if group_cost is None else group_cost
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: (lengths[i], i))
    if not order:
        return []
    if width_step() > 1:
        return ladder_groups(order, lengths, width_step(), group_cost)
    distinct = sorted({lengths[i] for i in order})
    upto = [sum(lengths[i] <= d for i in order) for d in distinct]  # rows with length <= each distinct length
    best = [0.0] + [float("inf")] * len(distinct)  # best[j]: cost of the rows of the first j distinct lengths
    cut = [0] * (len(distinct) + 1)
    for j in range(1, len(distinct) + 1):
        for i in range(j):  # last group: the rows with lengths distinct[i:j]
            cost = best[i] + (upto[j - 1] - (upto[i - 1] if i else 0)) * distinct[j - 1] + group_cost
            if cost < best[j]:
                best[j], cut[j] = cost, i
    bounds, j = [], len(distinct)
    while j:
        bounds.append((upto[cut[j] - 1] if cut[j] else 0, upto[j - 1]))
        j = cut[j]
    return [order[a:b] for a, b in reversed(bounds)]


def ladder_groups(order: list[int], lengths: list[int], step: int, group_cost: int) -> list[list[int]]:
    """length_groups on the shape ladder: rows `order` (sorted by length) cut into contiguous groups of a size on
    the row ladder, each run at its longest row rounded up to `step`, with the least such padded tokens plus
    group_cost per forward (dynamic programming over the cut points: O(rows x log rows))."""
    sizes = ladder_sizes(len(order))
    best = [0.0] + [float("inf")] * len(order)  # best[i]: cost of the first i rows
    cut = [0] * (len(order) + 1)
    for i in range(1, len(order) + 1):
        width = round_up(lengths[order[i - 1]], step)
        for size in sizes:
            if size > i:
                break
            cost = best[i - size] + size * width + group_cost
            if cost < best[i]:
                best[i], cut[i] = cost, i - size
    groups, i = [], len(order)
    while i:
        groups.append(order[cut[i]:i])
        i = cut[i]
    return groups[::-1]
