"""Where the embedded corpus comes from: the interpreter's stdlib files, and the pin that records which ones.

DVC cannot see which Python runs a stage. The git-tracked pin (data/interpreter.json: version and a digest of the
stdlib files the corpus reads) is a declared dependency of the corpus stage instead: the outputs always match the pin,
and the corpus stage, the only reader of the stdlib, compares it with the running interpreter. When they differ it
records the one it read, so the new pin lands in dvc.lock and git shows it changed; the stages fed by the corpus's
changed outputs then rerun. After switching Python in a workspace: `dvc repro -f -s corpus && dvc repro`."""
from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from pathlib import Path

from speedrun.common import read_json, write_json

SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test", "_bundled"}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path) -> list[Path]:
    """Every .py file under root that the corpus reads, sorted (test suites and installed packages left out)."""
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return sorted(files)


def interpreter_fingerprint(root: Path | None = None) -> dict[str, str | int]:
    """The Python version and a digest of the content of every stdlib file the corpus reads (~0.1 s)."""
    root = root or stdlib_dir()
    digest = hashlib.sha256()
    files = stdlib_files(root)
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return {"python": platform.python_version(), "implementation": platform.python_implementation(),
            "stdlib_files": len(files), "stdlib_digest": digest.hexdigest()[:16]}


def pin_interpreter(path: Path, root: Path | None = None) -> dict[str, str | int] | None:
    """Compare the pin at `path` with this interpreter's fingerprint; when they differ (or there is no pin) write this
    one and return the old pin ({} if none), else return None and leave the file's bytes as they are."""
    fp = interpreter_fingerprint(root)
    old = read_json(path) if path.is_file() else {}
    if old == fp:
        return None
    write_json(path, fp)
    return old
