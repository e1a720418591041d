"""SFT conversations: embedded (questions about stdlib objects answered by their docstring
summary) or a Hugging Face chat dataset with a `messages` column (HuggingFaceTB/smoltalk).

A conversation is a list of {role, content}; roles are system (first only), user, assistant,
alternating from the first user turn, with at least one assistant turn."""
from __future__ import annotations

import random
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

from speedrun.data.corpus import clean_text
from speedrun.data import gold, hub
from speedrun.data.docstrings import DocObject, heldout_split, load_objects
from speedrun.data.questions import answerable, questions
from speedrun.common import UserError


@lru_cache(maxsize=1)
def embedded_qa(objects_path: Path) -> tuple[tuple[tuple[DocObject, str], ...], dict[str, int]]:
    """(object, answer) for every answerable object of the corpus stage's table, plus skip counts; read once."""
    usable, skipped = answerable(load_objects(objects_path))
    return tuple(usable), skipped


def embedded_conversations(objects_path: Path, val_frac: float, eval_frac: float, seed: int, per_object: int = 0,
                           gold_per_item: int = 0, skipped: dict[str, int] | None = None
                           ) -> dict[str, list[list[dict]]]:
    """{'train': [...], 'val': [...]}: per object, `per_object` of its question templates (0 = all of them), and
    per gold-task item up to `gold_per_item` of its right answers (data/gold.py), picked and shuffled with `seed`.
    The split is heldout_split of the object's top-level module; 'eval' modules are never trained on (their count
    is returned in `skipped` as held_out_eval). Objects with an empty or overlong summary are skipped; pass a dict
    as `skipped` to receive the counts."""
    usable, skips = embedded_qa(Path(objects_path))
    skips = dict(skips)
    out: dict[str, list[list[dict]]] = {"train": [], "val": [], "eval": []}
    rng = random.Random(seed)
    for obj, answer in usable:
        qs = questions(obj)
        if 0 < per_object < len(qs):
            qs = rng.sample(qs, per_object)
        for q in qs:
            conv = [{"role": "user", "content": q}, {"role": "assistant", "content": answer}]
            out[heldout_split(obj.top, val_frac, eval_frac)].append(conv)
    if gold_per_item:
        items = gold.gold_items(load_objects(Path(objects_path)), val_frac, eval_frac)
        for split in ("train", "val"):
            out[split] += gold.conversations(items, split, gold_per_item, seed)
    skips["held_out_eval"] = len(out.pop("eval"))
    if skipped is not None:
        skipped.update(sorted(skips.items()))
    for convs in out.values():
        rng.shuffle(convs)
    return out


def check_conversation(value: Any) -> tuple[list[dict] | None, str | None]:
    """(clean conversation, None) or (None, skip reason)."""
    if value is None:
        return None, "missing"
    if not isinstance(value, list) or not value:
        return None, "not_a_message_list"
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            return None, "not_a_message"
        role = m.get("role")
        if role not in ("system", "user", "assistant"):
            return None, "bad_role"
        content, reason = clean_text(m.get("content"))
        if reason:
            return None, "non_str_content" if reason in ("missing", "not_a_string") else f"{reason}_content"
        expected = "user" if not out or out[-1]["role"] in ("system", "assistant") else "assistant"
        if (role == "system" and i > 0) or (role != "system" and role != expected):
            return None, "bad_role_order"  # the chat template folds a system turn into the next user turn
        out.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in out):
        return None, "no_assistant_turn"
    return out, None


def hf_conversations(path: str, name: str | None, split: str, max_rows: int, messages_column: str = "messages",
                     seed: int = 0, shuffle_buffer: int = 0) -> tuple[list[list[dict]], dict[str, int]]:
    """Stream up to max_rows rows (a hub id or a local dir in the hub layout, same call; through a seeded shuffle
    buffer where shuffle_buffer > 0, hub.stream) and return the valid conversations plus skip counts by reason;
    rows read = kept + skipped."""
    convs: list[list[dict]] = []
    skipped: Counter = Counter()
    try:
        for i, row in enumerate(hub.stream(path, name, split, seed, shuffle_buffer)):
            if i >= max_rows:
                break
            if messages_column not in row:
                raise KeyError(f"{path} ({name}, {split}) row {i} of the stream: no column {messages_column!r}; "
                               f"columns: {sorted(row)}")
            conv, reason = check_conversation(row[messages_column])
            if reason:
                skipped[reason] += 1
            else:
                convs.append(conv)
    except KeyError:
        raise
    except Exception as e:
        raise UserError(f"cannot read {path} (config {name}, split {split}): {type(e).__name__}: {e}") from e
    return convs, dict(sorted(skipped.items()))
