"""Preference pairs: the shared record, row checks, accounting and the streaming parquet writer.

Each source module (pairs_hh, pairs_uf, pairs_se, pairs_embedded) gives a `Source`: an iterator
of (split, raw row) and a parser turning one row into pairs or raising `Skip(reason)`. `build`
counts every row (rows read + extra pairs = pairs kept + skipped) and writes pairs.parquet in
batches, so memory stays flat however many rows are read."""
from __future__ import annotations

from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from speedrun.common import UserError, atomic_write, normalize_text, stable_hash
from speedrun.data.corpus import clean_text
from speedrun.data.prompts import canonical_prompt

SOURCES = ("hh", "uf", "se", "embedded")
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
SCHEMA = pa.schema([
    ("id", pa.string()),
    ("src", pa.string()),
    ("split", pa.string()),  # the source's own split: HH train/test, UF train_prefs/test_prefs, ...
    ("prompt", pa.list_(MESSAGE)),  # earlier turns stay in the prompt; it ends with a user turn
    ("chosen", pa.string()),
    ("rejected", pa.string()),
    ("group", pa.string()),  # embedded: top-level module; other sources: the src
    ("negative", pa.string()),  # embedded: hard (same module) or random; else null
    ("attribution", pa.string()),  # se: JSON with the answer authors (CC-BY-SA-4.0); else null
])


class Skip(Exception):
    """A row that yields no pair; the message is the counted reason."""


class Source(NamedTuple):
    rows: Iterator[tuple[str, Any]]  # (split, raw row)
    parse: Callable[[Any, str], list[dict]]  # -> pairs (never empty) or raises Skip
    extra: dict  # source-specific counters filled while parsing, copied into stats.json


def text(value: Any, what: str) -> str:
    """A usable string field or Skip: missing, wrong type, undecodable, empty."""
    value, reason = clean_text(value)
    if reason:
        raise Skip(f"{reason}_{what}")
    if "\ufffd" in value:  # U+FFFD: the text was already mangled by a failed decode upstream
        raise Skip(f"undecodable_{what}")
    return value


def make_pair(src: str, split: str, prompt: list[dict], chosen: str, rejected: str, group: str | None = None,
              negative: str | None = None, attribution: str | None = None) -> dict:
    if not prompt or not any(m["content"].strip() for m in prompt):
        raise Skip("empty_prompt")
    if prompt[-1]["role"] != "user":
        raise Skip("prompt_not_ending_in_user_turn")
    chosen, rejected = chosen.strip(), rejected.strip()
    if not chosen or not rejected:
        raise Skip("empty_response")
    canon = canonical_prompt(prompt)
    c, r = normalize_text(chosen), normalize_text(rejected)
    if c == r:
        raise Skip("chosen_equals_rejected")
    return {
        "id": stable_hash(src, canon, c, r),
        "src": src, "split": split,
        "prompt": [{"role": m["role"], "content": m["content"]} for m in prompt],
        "chosen": chosen, "rejected": rejected,
        "group": group or src, "negative": negative, "attribution": attribution,
    }


def messages(value: Any, what: str) -> list[dict]:
    """A list of {role, content} dicts with str fields, as stored by the hub datasets."""
    if value is None:
        raise Skip(f"missing_{what}")
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise Skip(f"not_a_message_list_{what}")
    out = []
    for m in value:
        if m.get("role") not in ("system", "user", "assistant"):
            raise Skip(f"bad_role_{what}")
        out.append({"role": m["role"], "content": text(m.get("content"), what)})
    return out


def hub_rows(src: str, path: str, split: str, data_dir: str | None = None) -> Iterator[tuple[str, dict]]:
    """(split, row) streamed with datasets.load_dataset: a hub id or a local dir in the hub layout
    take the same call. A file that cannot be parsed stops the stage with its name."""
    from datasets import load_dataset

    try:
        for row in load_dataset(path, data_dir=data_dir, split=split, streaming=True):
            yield split, row
    except Exception as e:
        raise UserError(f"{src}: cannot read {_files(path, data_dir, split)}: {type(e).__name__}: {e}") from e


def _files(path: str, data_dir: str | None, split: str) -> str:
    """The data files behind a split, for error messages only."""
    try:
        from datasets import load_dataset_builder

        files = load_dataset_builder(path, data_dir=data_dir).config.data_files[split]
        return ", ".join(str(f) for f in files)
    except Exception:  # the resolution itself failed: name what we were asked for
        return f"{path} (data_dir={data_dir}, split={split})"


def round_robin(streams: list[Iterable]) -> Iterator:
    """One row from each stream in turn, so a row limit still samples every split."""
    its = [iter(s) for s in streams]
    while its:
        alive = []
        for it in its:
            try:
                yield next(it)
            except StopIteration:
                continue
            alive.append(it)
        its = alive


def _batched(rows: Iterator[dict], n: int) -> Iterator[list[dict]]:
    while batch := list(islice(rows, n)):
        yield batch


def _pairs(name: str, source: Source, limit: int, seen: set[str], stats: dict) -> Iterator[dict]:
    from tqdm import tqdm

    skipped, splits, negatives = Counter(), Counter(), Counter()
    read = kept = extra = 0
    for split, row in tqdm(source.rows, desc=f"pairs {name}", unit=" rows", mininterval=5, disable=None):
        if 0 < limit <= kept:  # the source's cap is on pairs kept: a row with many pairs counts them all
            break
        read += 1
        try:
            pairs = source.parse(row, split)
        except Skip as s:
            skipped[str(s)] += 1
            continue
        extra += len(pairs) - 1  # a stack exchange question gives several pairs
        for p in pairs:
            if 0 < limit <= kept:  # the cap reached within this row: its remaining pairs are counted, not kept
                skipped["over_limit"] += 1
                continue
            if p["id"] in seen:  # ids are content hashes: the same pair twice is kept once
                skipped["duplicate_pair"] += 1
                continue
            seen.add(p["id"])
            kept += 1
            splits[p["split"]] += 1
            if p["negative"]:
                negatives[p["negative"]] += 1
            yield p
    assert read + extra == kept + sum(skipped.values()), name
    stats[name] = {"rows_read": read, "extra_pairs": extra, "pairs_kept": kept,
                   "skipped": dict(sorted(skipped.items())), "splits": dict(sorted(splits.items())),
                   **({"negatives": dict(sorted(negatives.items()))} if negatives else {}), **source.extra}


def build(sources: dict[str, Source], out_path: str | Path, limit: int = 0, batch_rows: int = 4096) -> dict:
    """Read every source in order, write the kept pairs to out_path; return per-source stats."""
    stats: dict[str, dict] = {}
    seen: set[str] = set()
    rows = (p for name, src in sources.items() for p in _pairs(name, src, limit, seen, stats))

    def write(tmp: str) -> None:
        # fixed schema and writer options: the same rows give a byte-identical file
        with pq.ParquetWriter(tmp, SCHEMA, compression="zstd", write_statistics=False) as w:
            for batch in _batched(rows, batch_rows):
                w.write_table(pa.Table.from_pylist(batch, schema=SCHEMA))

    atomic_write(out_path, write)
    return {"total_pairs": sum(s["pairs_kept"] for s in stats.values()), "sources": stats}
