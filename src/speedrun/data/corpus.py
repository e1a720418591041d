"""Pretraining corpus: the embedded stdlib prose or a Hugging Face text dataset, cleaned,
deduplicated by content hash, and split train/val. Every skipped document is counted by reason."""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Iterator

import pandas as pd

from speedrun.common import stable_hash, stable_unit
from speedrun.data import hub
from speedrun.data.docstrings import DocObject, split_of

COLUMNS = ["id", "text", "source"]


def clean_text(value: object) -> tuple[str | None, str | None]:
    """(text, None) if usable, else (None, skip reason)."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None, "undecodable"
    if not isinstance(value, str):
        return None, "not_a_string" if value is not None else "missing"
    try:
        value.encode("utf-8")  # lone surrogates cannot be encoded: broken upstream decoding
    except UnicodeEncodeError:
        return None, "undecodable"
    if not value.strip():
        return None, "empty"
    return value, None


def _dedup_split(docs: Iterable[tuple[str, object, str]], stats: Counter) -> dict[str, list[dict]]:
    """docs: (split_key, raw text, source). Returns rows per split; counts every doc."""
    seen: set[str] = set()
    out: dict[str, list[dict]] = {"train": [], "val": []}
    for split, raw, source in docs:
        stats["docs_in"] += 1
        text, reason = clean_text(raw)
        if reason:
            stats[f"skipped_{reason}"] += 1
            continue
        doc_id = stable_hash(text)
        if doc_id in seen:
            stats["skipped_duplicate"] += 1
            continue
        seen.add(doc_id)
        out[split].append({"id": doc_id, "text": text, "source": source})
        stats["kept"] += 1
    return out


def embedded_docs(objects: list[DocObject], val_frac: float, max_docs: int) -> Iterator[tuple[str, object, str]]:
    """(split, text, source) of at most max_docs collected objects."""
    return ((split_of(o.top, val_frac), o.text, "pydoc_topics" if o.kind == "topic" else "stdlib")
            for o in objects[:: -(-len(objects) // max_docs)])  # an even stride keeps every module represented


def hf_docs(path: str, name: str | None, split: str, text_column: str, max_docs: int, val_frac: float,
            seed: int = 0, shuffle_buffer: int = 0) -> Iterator[tuple[str, object, str]]:
    """Stream rows from a hub id or a local dir/file in the same layout (through a seeded shuffle buffer where
    shuffle_buffer > 0, hub.stream); only max_docs are read."""
    ds = hub.stream(path, name, split, seed, shuffle_buffer)
    for i, row in enumerate(ds):
        if i >= max_docs:
            break
        if text_column not in row:
            raise KeyError(f"{path} row {i} of the stream: no column {text_column!r} (columns: {sorted(row)})")
        raw = row[text_column]
        # hf docs have no module: split by a stable hash of the content
        key = stable_hash(raw) if isinstance(raw, str) else str(i)
        yield ("val" if stable_unit("split", key) < val_frac else "train"), raw, path


def build(docs: Iterable[tuple[str, object, str]], extra_stats: dict[str, int] | None = None
          ) -> tuple[dict[str, pd.DataFrame], dict]:
    stats: Counter = Counter()
    rows = _dedup_split(docs, stats)
    frames = {s: pd.DataFrame(r, columns=COLUMNS) for s, r in rows.items()}
    skipped = {k.removeprefix("skipped_"): v for k, v in sorted(stats.items()) if k.startswith("skipped_")}
    out = {
        "docs_in": stats["docs_in"],
        "kept": stats["kept"],
        "skipped": skipped,
        "splits": {s: {"docs": len(f), "chars": int(f["text"].str.len().sum())} for s, f in frames.items()},
    }
    if extra_stats:
        out["files_skipped"] = extra_stats
    assert out["docs_in"] == out["kept"] + sum(skipped.values())
    return frames, out
