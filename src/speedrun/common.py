"""Small shared helpers: stable hashing, atomic artifact writes, seeding, device choice. torch is imported inside the
functions that use it: the CLI, the stage runner and the stages' install steps import this module without paying for
torch (tests/test_runs.py checks that they do not import it)."""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import random
import signal
import sys
import tempfile
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:
    import torch

class UserError(ValueError):
    """A failure the user can fix: a bad file, checkpoint or setting, named with what is wrong with it. A command prints
    it as one line, `error: <message>`, and exits 1 (speedrun.typer_app.run_app; SPEEDRUN_TRACEBACK=1 shows the
    traceback too). A ValueError, so a caller that catches those still does."""


SPLITS = ("train", "val", "eval")  # the post-training split (data/docstrings.heldout_split), least held out first


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def stable_hash(*parts: Any, n_hex: int = 16) -> str:
    """Content hash of the parts (never Python's salted hash())."""
    return sha256_hex("\x1f".join(str(p) for p in parts))[:n_hex]


def stable_unit(*parts: Any) -> float:
    """Deterministic number in [0, 1) from the parts: used for splits and seeds."""
    return int(sha256_hex("\x1f".join(str(p) for p in parts))[:15], 16) / float(16**15)


def stable_seed(*parts: Any) -> int:
    return int(sha256_hex("\x1f".join(str(p) for p in parts))[:8], 16)


def normalize_text(text: str) -> str:
    """NFKC + collapsed whitespace: the form content ids are computed on."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    # temp file in the same directory, then os.replace: readers never see half a file
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600 files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_bytes(path: str | Path, data: bytes) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
    atomic_write(path, write)


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def read_json(path: str | Path) -> Any:
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:  # a truncated or hand-edited file: say which
            raise UserError(f"{path}: not valid JSON ({e})") from None


def read_parquet(path: str | Path, **kwargs: Any) -> "pandas.DataFrame":  # noqa: F821
    """A parquet file as a DataFrame; a truncated or foreign file names itself (pyarrow's message does not)."""
    import pandas as pd
    import pyarrow as pa
    try:
        return pd.read_parquet(path, **kwargs)
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise UserError(f"{path}: not a readable parquet file ({type(e).__name__}: "
                        f"{(str(e).splitlines() or [''])[0][:200]}); rebuild it with `dvc repro` or fix it") from None


def write_parquet(path: str | Path, df: "pandas.DataFrame") -> None:  # noqa: F821
    import pyarrow as pa

    # no pandas metadata: same rows -> byte-identical file
    write_table(path, pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(None))


def write_table(path: str | Path, table: "pyarrow.Table") -> None:  # noqa: F821
    """Atomic parquet write of an arrow table with fixed writer options (byte-identical reruns)."""
    import pyarrow.parquet as pq

    atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd", write_statistics=False))


def write_jsonl(path: str | Path, rows: list[dict]) -> None:
    write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def torch_save(path: str | Path, obj: Any) -> None:
    """Save tensors/plain containers atomically; load back with torch.load(weights_only=True)."""
    import io

    import torch
    buf = io.BytesIO()  # via memory: the zip's record names would otherwise contain the temp name
    torch.save(obj, buf)
    write_bytes(path, buf.getvalue())


def torch_load(path: str | Path, device: str = "cpu") -> Any:
    import torch
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as e:  # a truncated or foreign file: say which, and what to do (never weights_only=False)
        what = ("Delete it (a resume file: the stage then starts over from its last saved step, or from step 0)"
                if "scratch" in Path(path).parts else
                f"Restore it with `dvc checkout {path}`, or rebuild it with `dvc repro` (a DVC output)")
        raise UserError(f"{path}: not a readable checkpoint ({type(e).__name__}: "
                        f"{(str(e).splitlines() or [''])[0][:200]}). {what}") from None


def require_values(table: "pyarrow.Table", columns: tuple[str, ...], path: str | Path) -> None:  # noqa: F821
    """Every row of these columns holds a value: a null or NaN names the file, the row and the column."""
    import pyarrow.compute as pc
    for c in columns:
        if c not in table.column_names:
            raise UserError(f"{path}: no column {c!r} (have {table.column_names})")
        null = pc.is_null(table.column(c), nan_is_null=True)
        if pc.any(null).as_py():
            raise UserError(f"{path}: row {pc.index(null, True).as_py()}, column {c!r}: no value (null or NaN); "
                             "fix or drop that row upstream")


def require_unique(values: list, column: str, path: str | Path) -> None:
    """No value twice in an id column: a repeat names the file, the column and both rows (a repeated prompt id
    would be drawn twice as often, silently)."""
    seen: dict = {}
    for i, v in enumerate(values):
        if v in seen:
            raise UserError(f"{path}: rows {seen[v]} and {i}, column {column!r}: the same id {v!r} twice; an id "
                             "must name one row")
        seen[v] = i


def chat_messages(value: Any, where: str) -> list[dict]:
    """A prompt's messages as [{role, content}], refusing what is not a non-empty list of messages with a string
    role and a non-empty string content (a None, a number or a nested list), naming `where` (file and row)."""
    if isinstance(value, np.ndarray):  # pandas' reading of a parquet list column
        value = list(value)
    if not isinstance(value, (list, tuple)) or not value:
        raise UserError(f"{where}: expected a non-empty list of messages, got {value!r}")
    out = []
    for j, m in enumerate(value):
        role, content = (m.get("role"), m.get("content")) if isinstance(m, dict) else (None, None)
        if not isinstance(role, str) or not isinstance(content, str) or not content.strip():
            raise UserError(f"{where}: message {j}: expected a role and a non-empty text content, got {m!r}")
        out.append({"role": role, "content": content})
    return out


SHELLS = {"sh", "dash", "bash", "zsh", "ksh", "mksh", "ash", "busybox"}


def _ppid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(") ", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def die_with_parent() -> None:
    """On Linux: SIGKILL this process when the process that started it dies, however it dies (even by SIGKILL; kept
    across exec). A stage started by `dvc repro` or a shell never outlives it: killing DVC would otherwise leave the
    stage training, then writing outputs after DVC has moved on. DVC runs a stage through `$SHELL -c` (`/bin/sh`
    without SHELL); dash does not exec the command, so a shell stands between: when the shell's own parent dies,
    a thread here ends this process too (the shell then exits with it). Not covered: a launcher killed in the moment
    before this runs (the interpreter's start), whose stage then runs to its end."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)
    try:
        shell = Path(f"/proc/{parent}/comm").read_text().strip() in SHELLS
        shell = shell and b"-c" in Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")
    except OSError:
        shell = False
    launcher = _ppid_of(parent) if shell else None
    if launcher is None or launcher <= 1:
        return
    import threading
    import time

    def watch() -> None:  # the shell is reparented (or gone) once what started it has died
        while _ppid_of(parent) == launcher:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=watch, name="die-with-launcher", daemon=True).start()


def files_digest(*paths: str | Path) -> str:
    """Content hash of files and directories (every file below, in sorted order): a resume fingerprint's inputs."""
    h = hashlib.sha256()
    for root in map(Path, paths):
        for f in sorted(root.rglob("*")) if root.is_dir() else [root]:
            if f.is_file():
                h.update(f.relative_to(root).as_posix().encode() if root.is_dir() else b"")
                h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


def seed_everything(seed: int) -> torch.Generator:
    import torch
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def pick_device(device: str = "auto") -> str:
    if device == "auto":
        import torch
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def runs_at_once(run_threads: int, nproc: int, device: str) -> int:
    """How many GRPO runs go side by side (compute.run_threads): on CPU under one process each, one per run_threads
    cores; on a GPU, under torchrun, or with run_threads 0, one at a time."""
    if run_threads == 0 or nproc > 1 or device != "cpu":
        return 1
    return max(1, usable_cores() // run_threads)


def set_run_threads(run_threads: int, nproc: int, device: str) -> None:
    """A GRPO run's CPU threads, fixed whether it runs by hand or beside others: fp32 sums depend on the count."""
    if run_threads and nproc == 1 and device == "cpu":
        import torch
        torch.set_num_threads(run_threads)


def keep_freed_memory() -> bool:
    """Under glibc, serve every allocation from the heap and keep what is freed there (mallopt: no mmap, trim only
    above 2 GB). glibc maps each block over 32 MB fresh and returns it on free, so a decode step's logits or a
    sampling cache are faulted in page by page every time: 13M page faults and 26 of 72 s of system time in task_eval,
    15 s in 40 pretraining steps. Allocation only: the numbers computed are the same. Returns whether it applied."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    m_trim_threshold, m_mmap_max = -1, -4  # malloc.h
    return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))


def use_bf16(dtype: str, device: str) -> bool:
    """Whether to autocast to bf16. "auto": where the hardware multiplies bf16 natively (CUDA GPUs that support it,
    CPUs with AVX512-BF16 or AMX); elsewhere bf16 is emulated and far slower than fp32 (1 GFLOP/s seen)."""
    if dtype not in ("auto", "fp32", "bf16"):
        raise ValueError(f"dtype must be auto, fp32 or bf16, not {dtype!r}")
    if dtype != "auto":
        return dtype == "bf16"
    import torch
    if device.startswith("cuda"):
        return torch.cuda.is_bf16_supported()
    cpu = torch.cpu
    return any(getattr(cpu, f, lambda: False)() for f in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def check_finite(value: float, what: str, step: int) -> None:
    """A NaN/inf loss stops the stage: nothing is written from a diverged run."""
    if not np.isfinite(value):
        raise FloatingPointError(f"{what} is {value} at step {step}: stopping, no checkpoint written")
