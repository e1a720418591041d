"""Linear layers with their weights packed once for oneDNN, for sampling in bf16 on a CPU.

Why: a bf16 F.linear on a CPU (oneDNN's matmul) reorders its weight into oneDNN's blocked layout at every call. At a
64-row decode step of SmolLM2 that reorder is about a fifth of each product's time (bench/decode_smollm2.py), and a
decode calls every weight once per token. Packed once per generate() call, the products are bit for bit those of
F.linear under autocast (tests/test_packed.py): the same cast, the same kernel, without the reorder.

    with packed_linears(model, torch.bfloat16, rows=64):  # every nn.Linear of model, inference only
        ...
"""
from __future__ import annotations

import contextlib
import functools
from typing import Iterator

import torch
import torch.nn as nn
from torch import Tensor


def available() -> bool:
    """Whether this torch build has oneDNN's packed linear and runs bf16 products through oneDNN."""
    mkldnn = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_linear_pointwise")
            and hasattr(mkldnn, "_reorder_linear_weight") and bool(mkldnn._is_mkldnn_bf16_supported()))


def sampling_dtype(device: torch.device) -> torch.dtype | None:
    """bf16 where a CPU forward here runs under bf16 autocast and the packed products are available; else None."""
    if device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        return None
    return torch.bfloat16 if torch.get_autocast_dtype("cpu") == torch.bfloat16 and available() else None


def _forward(weight: Tensor, bias: Tensor | None, dtype: torch.dtype, x: Tensor) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x.to(dtype), weight, bias, "none", [], "")


@contextlib.contextmanager
def packed_linears(model: nn.Module, dtype: torch.dtype | None, rows: int) -> Iterator[None]:
    """Within: every nn.Linear of model computes in dtype from a weight packed once (rows: the row count to pack
    for; any count runs). No gradients flow to the weights, so only for inference with weights that do not change
    inside. dtype None: nothing changes. On the way out the layers are the model's own again."""
    swapped = []
    if dtype is not None:
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, nn.Linear) and "forward" not in m.__dict__:
                    w = torch.ops.mkldnn._reorder_linear_weight(m.weight.to(dtype), rows)
                    b = None if m.bias is None else m.bias.to(dtype)
                    m.forward = functools.partial(_forward, w, b, dtype)  # shadows the class's forward
                    swapped.append(m)
    try:
        yield
    finally:
        for m in swapped:
            del m.forward
