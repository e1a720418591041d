"""Where the embedded corpus comes from: the interpreter's stdlib files, and a fingerprint of them.

Kept free of torch and pandas imports: the `interpreter` stage runs this on every `dvc repro` (DVC cannot see which
Python runs a stage, so a stage that always runs writes what the corpus depends on: a different Python changes its
output, and DVC reruns the corpus stage, then only what the corpus's changed outputs feed)."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sysconfig
from pathlib import Path

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


def write_fingerprint(path: Path) -> dict[str, str | int]:
    """Write interpreter_fingerprint() as JSON, atomically (tmp file + rename; common.write_json would import torch)."""
    fp = interpreter_fingerprint()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(fp, indent=2) + "\n")
    os.replace(tmp, path)
    return fp
