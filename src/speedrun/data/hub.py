"""Streaming a Hugging Face dataset: a hub id, a local dir in the hub layout or one .parquet/.jsonl file, read
with the same `datasets` call, optionally through a seeded shuffle so the first N rows are not the files' first N."""
from __future__ import annotations

from typing import Any

FILES = (".parquet", ".jsonl", ".json", ".jsonl.gz")


def stream(path: str, name: str | None, split: str, seed: int = 0, shuffle_buffer: int = 0,
           data_dir: str | None = None) -> Any:
    """An IterableDataset of the split. shuffle_buffer > 0: datasets' streaming shuffle (the shards in an order
    drawn from `seed`, rows through a buffer of that many), the same rows in the same order on every rerun."""
    from datasets import load_dataset

    if path.endswith(FILES):
        builder = "parquet" if path.endswith(".parquet") else "json"
        ds = load_dataset(builder, data_files={split: path}, split=split, streaming=True)
    else:
        ds = load_dataset(path, name, split=split, streaming=True, data_dir=data_dir)
    return ds.shuffle(seed=seed, buffer_size=shuffle_buffer) if shuffle_buffer > 0 else ds
