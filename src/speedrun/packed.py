"""Linear layers with their weights packed once for oneDNN, for sampling in bf16 on a CPU.

Why: a bf16 F.linear on a CPU (oneDNN's matmul) reorders its weight into oneDNN's blocked layout at every call. At a
64-row decode step of SmolLM2 that reorder is about a fifth of each product's time (bench/decode_smollm2.py), and a
decode calls every weight once per token. Packed once per generate() call, the products are bit for bit those of
F.linear under autocast (tests/test_packed.py): the same cast, the same kernel, without the reorder.

    with packed_linears(model, torch.bfloat16, rows=64):  # every nn.Linear of model, inference only
        ...

Linears that read the same input (a Llama's query, key and value; its gate and up) are also packed as one product,
which a module declares in FUSE and reads through fused(): fewer, wider products (bit for bit the separate ones'
outputs: tests/test_packed.py).
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


def fused(module: nn.Module, name: str, x: Tensor) -> tuple[Tensor, ...] | None:
    """The outputs of module's Linears named in module.FUSE[name] for input x, from one packed product inside
    packed_linears; None outside it (the module then calls its Linears one by one)."""
    product = module.__dict__.get(name)
    return None if product is None else product(x).split(product.sizes, -1)


def packed_weight(module: nn.Module, name: str) -> Tensor | None:
    """The packed weight of module's product `name` (a FUSE name, or "forward": the module's own Linear) inside
    packed_linears, where it has no bias; else None."""
    product = module.__dict__.get(name)
    return None if product is None or product.args[1] is not None else product.args[0]


def _pack(linears: list[nn.Linear], dtype: torch.dtype, rows: int):
    """One packed product of linears' weights stacked (their outputs side by side), its output sizes attached."""
    w = torch.ops.mkldnn._reorder_linear_weight(torch.cat([m.weight for m in linears]).to(dtype), rows)
    b = None if linears[0].bias is None else torch.cat([m.bias for m in linears]).to(dtype)
    product = functools.partial(_forward, w, b, dtype)
    product.sizes = [m.out_features for m in linears]
    return product


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
                    m.forward = _pack([m], dtype, rows)  # shadows the class's forward
                    swapped.append((m, "forward"))
                for name, parts in getattr(m, "FUSE", {}).items():
                    if name not in m.__dict__:
                        setattr(m, name, _pack([getattr(m, part) for part in parts], dtype, rows))
                        swapped.append((m, name))
    try:
        yield
    finally:
        for m, name in swapped:
            delattr(m, name)
