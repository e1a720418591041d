"""Small local mirrors of the hub datasets, in the hub's layout and schema, malformed rows included.

Each sample row carries what the loader should make of it: a skip reason (str) or the number of
pairs it yields (int). `expected(rows)` turns that into rows read / pairs / skips."""
from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

MSG = pa.struct([("content", pa.string()), ("role", pa.string())])  # field order as on the hub


def _t(*turns: str) -> str:
    """HH transcript from alternating human/assistant turns."""
    return "".join(f"\n\n{'Human' if i % 2 == 0 else 'Assistant'}: {t}" for i, t in enumerate(turns))


def expected(rows: list[tuple[object, object]]) -> dict:
    skipped = Counter(e for _, e in rows if isinstance(e, str))
    pairs = sum(e for _, e in rows if isinstance(e, int))
    extra = sum(e - 1 for _, e in rows if isinstance(e, int))
    return {"rows_read": len(rows), "pairs_kept": pairs, "extra_pairs": extra, "skipped": dict(sorted(skipped.items()))}


# ---------------------------------------------------------------- Anthropic/hh-rlhf
HH_SUBSETS = ("harmless-base", "helpful-base", "helpful-online", "helpful-rejection-sampled")


def hh_rows(subset: str, split: str) -> list[tuple[dict, object]]:
    tag = f"{subset}/{split}"
    rows = [
        ({"chosen": _t(f"How do I bake bread? ({tag})", "Mix flour, water, yeast and salt, then bake."),
          "rejected": _t(f"How do I bake bread? ({tag})", "Buy some.")}, 1),
        ({"chosen": _t(f"Hi ({tag})", "Hello!", "What is 2+2?", "It is 4."),
          "rejected": _t(f"Hi ({tag})", "Hello!", "What is 2+2?", "It is 5.")}, 1),
    ]
    if subset == "harmless-base" and split == "train":
        same = _t("Same?", "Yes.")
        rows += [
            ({"rejected": _t("a", "b")}, "missing_chosen"),
            ({"chosen": None, "rejected": _t("a", "b")}, "missing_chosen"),
            ({"chosen": 5, "rejected": _t("a", "b")}, "not_a_string_chosen"),
            ({"chosen": same, "rejected": same}, "chosen_equals_rejected"),
            ({"chosen": "\n\nHuman: hello there", "rejected": "\n\nHuman: hello you"}, "no_assistant_turn"),
            ({"chosen": _t("Q?", ""), "rejected": _t("Q?", "An answer.")}, "empty_response"),
            ({"chosen": _t("Q?", "caf\ufffd"), "rejected": _t("Q?", "ok")}, "undecodable_chosen"),
            ({"chosen": _t("Q1?", "A.", "Q2?", "B."), "rejected": _t("Q1?", "C.", "Q2?", "B.")},
             "transcripts_diverge_before_last_turn"),
            ({"chosen": "   ", "rejected": _t("a", "b")}, "empty_chosen"),
            (dict(rows[0][0]), "duplicate_pair"),  # the same pair twice is kept once
        ]
    return rows


def write_hh(root: Path, rows=hh_rows, reorder: bool = False) -> dict[str, list]:
    """root/<subset>/{train,test}.jsonl.gz plus the red-team file (another schema) to be ignored."""
    written = {}
    for subset in HH_SUBSETS:
        for split in ("train", "test"):
            rs = rows(subset, split)
            rs = rs[::-1] if reorder else rs
            path = root / subset / f"{split}.jsonl.gz"
            path.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(path, "wt", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r, _ in rs)
            written[f"{subset}/{split}"] = rs
    red = root / "red-team-attempts" / "red_team_attempts.jsonl.gz"
    red.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(red, "wt") as f:
        f.write(json.dumps([{"transcript": _t("x", "y"), "min_harmlessness_score_transcript": 0.5}]) + "\n")
    (root / "README.md").write_text("---\nlicense: mit\n---\n# hh-rlhf mirror\n")
    return written


# ---------------------------------------------------------------- HuggingFaceH4/ultrafeedback_binarized
UF_SCHEMA = pa.schema([
    ("prompt", pa.string()), ("prompt_id", pa.string()),
    ("chosen", pa.list_(MSG)), ("rejected", pa.list_(MSG)), ("messages", pa.list_(MSG)),
    ("score_chosen", pa.float64()), ("score_rejected", pa.float64()),
])
UF_README = """---
configs:
- config_name: default
  data_files:
  - split: train_prefs
    path: data/train_prefs-*
  - split: train_sft
    path: data/train_sft-*
  - split: test_prefs
    path: data/test_prefs-*
  - split: test_sft
    path: data/test_sft-*
---
# ultrafeedback_binarized mirror
"""


def _uf(prompt, chosen, rejected, sc=8.0, sr=4.0, history=()):
    def conv(answer):
        return [*history, {"content": prompt, "role": "user"}, {"content": answer, "role": "assistant"}]
    return {"prompt": prompt, "prompt_id": f"id-{prompt}", "chosen": conv(chosen), "rejected": conv(rejected),
            "messages": conv(chosen), "score_chosen": sc, "score_rejected": sr}


def uf_rows(split: str) -> list[tuple[dict, object]]:
    rows = [
        (_uf(f"Name a prime number ({split}).", "2 is prime.", "4 is prime."), 1),
        (_uf(f"Say hi ({split}).", "Hi!", "No.", history=[{"content": "Be brief.", "role": "system"}]), 1),
    ]
    if split == "train_prefs":
        bad_last = _uf("Q", "A", "B")
        bad_last["chosen"] = bad_last["chosen"][:1]  # only the user turn
        mismatch = _uf("Q", "A", "B")
        mismatch["rejected"][0] = {"content": "another question", "role": "user"}
        badrole = _uf("Q", "A", "B")
        badrole["chosen"][0] = {"content": "Q", "role": "tool"}
        rows += [
            (_uf("Tie?", "A", "B", sc=5.0, sr=5.0), "score_tie"),
            ({**_uf("Q", "A", "B"), "chosen": None}, "missing_chosen"),
            (bad_last, "no_assistant_turn"),
            (mismatch, "prompt_mismatch"),
            (badrole, "bad_role_chosen"),
            (_uf("Q", "", "B"), "empty_chosen"),
            ({**_uf("Q", "A", "B"), "score_rejected": None}, "missing_score_rejected"),
            (_uf("Q", "Same.", "Same."), "chosen_equals_rejected"),
            (_uf("Q", "A", "B", sc=1.0, sr=2.0), "chosen_scored_lower"),
        ]
    return rows


def write_uf(root: Path, rows=uf_rows, reorder: bool = False) -> dict[str, list]:
    written = {}
    for split in ("train_prefs", "test_prefs", "train_sft", "test_sft"):
        rs = rows(split) if split.endswith("prefs") else [(_uf("sft only", "a", "b"), None)]
        rs = rs[::-1] if reorder else rs
        path = root / "data" / f"{split}-00000-of-00001.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([r for r, _ in rs], schema=UF_SCHEMA), path)
        written[split] = rs
    (root / "README.md").write_text(UF_README)
    return written


# ---------------------------------------------------------------- HuggingFaceH4/stack-exchange-preferences
ANSWER = pa.struct([("answer_id", pa.int64()), ("author", pa.string()), ("author_id", pa.int64()),
                    ("author_profile", pa.string()), ("pm_score", pa.int64()), ("selected", pa.bool_()),
                    ("text", pa.string())])
SE_SCHEMA = pa.schema([("qid", pa.int64()), ("question", pa.string()), ("answers", pa.list_(ANSWER)),
                       ("date", pa.string()), ("metadata", pa.list_(pa.string()))])


def _ans(i: int, score, text="<p>Answer {i} with <code>x = {i}</code> &amp; more.</p>"):
    return {"answer_id": i, "author": f"user{i}", "author_id": 100 + i,
            "author_profile": f"https://se.example/users/{100 + i}",
            "pm_score": score, "selected": False, "text": text.format(i=i) if isinstance(text, str) else text}


def _q(qid: int, site: str, answers, question="<p>How do I do thing {qid}?</p><pre><code>print({qid})\n</code></pre>"):
    return {"qid": qid, "question": question.format(qid=qid) if isinstance(question, str) else question,
            "answers": answers, "date": "2020/01/01",
            "metadata": [f"https://{site}/questions/{qid}", f"https://{site}", f"https://{site}/users/1/"]}


def se_rows(site: str, shard: int) -> list[tuple[dict, object]]:
    base = 1000 * SE_SITES.index(site) + 100 * shard  # distinct qids per file
    rows = [
        (_q(base + 1, site, [_ans(1, 3), _ans(2, 1), _ans(3, 1)]), 2),  # 3>1, 3>1; the two 1s tie
        (_q(base + 2, site, [_ans(i, i) for i in range(5)]), 3),  # 10 strict pairs, capped at 3 in tests
    ]
    if shard == 0 and site.startswith("apple"):
        rows += [
            (_q(base + 3, site, [_ans(1, 2), _ans(2, 2)]), "no_strict_preference"),
            (_q(base + 4, site, [_ans(1, 2)]), "fewer_than_2_usable_answers"),
            (_q(base + 5, site, []), "fewer_than_2_usable_answers"),
            (_q(base + 6, site, [_ans(1, 2), _ans(2, 1, text=None), _ans(3, None)]), "fewer_than_2_usable_answers"),
            (_q(base + 7, site, [_ans(1, 2), _ans(2, 1)], question=None), "missing_question"),
            (_q(base + 8, site, [_ans(1, 2), _ans(2, 1)], question="<p> </p>"), "empty_prompt"),
            (_q(base + 9, site, [_ans(1, 5, "<p>same</p>"), _ans(2, 1, "<p>same</p>")]), "no_strict_preference"),
        ]
    return rows


SE_SITES = ("apple.stackexchange.com", "math.stackexchange.com")
SE_FILES = ((SE_SITES[0], 0, 2), (SE_SITES[0], 1, 2), (SE_SITES[1], 0, 1))  # (site, shard, n_shards)


def write_se(root: Path, rows=se_rows, reorder: bool = False) -> dict[str, list]:
    written = {}
    for site, shard, n in SE_FILES:
        rs = rows(site, shard)
        rs = rs[::-1] if reorder else rs
        path = root / "data" / site / f"train-{shard:05d}-of-{n:05d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([r for r, _ in rs], schema=SE_SCHEMA), path)
        written[f"{site}/{shard}"] = rs
    (root / "README.md").write_text("---\nlicense: cc-by-sa-4.0\n---\n# stack-exchange-preferences mirror\n")
    return written


# ---------------------------------------------------------------- HuggingFaceTB/smoltalk
SMOL_SCHEMA = pa.schema([("messages", pa.list_(MSG)), ("source", pa.string())])
SMOL_README = """---
configs:
- config_name: all
  data_files:
  - split: train
    path: data/all/train-*
  - split: test
    path: data/all/test-*
- config_name: smol-magpie-ultra
  data_files:
  - split: train
    path: data/smol-magpie-ultra/train-*
---
# smoltalk mirror
"""


def _m(*turns) -> list[dict]:
    return [{"content": c, "role": r} for r, c in turns]


def smol_rows(config: str, split: str) -> list[tuple[dict, object]]:
    rows = [
        ({"messages": _m(("user", f"Hi ({config}/{split})"), ("assistant", "Hello!")), "source": "s"}, None),
        ({"messages": _m(("system", "Be kind."), ("user", "Q"), ("assistant", "A"), ("user", "Q2"),
                         ("assistant", "A2")),
          "source": "s"}, None),
    ]
    if config == "all" and split == "train":
        rows += [
            ({"messages": _m(("user", "Q")), "source": "s"}, "no_assistant_turn"),
            ({"messages": _m(("user", "Q"), ("tool", "x"), ("assistant", "A")), "source": "s"}, "bad_role"),
            ({"messages": [{"content": None, "role": "user"}, {"content": "A", "role": "assistant"}], "source": "s"},
             "non_str_content"),
            ({"messages": _m(("user", "Q"), ("user", "Q again"), ("assistant", "A")), "source": "s"}, "bad_role_order"),
            ({"messages": _m(("assistant", "A"), ("user", "Q")), "source": "s"}, "bad_role_order"),
            ({"messages": None, "source": "s"}, "missing"),
            ({"messages": _m(("user", "Q"), ("assistant", "  ")), "source": "s"}, "empty_content"),
        ]
    return rows


def write_smoltalk(root: Path, rows=smol_rows) -> dict[str, list]:
    written = {}
    for config, split in (("all", "train"), ("all", "test"), ("smol-magpie-ultra", "train")):
        rs = rows(config, split)
        path = root / "data" / config / f"{split}-00000-of-00001.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([r for r, _ in rs], schema=SMOL_SCHEMA), path)
        written[f"{config}/{split}"] = rs
    (root / "README.md").write_text(SMOL_README)
    return written


# ---------------------------------------------------------------- HuggingFaceFW/fineweb-edu
FINEWEB_README = """---
configs:
- config_name: sample-10BT
  data_files:
  - split: train
    path: sample/10BT/*
---
# fineweb-edu mirror
"""


def write_fineweb(root: Path, n_docs: int = 400, shards: int = 2) -> list[str]:
    """root/sample/10BT/<shard>.parquet (text, id, url, score, as on the hub) of seeded sentences from a small word
    list: enough text to train a micro tokenizer and model on."""
    import random
    rng = random.Random(0)
    words = ("the bee flies over a field of wheat while rain falls on warm stone and children read books about "
             "rivers mountains numbers stars engines gardens history water light sound").split()
    docs = [". ".join(" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))).capitalize()
                      for _ in range(rng.randint(3, 8))) + "." for _ in range(n_docs)]
    for s in range(shards):
        part = docs[s::shards]
        path = root / "sample" / "10BT" / f"{s:03d}_00000.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": part, "id": [f"<urn:{s}:{i}>" for i in range(len(part))],
                                 "url": [f"https://example.org/{s}/{i}" for i in range(len(part))],
                                 "score": [3.0] * len(part)}), path)
    (root / "README.md").write_text(FINEWEB_README)
    return docs


# ---------------------------------------------------------------- openai/gsm8k
GSM8K_README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
- config_name: socratic
  data_files:
  - split: train
    path: socratic/train-*
  - split: test
    path: socratic/test-*
---
# gsm8k mirror
"""


def gsm8k_rows(split: str, n: int = 12) -> list[tuple[dict, object]]:
    """Word problems in the hub's form (calculator annotations, `#### answer`), malformed ones in train."""
    rows = [({"question": f"Ann has {k + 2} apples ({split}) and buys {3 * k + 1} more. How many apples has she?",
              "answer": f"She buys {3 * k + 1} more: {k + 2}+{3 * k + 1}=<<{k + 2}+{3 * k + 1}={4 * k + 3}>>"
                        f"{4 * k + 3} apples.\n#### {4 * k + 3}"}, str(4 * k + 3)) for k in range(n)]
    rows.append(({"question": f"A farm sells 1,000 eggs a day for $2 a dozen ({split}). What is the weekly count?",
                  "answer": "1,000*7=<<1000*7=7000>>7000 eggs.\n#### 7,000"}, "7000"))
    if split == "train":
        rows += [({"question": "No final line?", "answer": "It is 4."}, "no_final_answer"),
                 ({"question": "Words?", "answer": "So.\n#### four"}, "final_answer_not_a_number"),
                 ({"question": None, "answer": "#### 3"}, "missing_question_or_answer"),
                 ({"question": "  ", "answer": "#### 3"}, "empty_question"),
                 (dict(rows[0][0]), "duplicate_question")]
    return rows


def write_gsm8k(root: Path, rows=gsm8k_rows) -> dict[str, list]:
    written = {}
    for config in ("main", "socratic"):
        for split in ("train", "test"):
            rs = rows(split)
            path = root / config / f"{split}-00000-of-00001.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"question": [r["question"] for r, _ in rs],
                                     "answer": [r["answer"] for r, _ in rs]}), path)
            written[f"{config}/{split}"] = rs
    (root / "README.md").write_text(GSM8K_README)
    return written
