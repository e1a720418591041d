"""The task track's checkable task: "Name a whole number greater than 12 and less than 19." Every item has a known
set of at least MIN_ANSWERS right answers, so a model can be right in many ways and a collapsed model is right in
one (coverage of right answers falls while pass@1 holds).

Items come in clusters of very uneven size (crowding built in: the numbers cluster has about 16x the items of the
months one), each asked with several paraphrased templates; an answer is one value in backticks inside a short
sentence whose wording varies too (PHRASINGS), so a stock phrasing is measurable beside a stock answer. Items are
split train / val / eval by a stable hash of their id; no post-training stage sees an eval item. `check` is the gold
reference: the first backticked span of a response, compared with the item's answers. A hub item (GSM8K,
data/gsm8k.py) carries its question as written and a reference solution instead, with one right answer.
"""
from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from speedrun.common import SPLITS, UserError, read_parquet, require_unique, stable_hash, stable_unit

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
LETTERS = "abcdefghijklmnopqrstuvwxyz"
MIN_ANSWERS = 3
TEMPLATES: dict[str, tuple[str, ...]] = {  # {lo} and {hi} are excluded bounds
    "numbers": ("Name a whole number greater than {lo} and less than {hi}.",
                "Give me an integer strictly between {lo} and {hi}.",
                "Which whole number is bigger than {lo} but smaller than {hi}? Give one.",
                "Tell me one integer above {lo} and below {hi}."),
    "letters": ("Name a letter that comes after `{lo}` and before `{hi}` in the alphabet.",
                "Give me a letter of the alphabet between `{lo}` and `{hi}`.",
                "Which letter lies after `{lo}` but before `{hi}`? Give one.",
                "Tell me one lowercase letter later than `{lo}` and earlier than `{hi}`."),
    "evens": ("Name an even number greater than {lo} and less than {hi}.",
              "Give me an even integer strictly between {lo} and {hi}.",
              "Which even number is bigger than {lo} but smaller than {hi}? Give one.",
              "Tell me one even whole number above {lo} and below {hi}."),
    "months": ("Name a month that comes after {lo} and before {hi}.",
               "Give me a month of the year between {lo} and {hi}.",
               "Which month falls after {lo} but before {hi}? Give one.",
               "Tell me one month later in the year than {lo} and earlier than {hi}."),
}
PHRASINGS = ("`{a}`", "`{a}`.", "I pick `{a}`.", "How about `{a}`?", "One answer is `{a}`.", "`{a}` works.")
_SPAN = re.compile(r"`([^`\n]{1,24})`")


@dataclass(frozen=True)
class TaskItem:
    item_id: str
    cluster: str
    lo: str
    hi: str
    answers: tuple[str, ...]  # every right answer, in order
    split: str
    text: str = ""  # a hub item's question as written (GSM8K); generated items are asked through TEMPLATES
    solution: str = ""  # a hub item's SFT answer, ending in its right answer in backticks

    def question(self, template: int) -> str:
        return self.text or TEMPLATES[self.cluster][template].format(lo=self.lo, hi=self.hi)

    def prompt(self) -> str:
        """The item's one fixed question (GRPO draws it, the evaluation asks it): a template picked by its id."""
        if self.text:
            return self.text
        return self.question(int(stable_unit("task_template", self.item_id) * len(TEMPLATES[self.cluster])))


def normalise(value: str) -> str:
    """A number as GSM8K writes its answers: no thousands separators, no currency sign, no trailing period."""
    return value.strip().replace(",", "").lstrip("$").rstrip(".")


def wrong_answer(value: str, rng: random.Random) -> str:
    """A checkably wrong number near the right one (a plausible slip)."""
    step = rng.choice([-10, -2, -1, 1, 2, 10])
    if "." in value:
        return f"{float(value) + step:g}"
    return str(int(value) + step)


def _ranges(n: int, gaps: range, step: int = 1) -> list[tuple[int, int]]:
    """(lo, hi) index pairs of a sequence of n values, hi - lo in `gaps`, lo on multiples of step."""
    return [(lo, lo + g) for g in gaps for lo in range(0, n - g, step)]


def all_items(val_frac: float, eval_frac: float, number_max: int) -> list[TaskItem]:
    """Every item of every cluster, in cluster then (lo, hi) order, each with its split. The numbers cluster asks
    about 0..number_max (6 x number_max - 33 items; an item keeps its id and split whatever the range)."""
    raw: list[tuple[str, str, str, tuple[str, ...]]] = []
    for lo, hi in _ranges(number_max + 1, range(4, 10)):  # 387 items at 70, 3-8 answers
        raw.append(("numbers", str(lo), str(hi), tuple(str(v) for v in range(lo + 1, hi))))
    for lo, hi in _ranges(26, range(4, 10)):  # 117 items
        raw.append(("letters", LETTERS[lo], LETTERS[hi], tuple(LETTERS[lo + 1:hi])))
    for lo, hi in _ranges(41, range(8, 15, 2), step=2):  # 62 items, 3-6 answers
        raw.append(("evens", str(lo), str(hi), tuple(str(v) for v in range(lo + 2, hi, 2))))
    for lo, hi in _ranges(12, range(4, 8)):  # 26 items, 3-6 answers
        raw.append(("months", MONTHS[lo], MONTHS[hi], MONTHS[lo + 1:hi]))
    out = []
    for cluster, lo, hi, answers in raw:
        item_id = stable_hash("task", cluster, lo, hi)
        u = stable_unit("task_split", item_id)
        split = "eval" if u < eval_frac else "val" if u < eval_frac + val_frac else "train"
        out.append(TaskItem(item_id, cluster, lo, hi, answers, split))
    return out


def items(val_frac: float, eval_frac: float, number_max: int) -> list[TaskItem]:
    """all_items, refusing a split that leaves a cluster without train or eval items."""
    out = all_items(val_frac, eval_frac, number_max)
    for cluster in TEMPLATES:
        for split in ("train", "eval"):
            if not any(i.cluster == cluster and i.split == split for i in out):
                raise ValueError(f"task: cluster {cluster!r} has no {split} item at val_frac {val_frac}, "
                                 f"eval_frac {eval_frac}: change task.eval_frac or task.val_frac")
    return out


def conversations(task_items: list[TaskItem], split: str, per_item: int, seed: int) -> list[list[dict]]:
    """SFT conversations for the items of `split`: `per_item` each, a random template, a random right answer in a
    random phrasing; a hub item's one conversation is its question and reference solution."""
    rng = random.Random(seed)
    out = []
    for item in task_items:
        if item.split != split:
            continue
        if item.solution:
            out.append([{"role": "user", "content": item.text}, {"role": "assistant", "content": item.solution}])
            continue
        for _ in range(per_item):
            q = item.question(rng.randrange(len(TEMPLATES[item.cluster])))
            a = rng.choice(PHRASINGS).format(a=rng.choice(item.answers))
            out.append([{"role": "user", "content": q}, {"role": "assistant", "content": a}])
    return out


def wrong_answers(item: TaskItem) -> list[str]:
    """Values of the item's kind just outside its range: plausible, checkably wrong answers."""
    if item.cluster == "letters":
        pool = list(LETTERS)
    elif item.cluster == "months":
        pool = list(MONTHS)
    else:
        lo, hi = int(item.lo), int(item.hi)
        pool = [str(v) for v in range(max(lo - 6, 0), hi + 7)]
        if item.cluster == "evens":
            pool = [v for v in pool if int(v) % 2 == 0] + [str(v) for v in range(lo + 1, hi, 2)]
    return [v for v in pool if v not in item.answers]


def pairs(task_items: list[TaskItem], per_item: int, seed: int) -> list[dict]:
    """Preference pairs in data/prompts/pairs.parquet's schema for the train and val items (never eval): a right
    answer chosen over a wrong one in the same phrasing, to the item's own question; kind 'task'."""
    rng = random.Random(seed)
    out = []
    for item in task_items:
        if item.split == "eval":
            continue
        wrong = wrong_answers(item) if not item.solution else None
        for j in range(per_item):
            if item.solution:  # the reference solution over the same solution ending in a near miss
                a = item.answers[0]
                chosen, rejected = item.solution, item.solution.replace(f"`{a}`", f"`{wrong_answer(a, rng)}`")
            else:
                phrasing = rng.choice(PHRASINGS)
                chosen, rejected = phrasing.format(a=rng.choice(item.answers)), phrasing.format(a=rng.choice(wrong))
            out.append({"id": stable_hash("task_pair", item.item_id, j), "prompt_id": item.item_id,
                        "split": item.split, "src": "task", "src_split": item.split,
                        "prompt": [{"role": "user", "content": item.prompt()}], "chosen": chosen,
                        "rejected": rejected, "group": item.cluster, "negative": None})
    return out


def extract(text: str) -> str | None:
    """The first backticked span of a response, stripped, or None."""
    m = _SPAN.search(text)
    return m.group(1).strip() if m else None


def check(item: TaskItem, text: str) -> str | None:
    """The right answer a response gives (the item's own spelling), or None: the gold reference."""
    given = extract(text)
    if given is None:
        return None
    if item.solution:  # a hub item's number, as GSM8K writes it: `1,234` and `$1234` are 1234
        given = normalise(given)
    for a in item.answers:
        if a.lower() == given.lower():
            return a
    return None


def phrasing(text: str) -> str:
    """A response's wording with its first backticked span blanked: `7` works. -> `_` works."""
    return _SPAN.sub("`_`", text.strip(), count=1)


def cluster_sizes(task_items: list[TaskItem], split: str) -> dict[str, int]:
    counts = Counter(i.cluster for i in task_items if i.split == split)
    clusters = TEMPLATES if all(i.cluster in TEMPLATES for i in task_items) else sorted({i.cluster for i in task_items})
    return {c: counts[c] for c in clusters}


def items_frame(task_items: list[TaskItem]) -> "pd.DataFrame":  # noqa: F821
    """data/task/items.parquet: prompts.parquet's columns (prompt_id = item_id, prompt as chat messages, split,
    group = cluster), so GRPO loads it as it loads the chat prompts, plus lo, hi and the right answers."""
    import pandas as pd

    df = pd.DataFrame({"prompt_id": [i.item_id for i in task_items],
                       "prompt": [[{"role": "user", "content": i.prompt()}] for i in task_items],
                       "split": [i.split for i in task_items], "group": [i.cluster for i in task_items],
                       "lo": [i.lo for i in task_items], "hi": [i.hi for i in task_items],
                       "answers": [list(i.answers) for i in task_items]})
    if any(i.text for i in task_items):  # hub items: the question as written and the reference solution
        df["text"], df["solution"] = [i.text for i in task_items], [i.solution for i in task_items]
    return df


def load_items(path: Path) -> list[TaskItem]:
    """The items of data/task/items.parquet, checked: known clusters, unique ids, at least MIN_ANSWERS answers."""
    df = read_parquet(path)
    missing = {"prompt_id", "split", "group", "lo", "hi", "answers"} - set(df.columns)
    if missing:
        raise UserError(f"{path}: missing columns {sorted(missing)}")
    require_unique(df["prompt_id"].tolist(), "prompt_id", path)
    out = []
    for row, r in enumerate(df.to_dict("records")):
        answers = tuple(str(a) for a in (r["answers"] if r["answers"] is not None else ()))
        text, solution = r.get("text") or "", r.get("solution") or ""
        if text:  # a hub item: one right answer, which its solution ends in
            if r["split"] not in SPLITS or len(answers) != 1 or f"`{answers[0]}`" not in solution:
                raise UserError(f"{path} row {row} (item {r['prompt_id']}): a hub item needs split in {SPLITS} (got "
                                 f"{r['split']!r}), one answer (got {len(answers)}) and a solution giving it")
        elif r["group"] not in TEMPLATES or r["split"] not in SPLITS or len(answers) < MIN_ANSWERS:
            raise UserError(f"{path} row {row} (item {r['prompt_id']}): cluster {r['group']!r} (one of "
                             f"{sorted(TEMPLATES)}), split {r['split']!r} (one of {SPLITS}), {len(answers)} answers "
                             f"(at least {MIN_ANSWERS})")
        out.append(TaskItem(r["prompt_id"], r["group"], str(r["lo"]), str(r["hi"]), answers, r["split"], text,
                            solution))
    print(f"{path}: {len(out):,} items read", flush=True)
    return out
