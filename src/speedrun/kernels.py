"""The lab's compiled CPU kernels (cpu_kernels.cpp beside this file), for the Llama's decode step: its attention
(speedrun.model.one_query_attention), its RMSNorms and its SwiGLU's silu(gate) * up (speedrun.llama), each one pass
where PyTorch runs several ops. No backward: they run only where no gradient is wanted.

Why: at a 64-row decode of SmolLM2 the attention's batched products, casts, mask and softmax took 17-23% of a step,
about twice the time the step takes to read the cache, and an RMSNorm of 64 rows took 75-90 us in 7 ops, 60 times
a token, in a profiled decode (bench/decode_attention.py, docs/LOG.md). Only the dynamic decode calls them (the static
and compiled decodes run Llama.decode_step, PyTorch's ops).

It is built on first use with torch's extension builder (a C++ compiler with OpenMP, and ninja) for this CPU's own
instructions, and cached by torch (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions) under a name that hashes
the CPU, the torch version and the source: about 10 s once per machine. Where they cannot be built (no compiler),
the decode runs PyTorch's ops, the same sums, after one message on stderr that says why.
"""
from __future__ import annotations

import functools
import platform
import sys
from pathlib import Path

import torch
from torch import Tensor

from speedrun.common import stable_hash

SOURCE = Path(__file__).with_name("cpu_kernels.cpp")
# this CPU's instructions; OpenMP: at::parallel_for's threads are torch's own; no trapping math: the compiler may
# vectorize the loops' selects (a float op is assumed not to trap; no value changes)
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-trapping-math"]


def cpu_identity() -> str:
    """This CPU's model and instruction-set flags (a -march=native build runs only where they match)."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    keep = [line for line in info if line.split(":")[0].strip() in ("model name", "flags", "Features")]
    return "\n".join(dict.fromkeys(keep))  # once: every core repeats them


@functools.cache
def kernels_built() -> bool:
    """Whether torch.ops.speedrun_kernels is loaded: built (or found built) once per process; where it cannot be
    built, False and the reason printed once."""
    from torch.utils.cpp_extension import load

    name = "speedrun_kernels_" + stable_hash(cpu_identity(), torch.__version__, SOURCE.read_text(), CFLAGS, n_hex=12)
    try:
        load(name=name, sources=[str(SOURCE)], extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"], is_python_module=False,
             verbose=False)
    except Exception as e:  # no compiler, no OpenMP, no ninja: PyTorch's ops do the same job, slower
        print(f"speedrun.kernels: the CPU kernels ({SOURCE.name}) could not be built, so the decode runs PyTorch's "
              f"ops: {type(e).__name__}: {str(e).strip()[-500:]}", file=sys.stderr)
        return False
    return True


def _kernels(*tensors: Tensor):
    """torch.ops.speedrun_kernels where the fused kernels apply to tensors: all on a CPU, all fp32 or all bf16, no
    gradient wanted (they have no backward), and the kernels built; else None."""
    t0 = tensors[0]
    if t0.device.type != "cpu" or t0.dtype not in (torch.float32, torch.bfloat16):
        return None
    if any(t.device != t0.device or t.dtype != t0.dtype for t in tensors):
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return None
    return torch.ops.speedrun_kernels if kernels_built() else None


def fused_decode_attention(q: Tensor, k: Tensor, v: Tensor, valid: Tensor) -> Tensor | None:
    """The attention of q [B, Hkv, G, D] over k, v [B, Hkv, S, D] where valid [B, S]: [B, Hkv, G, D]; None where
    the kernels do not apply (_kernels)."""
    ops = _kernels(q, k, v)
    return None if ops is None else ops.decode_attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                                         valid.contiguous(), q.size(-1) ** -0.5)


def fused_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor | None:
    """F.rms_norm(x, weight) over x's last dimension in one pass (the mean square in fp32), in x's dtype; None where
    the kernels do not apply."""
    ops = _kernels(x) if not (torch.is_grad_enabled() and weight.requires_grad) else None
    return None if ops is None else ops.rms_norm(x.contiguous(), weight.float().contiguous(), eps)


def fused_silu_mul(gate: Tensor, up: Tensor) -> Tensor | None:
    """F.silu(gate) * up in one pass, rounded once to their dtype; None where the kernels do not apply."""
    ops = _kernels(gate, up)
    return None if ops is None else ops.silu_mul(gate.contiguous(), up.contiguous())
