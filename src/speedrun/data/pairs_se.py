"""HuggingFaceH4/stack-exchange-preferences: one row per question (HTML) with its answers, each
with a `pm_score`; parquet under data/<site>/, one `train` split.

Pairs are answers where chosen has a strictly higher pm_score, at most `max_pairs` per question,
widest score gap first (ties broken by a stable hash of the answer ids). HTML becomes plain text
with markdown for code, lists and links. The licence (CC-BY-SA-4.0) requires attribution: the
authors of both answers go into the `attribution` column."""
from __future__ import annotations

import json
import math
import re
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from speedrun.common import UserError, normalize_text, stable_hash
from speedrun.data.pairs import Skip, Source, hub_rows, make_pair, round_robin, text

HUB_ID = "HuggingFaceH4/stack-exchange-preferences"
AUTHOR = ("answer_id", "author", "author_id", "author_profile")
BLOCK = {"p", "div", "ul", "ol", "table", "tr", "blockquote", "h1", "h2", "h3", "h4", "h5", "h6"}


class _Markdown(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.pre = 0
        self.href: list[str | None] = []
        self.quotes: list[int] = []  # where each open <blockquote> starts in out

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "blockquote":
            self.quotes.append(len(self.out))
        elif tag in BLOCK:
            self.out.append("\n\n" + ("#" * int(tag[1]) + " " if re.fullmatch(r"h\d", tag) else ""))
        elif tag == "br":
            self.out.append("\n")
        elif tag == "li":
            self.out.append("\n- ")
        elif tag == "hr":
            self.out.append("\n\n---\n\n")
        elif tag == "pre":
            self.pre += 1
            self.out.append("\n\n```\n")
        elif tag == "code" and not self.pre:
            self.out.append("`")
        elif tag in ("strong", "b"):
            self.out.append("**")
        elif tag in ("em", "i"):
            self.out.append("*")
        elif tag == "a":
            self.href.append(a.get("href"))
            self.out.append("[" if a.get("href") else "")
        elif tag == "img" and a.get("alt"):
            self.out.append(f"[image: {a['alt']}]")

    def handle_endtag(self, tag: str) -> None:
        if tag == "blockquote" and self.quotes:
            start = self.quotes.pop()
            inner = re.sub(r"\n{3,}", "\n\n", "".join(self.out[start:])).strip()
            self.out[start:] = ["\n\n" + "\n".join(f"> {ln}".rstrip() for ln in inner.split("\n")) + "\n\n"]
        elif tag in BLOCK:
            self.out.append("\n\n")
        elif tag == "pre" and self.pre:
            self.pre -= 1
            if self.out:
                self.out[-1] = self.out[-1].rstrip("\n")  # code usually ends in a newline already
            self.out.append("\n```\n\n")
        elif tag == "code" and not self.pre:
            self.out.append("`")
        elif tag in ("strong", "b"):
            self.out.append("**")
        elif tag in ("em", "i"):
            self.out.append("*")
        elif tag == "a" and self.href:
            href = self.href.pop()
            self.out.append(f"]({href})" if href else "")

    def handle_data(self, data: str) -> None:
        # whitespace is layout in HTML except inside <pre>
        self.out.append(data if self.pre else re.sub(r"\s+", " ", data))


def html_to_text(html: str) -> str:
    parser = _Markdown()
    parser.feed(html)
    parser.close()
    lines = [ln.rstrip() for ln in "".join(parser.out).split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _answer(a: Any) -> dict:
    """A usable answer or Skip (counted per answer, not per row)."""
    if not isinstance(a, dict):
        raise Skip("not_a_record")
    score = a.get("pm_score")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise Skip("missing_pm_score" if score is None else "bad_pm_score")
    body = html_to_text(text(a.get("text"), "answer"))
    if not body:
        raise Skip("empty_answer")
    return {"score": float(score), "text": body, "norm": normalize_text(body), **{k: a.get(k) for k in AUTHOR}}


def _attribution(row: dict, chosen: dict, rejected: dict) -> str:
    meta = row.get("metadata")  # question url, site, asker
    who = {"qid": row.get("qid"), "metadata": meta if isinstance(meta, list) else None,
           "chosen": {k: chosen[k] for k in AUTHOR}, "rejected": {k: rejected[k] for k in AUTHOR}}
    return json.dumps(who, sort_keys=True, ensure_ascii=False, default=str)


def parser(max_pairs: int, answers_skipped: Counter):
    def parse(row: Any, split: str) -> list[dict]:
        if not isinstance(row, dict):
            raise Skip("not_a_record")
        question = html_to_text(text(row.get("question"), "question"))
        raw = row.get("answers")
        if not isinstance(raw, list):
            raise Skip("missing_answers" if raw is None else "bad_answers")
        answers = []
        for a in raw:
            try:
                answers.append(_answer(a))
            except Skip as s:
                answers_skipped[str(s)] += 1
        if len(answers) < 2:
            raise Skip("fewer_than_2_usable_answers")
        cands = [(a, b) for a in answers for b in answers if a["score"] > b["score"] and a["norm"] != b["norm"]]
        if not cands:
            raise Skip("no_strict_preference")
        # widest score gap first; equal gaps in a stable order that does not depend on answer order
        qid = row.get("qid")
        cands.sort(key=lambda ab: (ab[1]["score"] - ab[0]["score"], stable_hash(
            qid, ab[0]["answer_id"], ab[1]["answer_id"], ab[0]["norm"], ab[1]["norm"])))
        prompt = [{"role": "user", "content": question}]
        return [make_pair("se", split, prompt, a["text"], b["text"], attribution=_attribution(row, a, b))
                for a, b in cands[:max_pairs]]

    return parse


def sites(path: str) -> list[str]:
    """The site folders under data/ (one per Stack Exchange site), of a local mirror or of the hub repo."""
    local = Path(path) / "data"
    if local.is_dir():
        return sorted(d.name for d in local.iterdir() if d.is_dir() and any(d.glob("*.parquet")))
    try:
        from huggingface_hub import HfFileSystem

        return sorted(Path(f).name for f in HfFileSystem().ls(f"datasets/{path}/data", detail=False))
    except Exception as e:
        raise UserError(f"se: cannot list the sites under {path}/data: {type(e).__name__}: {e}") from e


def source(path: str = HUB_ID, max_pairs: int = 10, data_dir: str | None = None) -> Source:
    """data_dir (e.g. data/apple.stackexchange.com) reads one site; without it every site in turn, one question
    from each (round robin), so a pair limit samples every site rather than the first ones alphabetically."""
    answers_skipped: Counter = Counter()
    names = [data_dir] if data_dir else [f"data/{site}" for site in sites(path)]
    if not names:
        raise UserError(f"se: no site folders with parquet files under {path}/data")
    extra = {"path": path, "data_dir": data_dir, "sites": len(names), "max_pairs_per_question": max_pairs,
             "answers_skipped": answers_skipped}
    rows = round_robin([hub_rows("se", path, "train", data_dir=d) for d in names])
    return Source(rows, parser(max_pairs, answers_skipped), extra)
