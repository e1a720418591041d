"""GSM8K (`openai/gsm8k`, config `main`) as the task track's hub task: grade-school word problems, one right answer
each (the number after `####` in the reference solution), checked as the embedded task is: the first backticked
value of a response, read as GSM8K writes numbers (`7,000` and `$7000` are 7000; task.normalise).

A reference solution becomes the SFT answer with its calculator annotations (`<<48/2=24>>`) removed and its final
line `#### 72` written as "The answer is `72`.", so the checker reads the model's final answer. The hub's test split
is the eval split (held out of every post-training stage); its train split is cut into train / val by a stable hash.
With one right answer per item, coverage of right answers is pass@k: narrowing shows as pass@k at large k falling
below the SFT model's temperature frontier, the RLVR literature's measure. Items are grouped (for density sampling
and the manipulation check) by k-means clusters of their question's words, as hub chat prompts are."""
from __future__ import annotations

import re
from collections import Counter

from speedrun.common import UserError, stable_hash, stable_unit
from speedrun.data import hub
from speedrun.data.task import normalise

FINAL = re.compile(r"\n?####\s*(.*)\s*$")
CALC = re.compile(r"<<[^<>]*>>")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def parse(row: dict) -> tuple[str, str, str] | str:
    """(question, SFT answer, right answer) of a hub row, or the reason it is skipped."""
    q, a = row.get("question"), row.get("answer")
    if not isinstance(q, str) or not isinstance(a, str):
        return "missing_question_or_answer"
    if not q.strip():
        return "empty_question"
    m = FINAL.search(a)
    if not m:
        return "no_final_answer"
    value = normalise(m.group(1))
    if not NUMBER.fullmatch(value):
        return "final_answer_not_a_number"
    steps = CALC.sub("", a[:m.start()]).strip()
    return q.strip(), (steps + "\n" if steps else "") + f"The answer is `{value}`.", value


def read(path: str, name: str | None, val_frac: float, max_items: int, seed: int
         ) -> tuple[list[dict], dict[str, int]]:
    """Rows (item_id, question, solution, answer, split) of the train split (train / val by a stable hash) and the
    test split (eval), up to max_items of each hub split (0 = all), and skip counts by reason. rows read = kept +
    skipped; a question asked twice is kept once (the first read), counted."""
    out, skipped, seen = [], Counter(), set()
    for hub_split in ("train", "test"):
        try:
            for i, row in enumerate(hub.stream(path, name, hub_split, seed)):
                if max_items and i >= max_items:
                    break
                parsed = parse(row)
                if isinstance(parsed, str):
                    skipped[parsed] += 1
                    continue
                q, solution, value = parsed
                item_id = stable_hash("gsm8k", q)
                if item_id in seen:
                    skipped["duplicate_question"] += 1
                    continue
                seen.add(item_id)
                split = "eval" if hub_split == "test" else "val" if stable_unit("gsm8k_split", item_id) < val_frac \
                    else "train"
                out.append({"item_id": item_id, "question": q, "solution": solution, "answer": value, "split": split})
        except Exception as e:
            raise UserError(f"cannot read {path} (config {name}, split {hub_split}): {type(e).__name__}: {e}") from e
    return out, dict(sorted(skipped.items()))
