"""Embedded preference pairs from the stdlib docstrings: a question about an object (the same
templates the SFT model was trained on), chosen = its own docstring summary, rejected = the
summary of another object (`negatives` distinct ones per object, one pair each). A negative is a
hard one (same module, failing that the same group: top-level module or pydoc topics) or a random
one, picked by stable hashes; the `negative` column says which. With `echo`, each object adds a pair
whose rejected side is the asked name alone in backticks (negative `echo`): an answer that only
restates the question, the reward hack the second SmolLM2 chat pilot found. With `probes`, two more per object:
a content-free reply (negative `nonanswer`) and a template that names the object and says nothing of it (negative
`template`), each from a fixed list by stable hash. A train object draws from the TRAIN lists (written here); a val
or eval object from the HELDOUT lists (what the third pilot's policies wrote), so held-out accuracy on these kinds
measures whether the RM rejects the hacks a policy found, not phrases it was shown."""
from __future__ import annotations

import random
from collections import defaultdict
from speedrun.common import normalize_text, stable_seed, stable_unit
from speedrun.data.docstrings import DocObject, heldout_split
from speedrun.data.pairs import Skip, Source, make_pair
from speedrun.data.questions import answer, answerable, group_of, question


TRAIN_NONANSWERS = ("Sure, I can help with that.", "Good question!", "That depends on what you need.",
                    "Here is the answer.", "Let me explain.", "Please clarify your question.", "I don't know.",
                    "Thanks for asking.", "It is useful.", "This is a Python thing.", "See the documentation.", "Yes.")
HELDOUT_NONANSWERS = ("Provide an example", "Provide a concise explanation", "Provide a concise summary",
                      "I'm sorry for any misunderstanding.", "Provide your description", "Provide context",
                      "You've landed your luck.", "You've stumbled upon the right gem.",
                      "You've already answered your own problem.", "You've spotted another of my responses.",
                      "I'm not here, just waiting to engage", "Your assistance")
TRAIN_TEMPLATES = ("`{}` is a useful part of Python.", "The `{}` object is in the standard library.",
                   "You can use `{}` in your code.", "`{}` does what its name says.")
HELDOUT_TEMPLATES = ("The `{}` function allows you to extract data from CSV files.",
                     "The `{}` function allows you to convert a text into another format.",
                     "`{}` allows you to handle data in Python.",
                     "The `{}` function allows you to detect specific values in the text.")


def probe_answers(name: str, split: str) -> dict[str, str]:
    """The object's two probe answers (nonanswer, template): from the TRAIN lists for a train object, else HELDOUT."""
    nonanswers, templates = (TRAIN_NONANSWERS, TRAIN_TEMPLATES) if split == "train" else (HELDOUT_NONANSWERS,
                                                                                        HELDOUT_TEMPLATES)
    pick = lambda options, kind: options[int(stable_unit("probe", kind, name) * len(options))]  # noqa: E731
    return {"nonanswer": pick(nonanswers, "nonanswer"), "template": pick(templates, "template").format(name)}


def _pick(pool: list[int], answers: list[str], taken: set[str], rng: random.Random) -> int | None:
    """A random member of pool whose answer is not in taken (own answer and negatives already picked:
    many objects share a summary)."""
    options = [i for i in pool if answers[i] not in taken]
    return options[rng.randrange(len(options))] if options else None


def _pick_any(answers: list[str], taken: set[str], rng: random.Random, tries: int = 100) -> int | None:
    for _ in range(tries):  # rejection sampling: almost every object has a different answer
        i = rng.randrange(len(answers))
        if answers[i] not in taken:
            return i
    return None


def source(objects: list[DocObject], hard_frac: float = 0.5, val_frac: float = 0.1, eval_frac: float = 0.1,
           negatives: int = 1, echo: bool = False, probes: bool = False) -> Source:
    """Rows are the objects (the corpus stage's table), each giving `negatives` pairs (one prompt, the same
    chosen answer, distinct rejected ones); `split` is heldout_split of the object's module (train/val/eval)."""
    usable, _ = answerable(objects)
    answer_of = dict(usable)
    pool = [o for o, _ in usable]
    norm = [normalize_text(a) for _, a in usable]
    by_module, by_group = defaultdict(list), defaultdict(list)
    for i, o in enumerate(pool):
        by_module[o.module].append(i)
        by_group[group_of(o)].append(i)
    extra = {"hard_frac": hard_frac, "negatives_per_object": negatives, "hard_fell_back_to_group": 0,
             "hard_fell_back_to_random": 0, "fewer_negatives": 0}

    def parse(obj: DocObject, split: str) -> list[dict]:
        if obj not in answer_of:
            raise Skip(answer(obj)[1] or "duplicate_name")  # the first object of a name answers it
        own = normalize_text(answer_of[obj])
        prompt = [{"role": "user", "content": question(obj)}]
        taken, out = {own}, []
        for j in range(negatives):
            salt = (obj.kind, obj.qualname) + ((j,) if j else ())  # the first negative: the same as with one
            rng = random.Random(stable_seed("negative", *salt))
            kind, neg = "random", None
            if stable_unit("negative_kind", *salt) < hard_frac:
                kind = "hard"
                neg = _pick(by_module[obj.module], norm, taken, rng)
                if neg is None:
                    neg = _pick(by_group[group_of(obj)], norm, taken, rng)
                    extra["hard_fell_back_to_group"] += neg is not None
            if neg is None:
                extra["hard_fell_back_to_random"] += kind == "hard"
                kind, neg = "random", _pick_any(norm, taken, rng)
                if neg is None:
                    break
            taken.add(norm[neg])
            out.append(make_pair("embedded", split, prompt, answer_of[obj], answer_of[pool[neg]],
                                 group=group_of(obj), negative=kind))
        if not out:
            raise Skip("no_negative")
        extra["fewer_negatives"] += len(out) < negatives
        if echo:  # after the other negatives: with echo off, every pair is as before
            out.append(make_pair("embedded", split, prompt, answer_of[obj], f"`{obj.qualname}`",
                                 group=group_of(obj), negative="echo"))
        if probes:  # last, so every other pair is as without them
            for kind, rejected in probe_answers(obj.qualname, split).items():
                out.append(make_pair("embedded", split, prompt, answer_of[obj], rejected, group=group_of(obj),
                                     negative=kind))
        return out

    return Source(((heldout_split(o.top, val_frac, eval_frac), o) for o in objects), parse, extra)
