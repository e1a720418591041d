"""HuggingFaceH4/ultrafeedback_binarized: splits train_prefs / test_prefs (parquet under data/),
`chosen` / `rejected` are message lists ending in the assistant reply, with scores.

prompt = chosen[:-1] (it must equal rejected[:-1]); the responses are the last assistant
messages. Rows whose scores tie carry no preference and are skipped."""
from __future__ import annotations

import math
from typing import Any

from speedrun.data.pairs import Skip, Source, hub_rows, make_pair, messages, round_robin

HUB_ID = "HuggingFaceH4/ultrafeedback_binarized"
SPLITS = ("train_prefs", "test_prefs")  # there is no `train` split


def _score(value: Any, what: str) -> float:
    if value is None:
        raise Skip(f"missing_{what}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Skip(f"bad_{what}")
    return float(value)


def parse(row: Any, split: str) -> list[dict]:
    if not isinstance(row, dict):
        raise Skip("not_a_record")
    chosen, rejected = messages(row.get("chosen"), "chosen"), messages(row.get("rejected"), "rejected")
    s_chosen = _score(row.get("score_chosen"), "score_chosen")
    s_rejected = _score(row.get("score_rejected"), "score_rejected")
    if s_chosen == s_rejected:
        raise Skip("score_tie")
    if s_chosen < s_rejected:
        raise Skip("chosen_scored_lower")
    if not chosen or not rejected or chosen[-1]["role"] != "assistant" or rejected[-1]["role"] != "assistant":
        raise Skip("no_assistant_turn")
    if chosen[:-1] != rejected[:-1]:
        raise Skip("prompt_mismatch")
    return [make_pair("uf", split, chosen[:-1], chosen[-1]["content"], rejected[-1]["content"])]


def source(path: str = HUB_ID) -> Source:
    return Source(round_robin([hub_rows("uf", path, split) for split in SPLITS]), parse, {"path": path})
