"""A committed experiment as two files in git: its README.md, and results.zip beside it holding everything else (the
report, metrics, answers, upstream sub-runs; an answers file of a megabyte or more stays a file beside them). Paths
keep their meaning: `reports/experiments/x/answers.parquet` names the member `answers.parquet` of
`reports/experiments/x/results.zip`, so every command written in the docs still reads what it names. Readers go
through here: a path that is a file on disk (a workspace output, a folder not packed yet, a large answers file) is
read as it is, else as the member of the nearest results.zip above it. The zip is deterministic (members sorted,
fixed timestamps): the same files give the same bytes on one zlib build, so a repacked experiment does not churn git.

    python -m speedrun.kept reports/experiments/task-control-20-seeds/task.md    # print a member
    python -m speedrun.kept --pack reports/experiments/<name>                     # move its files into results.zip
"""
from __future__ import annotations

import fnmatch
import io
import json
import sys
import zipfile
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

import typer

from speedrun.common import UserError, write_bytes
from speedrun.typer_app import new_app, run_app

BUNDLE = "results.zip"
STAYS = ("README.md",)  # files of a folder's top level that stay files: what a reader opens first
DRAWN = ("figures",)  # top-level folders that stay out: drawn on demand (speedrun.eval.replot), ignored by git
# a file this large stays beside the zip: it is parquet, compressed already, so zipping it saves nothing, and a file
# committed before stays the one blob git already holds (repacking the experiments' 8 such files would have added
# 30 MB to the history)
LOOSE_BYTES = 1_000_000
app = new_app()


def locate(path: str | Path) -> tuple[Path, str] | None:
    """(the nearest results.zip in a folder above `path`, `path` relative to that folder), or None."""
    p = Path(path)
    for parent in p.parents:
        if (parent / BUNDLE).is_file():
            return parent / BUNDLE, PurePosixPath(p.relative_to(parent)).as_posix()
    return None


def _members(bundle: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(bundle) as z:
        return {n: z.read(n) for n in z.namelist()}


def exists(path: str | Path) -> bool:
    """A file or folder on disk, or a member (or a folder of members) of the results.zip above it."""
    if Path(path).exists():
        return True
    hit = locate(path)
    if hit is None:
        return False
    with zipfile.ZipFile(hit[0]) as z:
        names = z.namelist()
    return hit[1] in names or any(n.startswith(hit[1] + "/") for n in names)


def read_bytes(path: str | Path) -> bytes:
    p = Path(path)
    if p.is_file():
        return p.read_bytes()
    hit = locate(p)
    if hit is not None:
        with zipfile.ZipFile(hit[0]) as z:
            if hit[1] in z.namelist():
                return z.read(hit[1])
    raise FileNotFoundError(f"{path}: no such file, nor a member of a {BUNDLE} in a folder above it")


def read_text(path: str | Path) -> str:
    return read_bytes(path).decode("utf-8")


def read_json(path: str | Path) -> Any:
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None


def read_parquet(path: str | Path, **kwargs: Any) -> "pd.DataFrame":  # noqa: F821
    import pandas as pd
    return pd.read_parquet(io.BytesIO(read_bytes(path)), **kwargs)


def glob(folder: str | Path, pattern: str) -> list[Path]:
    """Paths under `folder` matching `pattern` (segment by segment, as Path.glob without **), on disk, in the
    results.zip of `folder` or above it, and in the results.zip of a sub-folder the pattern's leading segments match
    (an upstream sub-run kept on its own, before its experiment is packed), sorted."""
    folder, parts = Path(folder), pattern.split("/")
    found = set(folder.glob(pattern))
    hit = locate(folder / "_")  # the bundle of folder itself, or of a folder above it
    if hit is not None:
        found |= _matches(hit[0], PurePosixPath(hit[1]).parent.as_posix(), parts, folder)
    for k in range(1, len(parts)):  # bundles below folder: <leading segments>/results.zip
        for bundle in folder.glob("/".join(parts[:k] + [BUNDLE])):
            found |= _matches(bundle, ".", parts[k:], bundle.parent)
    return sorted(found)


def _matches(bundle: Path, prefix: str, parts: list[str], base: Path) -> set[Path]:
    """base / each member of `bundle` under `prefix` whose remaining path matches `parts` segment by segment."""
    out = set()
    with zipfile.ZipFile(bundle) as z:
        for name in z.namelist():
            rel = name[len(prefix) + 1:] if prefix != "." else name
            if (prefix == "." or name.startswith(prefix + "/")) and len(rel.split("/")) == len(parts) and all(
                    fnmatch.fnmatchcase(a, b) for a, b in zip(rel.split("/"), parts)):
                out.add(base / rel)
    return out


def _zip(members: dict[str, bytes]) -> bytes:
    """The zip of `members`, sorted, with fixed times and modes: the same members give the same bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            # parquet is compressed already: stored as it is, the rest deflated
            info.compress_type = zipfile.ZIP_STORED if name.endswith(".parquet") else zipfile.ZIP_DEFLATED
            z.writestr(info, members[name], compresslevel=9 if info.compress_type == zipfile.ZIP_DEFLATED else None)
    return buf.getvalue()


def write(path: str | Path, data: bytes) -> None:
    """Write `path`: into the results.zip above it when there is one (the member replaced, the zip rewritten
    atomically), else as a file."""
    hit = locate(path)
    if hit is None:
        write_bytes(path, data)
        return
    members = _members(hit[0])
    members[hit[1]] = data
    write_bytes(hit[0], _zip(members))


def write_json(path: str | Path, obj: Any) -> None:
    """common.write_json's bytes, written by `write`."""
    write(path, (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"))


def pack(folder: str | Path) -> Path:
    """Move every file of `folder` but its top-level README.md, figures/ and files of LOOSE_BYTES or more into
    folder/results.zip (merged with the members it holds; a file on disk replaces its member), then remove them and
    the folders they leave empty."""
    folder = Path(folder)
    bundle = folder / BUNDLE
    members = _members(bundle) if bundle.is_file() else {}
    candidates = [f for f in sorted(folder.rglob("*")) if f.is_file() and f != bundle
                  and not (f.parent == folder and f.name in STAYS) and f.relative_to(folder).parts[0] not in DRAWN]
    files = [f for f in candidates if f.stat().st_size < LOOSE_BYTES or f.name == BUNDLE]  # sub-runs: merged
    for f in candidates:  # a large file stays on disk, and no older copy of it stays in the zip
        rel = PurePosixPath(f.relative_to(folder)).as_posix()
        members.pop(rel, None)
        if f in files and f.name == BUNDLE:  # a sub-folder kept on its own (a sub-run): its members join, unzipped
            sub = PurePosixPath(rel).parent.as_posix()
            members.update({f"{sub}/{n}": b for n, b in _members(f).items()})
        elif f in files:
            members[rel] = f.read_bytes()
    if not members:
        raise SystemExit(f"{folder}: nothing to pack (only {', '.join(STAYS)})")
    write_bytes(bundle, _zip(members))
    for f in files:
        f.unlink()
    for d in sorted((d for d in folder.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
        if not any(d.iterdir()):
            d.rmdir()
    return bundle


def drop_model(folder: str | Path, model: str) -> int:
    """Remove one model's rows from every sub-run's answers.parquet under `folder` (files or members), rewritten as
    the evaluation writes them: for answers another committed experiment keeps byte for byte (an analysis checks that
    first). Returns the rows dropped; refuses a folder where the model has none."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    dropped = 0
    for path in glob(folder, "*/answers.parquet"):
        table = pq.read_table(io.BytesIO(read_bytes(path)))
        mask = pc.not_equal(table["model"], model)
        dropped += table.num_rows - int(pc.sum(mask).as_py() or 0)
        buf = io.BytesIO()
        pq.write_table(table.filter(mask), buf, compression="zstd", write_statistics=False)  # common.write_table's
        write(path, buf.getvalue())
    if not dropped:
        raise SystemExit(f"{folder}: no answers of {model!r} in */answers.parquet")
    return dropped


@app.command(help=__doc__.splitlines()[0])
def command(path: Annotated[Path, typer.Argument(help="a member to print (reports/experiments/<name>/task.md), "
                                                      "or with --pack the experiment folder to pack")],
            pack_folder: Annotated[bool, typer.Option("--pack", help="move the folder's files into its results.zip "
                                                                     "(README.md stays)")] = False,
            drop: Annotated[str, typer.Option(help="with the experiment folder: remove this model's rows from its "
                                                   "sub-runs' answers (kept elsewhere, byte for byte)")] = "") -> None:
    if drop:
        print(f"{path}: {drop_model(path, drop)} answers of {drop} dropped")
        return
    if pack_folder:
        print(pack(path))
        return
    try:
        sys.stdout.buffer.write(read_bytes(path))
    except FileNotFoundError as e:
        raise SystemExit(str(e)) from None


def main(argv: list[str] | None = None) -> None:
    run_app(app, argv, "python -m speedrun.kept")


if __name__ == "__main__":
    main()
