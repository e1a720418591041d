"""The gold-checked task: "Which of these is a function defined in the `json` module: `json.dumps`, `csv.reader`,
`json.loads`? Name one." Several answers are right (every documented top-level function of that module), and each is
checked against the corpus object table, not by the reward model.

An item is one (module, kind) with at least MIN_ANSWERS documented members of that kind defined at the module's top
level. Its question lists up to SHOWN of them among DISTRACTORS names of other modules, in a random order: a model of
this size cannot recall a module's members from pretraining alone, but it can learn to pick and copy a right one,
and a collapsed model picks the same one every time (coverage falls). Any documented member counts as right, listed
or not. SFT trains on the items of the 'train' modules (one conversation per sampled member, answer = its qualified
name in backticks); the evaluation asks the 'eval' modules' items, which no post-training stage sees. GRPO does not
train on this task: it measures whether reward-model training keeps the ability (pass@1) and the spread of right
answers (coverage).
"""
from __future__ import annotations

import random
import re
from collections import defaultdict
from dataclasses import dataclass
from math import comb

from speedrun.common import stable_hash, stable_seed
from speedrun.data.docstrings import DocObject, heldout_split

TEMPLATES: dict[str, tuple[str, ...]] = {
    "function": ("Which of these is a function defined in the `{module}` module: {names}? Name one.",
                 "Name one function of the Python module `{module}` among {names}.",
                 "Pick a function that `{module}` defines: {names}."),
    "class": ("Which of these is a class defined in the `{module}` module: {names}? Name one.",
              "Name one class of the Python module `{module}` among {names}.",
              "Pick a class that `{module}` defines: {names}."),
}
MIN_ANSWERS = 2  # a module with one member has one right answer: no room for diversity
SHOWN, DISTRACTORS = 4, 2
_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


@dataclass(frozen=True)
class GoldItem:
    item_id: str
    module: str
    kind: str
    split: str  # the module's heldout_split
    answers: frozenset[str]  # every right answer: qualified names

    def prompt(self, others: list[str], rng: random.Random | None = None) -> str:
        """A question listing SHOWN right names among DISTRACTORS of `others` (names of other items); without an
        rng, the item's own fixed draw (the evaluation's)."""
        rng = rng or random.Random(stable_seed("gold", self.item_id))
        right = sorted(self.answers)
        shown = rng.sample(right, min(SHOWN, len(right)))
        wrong = [n for n in (rng.choice(others) for _ in range(4 * DISTRACTORS)) if n not in self.answers]
        names = shown + list(dict.fromkeys(wrong))[:DISTRACTORS]
        rng.shuffle(names)
        template = TEMPLATES[self.kind][rng.randrange(len(TEMPLATES[self.kind]))]
        return template.format(module=self.module, names=", ".join(answer_text(n) for n in names))


def gold_items(objects: list[DocObject], val_frac: float, eval_frac: float) -> list[GoldItem]:
    """Every (module, kind) with >= MIN_ANSWERS top-level members of that kind, in (module, kind) order."""
    members: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for o in objects:
        if o.kind in TEMPLATES and o.qualname.rsplit(".", 1)[0] == o.module:
            members[(o.module, o.kind, o.top)].add(o.qualname)
    return [GoldItem(stable_hash("gold", m, k), m, k, heldout_split(top, val_frac, eval_frac), frozenset(names))
            for (m, k, top), names in sorted(members.items()) if len(names) >= MIN_ANSWERS]


def answer_text(qualname: str) -> str:
    return f"`{qualname}`"


def distractor_pool(items: list[GoldItem]) -> list[str]:
    """Every right answer of every item, sorted: the names a question draws its wrong options from."""
    return sorted({n for item in items for n in item.answers})


def conversations(items: list[GoldItem], split: str, per_item: int, seed: int) -> list[list[dict]]:
    """SFT conversations for the items of `split`: `per_item` questions each (fresh option lists, wrong options from
    the same split: no name of a held-out module appears in training), answered with one of the listed right names."""
    rng = random.Random(seed)
    pool = distractor_pool([i for i in items if i.split == split])
    out = []
    for item in items:
        if item.split != split:
            continue
        for _ in range(per_item):
            q = item.prompt(pool, rng)
            listed = [n for n in _NAME.findall(q) if n in item.answers]
            out.append([{"role": "user", "content": q},
                        {"role": "assistant", "content": answer_text(rng.choice(listed))}])
    return out


def extract(text: str) -> str | None:
    """The first dotted name in a response (`json.dumps` -> json.dumps), or None."""
    m = _NAME.search(text)
    return m.group(0) if m else None


def check(item: GoldItem, text: str) -> str | None:
    """The right answer a response names, or None when it names none."""
    name = extract(text)
    return name if name in item.answers else None


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c right (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    return 1.0 if n - c < k else 1.0 - comb(n - c, k) / comb(n, k)
