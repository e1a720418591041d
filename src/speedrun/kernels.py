"""The lab's compiled CPU kernels (SOURCES: the C++ beside this file), for a decode step: the Llama's attention
(speedrun.model.one_query_attention), its rotary and cache write, its residual adds and RMSNorms and its SwiGLU's
silu(gate) * up (speedrun.llama), and every model's draw (speedrun.decode._draw), each one pass where PyTorch runs
several ops; and a Llama's blocks at a decode step in one call (llama_blocks: those kernels and the packed products
from C++, in LlamaBlock's order). No backward: they run only where no gradient is wanted.

Why: at a 64-row decode of SmolLM2 the attention's batched products, casts, mask and softmax took 17-23% of a step,
about twice the time the step takes to read the cache; an RMSNorm of 64 rows took 75-90 us in 7 ops, and the rotary
and the cache write 139 us in about 15, 30 times a token; the draw's cumsum and search 2 ms; the Python around a
block's 10 calls, while one of the two threads waited, about an eighth of a step (bench/decode_attention.py,
bench/decode_smollm2.py, docs/LOG.md). Only the dynamic decode calls the Llama's (the static and compiled decodes run
Llama.decode_step, PyTorch's ops). The draw gives the bits PyTorch's ops give, so the GPT's samples do not change.

It is built on first use with torch's extension builder (a C++ compiler with OpenMP, and ninja) for this CPU's own
instructions (less AVX512 where ATen runs without it: cflags), and cached by torch (TORCH_EXTENSIONS_DIR, else
~/.cache/torch_extensions) under a name that hashes the CPU, the torch version, the flags and the source: about 10 s
once per machine, one process at a time (build_lock). Where they cannot be built (no compiler), the decode runs
PyTorch's ops, the same sums, after one message on stderr that says why.
"""
from __future__ import annotations

import contextlib
import functools
import platform
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

from speedrun.common import stable_hash

SOURCES = [Path(__file__).with_name(f) for f in ("cpu_attention.cpp", "cpu_kernels.cpp")]
HEADER = Path(__file__).with_name("cpu_kernels.h")  # the helpers both include


def cflags() -> list[str]:
    """This CPU's instructions, less those ATen's own kernels leave out here (ATEN_CPU_CAPABILITY, or a CPU whose
    AVX512 torch does not use): so the kernels take the AVX2 paths wherever ATen runs at AVX2. OpenMP:
    at::parallel_for's threads are torch's own; no trapping math: the compiler may vectorize the loops' selects (a
    float op is assumed not to trap; no value changes)."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    capability = torch.backends.cpu.get_cpu_capability()
    isa = ["-mno-avx512f"] if x86 and capability == "AVX2" else ["-mno-avx"] if x86 and capability == "DEFAULT" else []
    return ["-O3", "-march=native", *isa, "-fopenmp", "-fno-trapping-math"]


def cpu_identity() -> str:
    """This CPU's model and instruction-set flags (a -march=native build runs only where they match)."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    keep = [line for line in info if line.split(":")[0].strip() in ("model name", "flags", "Features")]
    return "\n".join(dict.fromkeys(keep))  # once: every core repeats them


LAYOUT = "sources copied into the build directory; built under build_lock"  # in the name: no older layout shares it


def extension_name() -> str:
    """The built library's name: it hashes this CPU, the torch version, the sources, the flags and the LAYOUT."""
    texts = [f.read_text() for f in SOURCES + [HEADER]]
    return "speedrun_kernels_" + stable_hash(cpu_identity(), torch.__version__, *texts, cflags(), LAYOUT, n_hex=12)


@contextlib.contextmanager
def build_lock(build_dir: Path) -> Iterator[None]:
    """Hold an flock on build_dir/build.flock while torch's builder runs there. Why: torch's own baton is a `lock`
    file it deletes when its build ends, so a process killed mid-build leaves it and every later build waits on it
    forever (a CI run stalled so); an flock the kernel drops when its holder dies, so under it (every builder of a
    LAYOUT name takes it) a `lock` file is stale, and it is removed (with a message)."""
    import fcntl  # POSIX only, as is the -march=native build

    with open(build_dir / "build.flock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        baton = build_dir / "lock"
        if baton.exists():
            print(f"speedrun.kernels: removed {baton}, which a killed build left (torch's builder would wait on it "
                  "forever)", file=sys.stderr)
            baton.unlink()
        yield


def build(name: str, texts: dict[str, str]) -> None:
    """Build (or find built) and load library name from texts (file name: C++ source; the .cpp files compiled)
    under build_lock. The sources are copied into the build directory first: every checkout with the same sources
    then compiles the same paths, so ninja finds it built (from each checkout's own path torch rewrote the build
    file and ninja rebuilt it, 13 s each, 29 times in one run of the suite)."""
    from torch.utils.cpp_extension import _get_build_directory, load

    build_dir = Path(_get_build_directory(name, verbose=False))  # torch's rule: TORCH_EXTENSIONS_DIR, else ~/.cache
    with build_lock(build_dir):
        (build_dir / "src").mkdir(exist_ok=True)
        for file, text in texts.items():
            if not (dst := build_dir / "src" / file).exists() or dst.read_text() != text:  # one a killed copy cut
                dst.write_text(text)
        load(name=name, sources=[str(build_dir / "src" / f) for f in texts if f.endswith(".cpp")],
             extra_cflags=cflags(), extra_ldflags=["-fopenmp"], build_directory=str(build_dir),
             is_python_module=False, verbose=False)


@functools.cache
def kernels_built() -> bool:
    """Whether torch.ops.speedrun_kernels is loaded: built (or found built) once per process; where it cannot be
    built, False and the reason printed once."""
    try:
        build(extension_name(), {f.name: f.read_text() for f in SOURCES + [HEADER]})
    except Exception as e:  # no compiler, no OpenMP, no ninja: PyTorch's ops do the same job, slower
        print(f"speedrun.kernels: the CPU kernels ({', '.join(f.name for f in SOURCES)}) could not be built, so the "
              f"decode runs PyTorch's ops: {type(e).__name__}: {str(e).strip()[-500:]}", file=sys.stderr)
        return False
    return True


def _kernels(*tensors: Tensor):
    """torch.ops.speedrun_kernels where the fused kernels apply to tensors: all on a CPU, all fp32 or all bf16, no
    gradient wanted (they have no backward), not traced by torch.compile (they have no shape functions), and the
    kernels built; else None."""
    t0 = tensors[0]
    if t0.device.type != "cpu" or t0.dtype not in (torch.float32, torch.bfloat16) or torch.compiler.is_compiling():
        return None
    if any(t.device != t0.device or t.dtype != t0.dtype for t in tensors):
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return None
    return torch.ops.speedrun_kernels if kernels_built() else None


def fused_decode_attention(q: Tensor, k: Tensor, v: Tensor, valid: Tensor, source: Tensor | None = None,
                           shared: int = 0) -> Tensor | None:
    """The attention of q [B, Hkv, G, D] over k, v [B, Hkv, S, D] where valid [B, S]: [B, Hkv, G, D]; None where
    the kernels do not apply (_kernels). source [B] (int64): where row b's columns [0, shared) equal row source[b]'s
    (a prompt's samples: KVCache.source), the kernel reads them there, one copy a prompt."""
    ops = _kernels(q, k, v)
    return None if ops is None else ops.decode_attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                                         valid.contiguous(), q.size(-1) ** -0.5, source, shared)


def fused_rms_norm(x: Tensor, weight: Tensor, eps: float, dtype: torch.dtype | None = None) -> Tensor | None:
    """F.rms_norm(x, weight) over x's last dimension in one pass (the mean square in fp32), in dtype (else x's: the
    dtype the next product takes, so autocast has nothing to cast); None where the kernels do not apply."""
    ops = _kernels(x) if not (torch.is_grad_enabled() and weight.requires_grad) else None
    return None if ops is None else ops.rms_norm(x.contiguous(), weight.float().contiguous(), eps, dtype)


def fused_add_rms_norm(x: Tensor, r: Tensor, weight: Tensor, eps: float, dtype: torch.dtype | None = None
                       ) -> tuple[Tensor, Tensor] | None:
    """(x + r in x's dtype, as PyTorch's add rounds it; its fused_rms_norm in dtype): a residual add and the next
    norm in one pass. r may be bf16 where x is fp32 (autocast's output on the residual stream). None where the
    kernels do not apply."""
    ops = _kernels(x) if not (torch.is_grad_enabled() and (weight.requires_grad or r.requires_grad)) else None
    if ops is None or r.device != x.device or r.dtype not in (torch.float32, torch.bfloat16):
        return None
    return ops.add_rms_norm(x.contiguous(), r.contiguous(), weight.float().contiguous(), eps, dtype)


def fused_rotary_cache(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                       pos: int) -> Tensor | None:
    """A decode step's rotary and cache write in one pass: q [B, 1, H * D], k and v [B, 1, Hkv * D] (each row's
    values contiguous: views of one packed product will do), cos and sin [B or 1, ..., D / 2] (speedrun.model.rotary's
    tables in their dtype); rotates q and k as speedrun.model.apply_rotary does (in fp32, rounded once), writes k and v
    into the layer's caches [B, Hkv, W, D] at column pos; returns q rotated, [B, H, D]. None where the kernels do not
    apply (nothing written then)."""
    ops = _kernels(q, k, v, cos, sin, k_cache, v_cache)
    if ops is None:
        return None
    half = cos.size(-1)
    return ops.rotary_cache(q, k, v, cos.reshape(-1, half).contiguous(), sin.reshape(-1, half).contiguous(), k_cache,
                            v_cache, pos)


def fused_cdf_search(probs: Tensor, u: Tensor) -> Tensor | None:
    """Each row's draw from probs [N, V] (fp32) at u [N] (fp32, in [0, 1)): the same index as
    searchsorted(probs.cumsum(-1), u[:, None] * cdf[:, -1:], right=True) clamped to V - 1 (the partial sums in fp64 one
    term after another, as PyTorch's CPU cumsum adds them), without writing the CDF. None where the kernels do not
    apply."""
    ops = _kernels(probs, u) if probs.dtype == torch.float32 else None
    return None if ops is None else ops.cdf_search(probs.contiguous(), u.contiguous())


def fused_llama_blocks(x: Tensor, weights: list[Tensor], k_cache: Tensor, v_cache: Tensor, valid: Tensor, cos: Tensor,
                       sin: Tensor, pos: int, source: Tensor | None, shared: int, n_head: int, eps: float,
                       dtype: torch.dtype) -> Tensor | None:
    """x [B, 1, C] through a Llama's blocks at a decode step in one call (Llama.fused_decode lists the weights): the
    kernels above and the packed products (speedrun.packed) LlamaBlock's decode runs, in its order, from C++; writes
    each block's keys and values into the caches [L, B, Hkv, W, D] at column pos. None where the kernels do not
    apply: x, the caches and cos must be on a CPU, without gradients, the caches and cos in the products' dtype."""
    ops = _kernels(x) if _kernels(k_cache, v_cache, cos, sin) is not None and k_cache.dtype == dtype else None
    if ops is None:
        return None
    half = cos.size(-1)
    return ops.llama_blocks(x.contiguous(), weights, k_cache, v_cache, valid.contiguous(),
                            cos.reshape(-1, half).contiguous(), sin.reshape(-1, half).contiguous(), pos, source, shared,
                            n_head, eps, k_cache.size(-1) ** -0.5, dtype)


def fused_silu_mul(gate: Tensor, up: Tensor) -> Tensor | None:
    """F.silu(gate) * up in one pass, rounded once to their dtype; None where the kernels do not apply."""
    ops = _kernels(gate, up)
    return None if ops is None else ops.silu_mul(gate, up)  # rows at a stride: the split of a packed product
