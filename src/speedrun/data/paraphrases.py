"""The task's four questions asked in other words, written by hand: the test of a density embedding's meaning. None
uses a word of the task's templates (data/task.py TEMPLATES, beyond the function words in ALLOWED) or its cluster's
noun, so an embedding that places them beside their own cluster's training prompts reads what a prompt asks, not
which template words it shares (tests/test_paraphrases.py; task_grpo reports the share as `paraphrase_purity`)."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from speedrun.data.task import TEMPLATES

if TYPE_CHECKING:
    import torch

ALLOWED = {"a", "an", "the", "and", "of", "is", "in", "that", "me", "but"}  # function words the templates use too
NOUNS = {"number", "numbers", "integer", "integers", "letter", "letters", "alphabet", "month", "months", "year",
         "even", "whole"}

PARAPHRASES: dict[str, tuple[str, ...]] = {
    "numbers": ("Pick any count from the range that starts past 14 and stops short of 21.",
                "I need a figure exceeding 30 yet under 36.",
                "What could I say if asked for something over 5 yet under 11?",
                "Choose a value over 40 and under 47.",
                "Suggest a quantity from 52 up to 57, both ends excluded.",
                "Something past 8 and short of 13, please.",
                "Reply with a count that beats 60 without reaching 66.",
                "Offer a figure whose value sits past 23 yet short of 29."),
    "evens": ("Pick a multiple of two that exceeds 14 and stays under 22.",
              "Something divisible by 2, over 30 and under 38?",
              "Choose a value that is not odd, past 6 yet short of 14.",
              "Suggest a multiple of two from the range 40 to 48, both ends excluded.",
              "I need a figure divisible by two, over 52 and under 60.",
              "Offer a count with no remainder when halved, past 18 yet short of 26.",
              "Reply with a non-odd value exceeding 44 yet under 50.",
              "Say a value you get by doubling something, past 10 and short of 18."),
    "letters": ("Pick a character that sorts past `d` and ahead of `k`.",
                "Choose something from the ABCs sitting past `m` yet ahead of `t`.",
                "Suggest a glyph from a to z inside the open range `c` to `h`.",
                "Offer a character positioned following `p` and preceding `w` in ABC order.",
                "Reply with a symbol that in dictionary order follows `f` and precedes `l`.",
                "I want a character of the Latin script ranked past `r` yet ahead of `y`.",
                "Say a single character sorted beyond `b` yet prior to `g`.",
                "Type a character from the ABCs that sits past `j` and ahead of `q`."),
    "months": ("Pick a stretch of the calendar following March and preceding July.",
               "Suggest a calendar page past May yet ahead of October.",
               "Choose a calendar period following January and preceding May.",
               "Offer a time on the calendar that sits past June and ahead of November.",
               "Reply with a calendar segment following February yet preceding June.",
               "I need a span of about four weeks following August and preceding December.",
               "Say a period on the calendar past April and prior to September.",
               "Pick a span of weeks following July and preceding November."),
}

# Written 2026-11-30 and committed before any embedding was measured on them: an embedding chosen by its share on
# PARAPHRASES (seen, so that share is optimistic) is confirmed here, once (docs/LOG.md). 12 per trained cluster.
HELD_OUT: dict[str, tuple[str, ...]] = {
    "numbers": ("Pick a value somewhere from 17 to 24, not counting either end.",
                "Write down a count exceeding 9 yet under 15.",
                "Any figure over 33 that stays short of 39 will do.",
                "Share a quantity exceeding 45 while remaining under 51.",
                "What would fit if I wanted something past 27 and shy of 32?",
                "Offer up a value that tops 50 but does not reach 56.",
                "Produce a count that tops 3 and stays under 9.",
                "Think of a value inside the open interval from 61 to 68.",
                "Suggest something in excess of 12 and short of 18.",
                "Respond with a tally past 36 and under 42.",
                "Type a figure exceeding 54 but shy of 59.",
                "Supply any count from the gap separating 20 and 26."),
    "evens": ("Pick a value divisible by two, past 17 and short of 25.",
              "Write down a count that splits into two equal halves, over 9 and under 17.",
              "Any figure over 33 and short of 41 that 2 divides exactly will do.",
              "Share a quantity ending in 0, 2, 4, 6 or 8, exceeding 45 while remaining under 53.",
              "What non-odd value sits past 27 and shy of 35?",
              "Offer a value that is twice some count, topping 50 but not reaching 58.",
              "Produce a multiple of 2 that tops 3 and stays under 11.",
              "Think of a value with no remainder on division by two, inside the open interval 61 to 69.",
              "Suggest a count you can split into pairs with none left over, in excess of 12 and short of 20.",
              "Respond with a tally that is a multiple of two, past 36 and under 44.",
              "Type a figure exceeding 54 but shy of 62 that halves without a fraction.",
              "Supply a non-odd count from the gap separating 20 and 28."),
    "letters": ("Pick a character ordered past `e` and ahead of `j`.",
                "Write a symbol of the ABCs that follows `k` but precedes `p`.",
                "Any character from a to z that sits beyond `s` and prior to `x` will do.",
                "Offer a glyph ranked past `g` yet ahead of `m` in dictionary order.",
                "Type a character that in ABC order is past `b` and ahead of `f`.",
                "Respond with a Latin character following `n` yet preceding `u`.",
                "Share a single character found beyond `h` and prior to `o` when reciting a to z.",
                "Suggest a character in the open range `q` to `v` of the ABCs."),
    "months": ("Pick a part of the calendar past February yet ahead of June.",
               "Write down a calendar page following April and preceding August.",
               "Any stretch of the calendar beyond September and prior to December will do.",
               "Offer a calendar period found past January and ahead of April.",
               "Respond with a span of about thirty days following May yet preceding September.",
               "Share a portion of the calendar sitting past March and ahead of August.",
               "Type a calendar segment beyond June and prior to October.",
               "Suggest a span of roughly four weeks following October and preceding December."),
}


def template_words() -> set[str]:
    """Every word of every template, lower case, without the bounds' placeholders and the function words."""
    words = {w for ts in TEMPLATES.values() for t in ts for w in re.findall(r"[a-z]+", t.lower())}
    return words - ALLOWED - {"lo", "hi"}


def leaks(word: str, banned: set[str]) -> bool:
    """Whether a paraphrase's word is a banned word or a form of one (named: name; falling: falls)."""
    def stem(w: str) -> str:
        return next((w[:-len(s)] for s in ("ing", "ed", "es", "s", "d") if w.endswith(s) and len(w) - len(s) >= 3), w)
    return any(word == b or stem(word) == stem(b) or (len(b) >= 4 and word.startswith(b)) for b in banned)


def words(text: str) -> set[str]:
    """A paraphrase's words, lower case, its backticked bounds left out."""
    return set(re.findall(r"[a-z]+", re.sub(r"`[^`]*`", " ", text).lower()))


def nearest_share(train: "torch.Tensor", paraphrases: "torch.Tensor", groups: list[str], labels: list[str]) -> float:
    """Share of paraphrases whose nearest training prompt (cosine of dense unit rows) is in their own cluster: 1 for
    an embedding that places a prompt by what it asks, about the largest cluster's share for one that places it by
    the words it shares with no template."""
    nearest = (paraphrases @ train.T).argmax(dim=1).tolist()
    return sum(groups[j] == c for j, c in zip(nearest, labels)) / len(labels)
