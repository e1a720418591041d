"""Anthropic/hh-rlhf: whole transcripts as strings, turns marked "\\n\\nHuman: " / "\\n\\nAssistant: ".

The prompt is the common prefix of chosen and rejected cut back to the last "\\n\\nAssistant:",
split into user/assistant messages; the responses are what follows it. The red-team subset has
another schema and is not read."""
from __future__ import annotations

import re
from typing import Any

from speedrun.data.pairs import Skip, Source, hub_rows, make_pair, round_robin, text

HUB_ID = "Anthropic/hh-rlhf"
SUBSETS = ("harmless-base", "helpful-base", "helpful-online", "helpful-rejection-sampled")
SPLITS = ("train", "test")
ASSISTANT = "\n\nAssistant:"
TURN = re.compile(r"\n\n(Human|Assistant): ?")


def common_prefix_len(a: str, b: str) -> int:
    """Binary search with C-speed slice compares (os.path.commonprefix walks char by char)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def transcript_messages(prefix: str) -> list[dict]:
    """'\\n\\nHuman: hi\\n\\nAssistant: hello\\n\\nHuman: ...' -> [{role, content}, ...]."""
    parts = TURN.split(prefix)
    if parts[0].strip():
        raise Skip("text_before_first_turn")
    msgs = [{"role": "user" if who == "Human" else "assistant", "content": body.strip()}
            for who, body in zip(parts[1::2], parts[2::2])]
    if any(not m["content"] for m in msgs):
        raise Skip("empty_turn")
    return msgs


def parse(row: Any, split: str) -> list[dict]:
    if not isinstance(row, dict):
        raise Skip("not_a_record")
    chosen, rejected = text(row.get("chosen"), "chosen"), text(row.get("rejected"), "rejected")
    if chosen == rejected:
        raise Skip("chosen_equals_rejected")
    cut = chosen.rfind(ASSISTANT, 0, common_prefix_len(chosen, rejected))
    if cut < 0:
        raise Skip("no_assistant_turn")
    responses = chosen[cut + len(ASSISTANT):], rejected[cut + len(ASSISTANT):]
    if any(TURN.search(r) for r in responses):  # they differ before the final turn: not one prompt
        raise Skip("transcripts_diverge_before_last_turn")
    prompt = transcript_messages(chosen[:cut])
    return [make_pair("hh", split, prompt, responses[0], responses[1])]


def source(path: str = HUB_ID) -> Source:
    streams = [hub_rows("hh", path, split, data_dir=subset) for subset in SUBSETS for split in SPLITS]
    return Source(round_robin(streams), parse, {"path": path})
