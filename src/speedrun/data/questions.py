"""Questions about Python objects and their reference answers (the docstring summary).

The one place the question templates live: the SFT conversations and the embedded preference
pairs both ask with them, so the RM and GRPO prompts are ones the SFT model was trained on."""
from __future__ import annotations

import re
from collections import Counter

from speedrun.common import stable_unit
from speedrun.data.docstrings import DocObject

TEMPLATES: dict[str, tuple[str, ...]] = {
    "function": (
        "What does `{name}` do?",
        "Explain `{name}`.",
        "What is `{name}` used for?",
        "Briefly describe `{name}`.",
    ),
    "class": (
        "What is `{name}` for?",
        "Explain the class `{name}`.",
        "What does `{name}` represent?",
        "Briefly describe `{name}`.",
    ),
    "module": (
        "What is the `{name}` module for?",
        "Explain the `{name}` module.",
        "What does the Python module `{name}` provide?",
        "Briefly describe `{name}`.",
    ),
    # topics share names with modules (`types`, `numbers`): every topic question says "topic"
    "topic": (
        "What does the Python documentation topic `{name}` cover?",
        "Explain the Python topic `{name}`.",
        "Summarize the documentation topic `{name}`.",
    ),
}
MAX_ANSWER_CHARS = 500  # longer summaries are lists/tables pasted into a docstring, not an answer
_RULER = re.compile(r"[*=\-~^#]{3,}")
_VERSION_NOTE = re.compile(r"(New|Changed) in version ")


def questions(obj: DocObject) -> list[str]:
    """Every template of the object's kind, filled with its qualified name."""
    return [t.format(name=obj.qualname) for t in TEMPLATES[obj.kind]]


def question(obj: DocObject, salt: str = "pairs") -> str:
    """One template, picked by a stable hash of the object name (same object -> same question)."""
    options = questions(obj)
    return options[int(stable_unit("question", salt, obj.kind, obj.qualname) * len(options))]


def answer(obj: DocObject) -> tuple[str | None, str | None]:
    """(the docstring summary, None) or (None, skip reason).

    The summary is the first paragraph, whitespace collapsed; reST headings (a line underlined
    with ***, ===, ~~~) and version notes are passed over, which matters for pydoc topics."""
    for para in obj.docstring.strip().split("\n\n"):
        lines = [ln.strip() for ln in para.strip().splitlines() if ln.strip()]
        if not lines or (len(lines) <= 2 and _RULER.fullmatch(lines[-1])) or _VERSION_NOTE.match(lines[0]):
            continue
        text = " ".join(" ".join(lines).split())
        return (text, None) if len(text) <= MAX_ANSWER_CHARS else (None, "answer_too_long")
    return None, "empty_answer"


def answerable(objects: list[DocObject]) -> tuple[list[tuple[DocObject, str]], dict[str, int]]:
    """(object, answer) for every object that can be asked about, in input order, plus skip
    counts. A second object with the same question key (a property's setter, say) is skipped:
    one question must have one right answer."""
    out: list[tuple[DocObject, str]] = []
    skipped: Counter = Counter()
    seen: set[tuple[bool, str]] = set()
    for obj in objects:
        text, reason = answer(obj)
        key = (obj.kind == "topic", obj.qualname)
        if reason is None and key in seen:
            reason = "duplicate_name"
        if reason:
            skipped[reason] += 1
            continue
        seen.add(key)
        out.append((obj, text))
    return out, dict(sorted(skipped.items()))


def group_of(obj: DocObject) -> str:
    """Sampling group: the top-level module; all pydoc topics form one group."""
    return "pydoc_topics" if obj.kind == "topic" else obj.top
