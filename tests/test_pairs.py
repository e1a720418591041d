"""download_pairs on local mirrors of the three hub datasets (loaded through datasets.load_dataset
exactly as the hub would be), plus the embedded docstring pairs."""
import json
import shutil
from collections import Counter

import pyarrow.parquet as pq
import pytest

import mirrors
from speedrun.data import pairs, pairs_embedded, pairs_hh, pairs_se
from speedrun.data.docstrings import collect
from speedrun.data.questions import answer, questions
import subprocess
import sys

from conftest import REPO, call_stage, sets

COLUMNS = ["id", "src", "split", "prompt", "chosen", "rejected", "group", "negative", "attribution"]


def run(out, *args, ok=True):
    if ok:
        call_stage("download_pairs", *args, "--out-dir", out)
        return pq.read_table(out / "pairs.parquet").to_pylist(), json.loads((out / "stats.json").read_text())
    with pytest.raises((SystemExit, Exception)) as e:
        call_stage("download_pairs", *args, "--out-dir", out)
    return e.value


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    rows = {"hh": mirrors.write_hh(root / "hh"), "uf": mirrors.write_uf(root / "uf"),
            "se": mirrors.write_se(root / "se")}
    rows["uf"] = {k: v for k, v in rows["uf"].items() if k.endswith("prefs")}  # sft splits are not read
    return root, rows


def hub_args(root, *extra):
    return [*sets("pairs.only=[hh,uf,se]", f"pairs.hh_path={root / 'hh'}", f"pairs.uf_path={root / 'uf'}",
                  f"pairs.se_path={root / 'se'}", "pairs.se_max_pairs_per_question=3"), *extra]


def test_mirrors_kept_and_skipped_counts(hub, tmp_path):
    root, rows = hub
    got, stats = run(tmp_path / "out", *hub_args(root))
    for src in ("hh", "uf", "se"):
        want = mirrors.expected([r for rs in rows[src].values() for r in rs])
        s = stats["sources"][src]
        assert {k: s[k] for k in want} == want, src
        assert s["rows_read"] + s["extra_pairs"] == s["pairs_kept"] + sum(s["skipped"].values())
    assert stats["sources"]["hh"]["splits"] == {"test": 8, "train": 8}
    assert stats["sources"]["uf"]["splits"] == {"test_prefs": 2, "train_prefs": 2}
    assert stats["sources"]["se"]["answers_skipped"] == {"missing_answer": 1, "missing_pm_score": 1}
    assert stats["total_pairs"] == len(got) == 16 + 4 + 15
    assert list(pq.read_schema(tmp_path / "out/pairs.parquet").names) == COLUMNS
    assert len({p["id"] for p in got}) == len(got)

    by_src = {s: [p for p in got if p["src"] == s] for s in ("hh", "uf", "se")}
    multi = [p for p in by_src["hh"] if len(p["prompt"]) == 3]  # earlier turns stay in the prompt
    assert len(multi) == 8 and all(p["prompt"][1] == {"role": "assistant", "content": "Hello!"} for p in multi)
    assert {(p["chosen"], p["rejected"]) for p in multi} == {("It is 4.", "It is 5.")}
    assert not any("red" in p["prompt"][0]["content"] for p in by_src["hh"])
    sys_prompt = [p for p in by_src["uf"] if p["prompt"][0]["role"] == "system"]
    assert len(sys_prompt) == 2 and all(p["chosen"] == "Hi!" for p in sys_prompt)
    for p in by_src["se"]:
        who = json.loads(p["attribution"])
        assert who["chosen"]["author"].startswith("user") and who["rejected"]["author_profile"].startswith("https://")
        assert "<p>" not in p["chosen"] and "&amp;" not in p["chosen"] and "```" in p["prompt"][0]["content"]
    assert all(p["negative"] is None and p["group"] == p["src"] for p in got)


def test_rerun_is_byte_identical_and_ids_ignore_row_order(hub, tmp_path):
    root, _ = hub
    a, sa = run(tmp_path / "a", *hub_args(root))
    run(tmp_path / "b", *hub_args(root))
    assert (tmp_path / "a/pairs.parquet").read_bytes() == (tmp_path / "b/pairs.parquet").read_bytes()
    rev = tmp_path / "rev"
    mirrors.write_hh(rev / "hh", reorder=True)
    mirrors.write_uf(rev / "uf", reorder=True)
    mirrors.write_se(rev / "se", reorder=True)
    c, sc = run(tmp_path / "c", *hub_args(rev))
    assert {p["id"] for p in a} == {p["id"] for p in c}
    assert {s: v["skipped"] for s, v in sa["sources"].items()} == {s: v["skipped"] for s, v in sc["sources"].items()}


def test_limit_per_source_caps_pairs_and_reads_every_split_and_site_in_turn(hub, tmp_path):
    root, _ = hub
    got, stats = run(tmp_path / "out", *hub_args(root, "-S", "pairs.limit_per_source=4"))
    for src in ("hh", "uf", "se"):
        s = stats["sources"][src]
        assert s["pairs_kept"] == 4 and s["rows_read"] + s["extra_pairs"] == 4 + sum(s["skipped"].values())
    assert stats["sources"]["hh"]["splits"] == {"test": 2, "train": 2}  # harmless-base, then helpful-base
    assert stats["sources"]["uf"]["splits"] == {"test_prefs": 2, "train_prefs": 2}
    se = stats["sources"]["se"]  # a question gives 2 pairs here: 2 questions, one from each site, not 4 from one
    assert se["sites"] == 2 and se["rows_read"] == 2
    assert {json.loads(p["attribution"])["metadata"][1] for p in got if p["src"] == "se"} == {
        f"https://{site}" for site in mirrors.SE_SITES}
    _, stats = run(tmp_path / "three", *sets("pairs.only=[se]", f"pairs.se_path={root / 'se'}",
                                             "pairs.limit_per_source=3"))
    se = stats["sources"]["se"]  # the cap falls inside the second question: its other pair is counted, not kept
    assert se["pairs_kept"] == 3 and se["skipped"] == {"over_limit": 1}


def test_source_flags_and_help(hub, tmp_path):
    root, _ = hub
    got, stats = run(tmp_path / "uf", *sets("pairs.only=[uf]", f"pairs.uf_path={root / 'uf'}"))
    assert set(stats["sources"]) == {"uf"} and {p["src"] for p in got} == {"uf"}
    _, stats = run(tmp_path / "se", *sets("pairs.only=[se]", f"pairs.se_path={root / 'se'}",
                                          "pairs.se_data_dir=data/math.stackexchange.com"))
    assert set(stats["sources"]) == {"se"} and stats["sources"]["se"]["rows_read"] == 2
    got, stats = run(tmp_path / "two", *sets("pairs.only=[se,uf]", f"pairs.uf_path={root / 'uf'}",
                                             f"pairs.se_path={root / 'se'}"))
    assert set(stats["sources"]) == {"uf", "se"} and {p["src"] for p in got} == {"uf", "se"}
    assert "pairs.only[0]" in str(run(tmp_path / "x", "-S", "pairs.only=[nope]", ok=False))
    assert "pairs.only" in str(run(tmp_path / "x", "-S", "pairs.only=[]", ok=False))
    assert "write [hh,uf]" in str(run(tmp_path / "x", "-S", "pairs.only=hh,uf", ok=False))  # not DVC's sweep form
    help_text = subprocess.run([sys.executable, "-m", "stages.download_pairs", "--help"], cwd=REPO,
                               capture_output=True, text=True).stdout
    for key in ("pairs.only", "pairs.limit_per_source", "pairs.hh_path", "pairs.uf_path", "pairs.se_path",
                "pairs.se_max_pairs_per_question", "pairs.se_data_dir", "--out-dir"):
        assert key in help_text, key


def test_unparsable_file_fails_naming_it(hub, tmp_path):
    root, _ = hub
    shutil.copytree(root / "hh", tmp_path / "hh")
    bad = tmp_path / "hh/helpful-online/test.jsonl.gz"
    bad.write_bytes(b"not gzip at all")
    res = run(tmp_path / "out", *sets("pairs.only=[hh]", f"pairs.hh_path={tmp_path / 'hh'}"), ok=False)
    assert str(bad) in str(res)
    assert not (tmp_path / "out/pairs.parquet").exists()


def test_hh_prompt_is_common_prefix_cut_at_last_assistant():
    row = {"chosen": "\n\nHuman: Hi\n\nAssistant: Hey.\n\nHuman: Tell me a joke\n\nAssistant: Why did the chicken...",
           "rejected": "\n\nHuman: Hi\n\nAssistant: Hey.\n\nHuman: Tell me a joke\n\nAssistant: Why not."}
    [p] = pairs_hh.parse(row, "train")
    assert p["prompt"] == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey."},
                           {"role": "user", "content": "Tell me a joke"}]
    assert (p["chosen"], p["rejected"]) == ("Why did the chicken...", "Why not.")
    with pytest.raises(pairs.Skip, match="no_assistant_turn"):
        pairs_hh.parse({"chosen": "\n\nHuman: a b", "rejected": "\n\nHuman: a c"}, "train")


def test_se_pairs_widest_gap_first_and_capped():
    answers = [mirrors._ans(i, s) for i, s in enumerate([0, 3, 1, 2])]
    parse = pairs_se.parser(2, Counter())
    got = parse(mirrors._q(7, "x.stackexchange.com", answers), "train")
    ids = [(json.loads(p["attribution"])["chosen"]["answer_id"], json.loads(p["attribution"])["rejected"]["answer_id"])
           for p in got]
    assert ids[0] == (1, 0) and ids[1] in {(1, 2), (3, 0)}  # gap 3, then one of the two gap-2 pairs
    assert parse(mirrors._q(7, "x.stackexchange.com", answers[::-1]), "train") == got  # answer order is irrelevant


def test_html_to_text():
    html = ('<p>Use <code>a&lt;b</code> and <a href="http://x.y">this</a>.</p><ul><li>one</li></ul>'
            '<pre><code>def f():\n    return 1\n</code></pre><blockquote><p>q</p></blockquote>')
    assert pairs_se.html_to_text(html) == ("Use `a<b` and [this](http://x.y).\n\n- one\n\n"
                                           "```\ndef f():\n    return 1\n```\n\n> q")


@pytest.fixture(scope="module")
def objects():
    objs, _ = collect()
    keep = {"json", "csv", "abc", "tkinter", "topic:assert", "topic:assignment"}
    return [o for o in objs if o.top in keep]


def test_embedded_pairs(objects, tmp_path):
    stats = pairs.build({"embedded": pairs_embedded.source(objects, 0.5, 0.1)}, tmp_path / "a.parquet")
    pairs.build({"embedded": pairs_embedded.source(objects, 0.5, 0.1)}, tmp_path / "b.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    got = pq.read_table(tmp_path / "a.parquet").to_pylist()
    s = stats["sources"]["embedded"]
    assert s["rows_read"] == len(objects) == s["pairs_kept"] + sum(s["skipped"].values())
    answers = {}
    for o in objects:
        answers.setdefault(answer(o)[0], []).append(o)
    by_prompt = {}
    for o in objects:  # the first object of a name answers it (a property's setter comes second)
        for q in questions(o):
            by_prompt.setdefault(q, o)
    n_hard = 0
    for p in got:
        obj = by_prompt[p["prompt"][0]["content"]]  # the question is one of the SFT templates
        assert p["chosen"] == answer(obj)[0] and p["rejected"] != p["chosen"]
        assert p["group"] == ("pydoc_topics" if obj.kind == "topic" else obj.top)
        if p["negative"] == "hard":
            n_hard += 1
            assert any(o.top == obj.top or o.kind == obj.kind == "topic" for o in answers[p["rejected"]])
    assert s["negatives"] == {"hard": n_hard, "random": len(got) - n_hard}
    assert 0.35 < n_hard / len(got) < 0.65


def test_embedded_pairs_several_negatives(objects, tmp_path):
    pairs.build({"embedded": pairs_embedded.source(objects, 0.5, 0.1)}, tmp_path / "1.parquet")
    one = pq.read_table(tmp_path / "1.parquet").to_pylist()
    stats = pairs.build({"embedded": pairs_embedded.source(objects, 0.5, 0.1, negatives=3)}, tmp_path / "3.parquet")
    three = pq.read_table(tmp_path / "3.parquet").to_pylist()
    s = stats["sources"]["embedded"]
    assert s["rows_read"] + s["extra_pairs"] == s["pairs_kept"] + sum(s["skipped"].values())
    by_prompt: dict[str, list[dict]] = {}
    for p in three:
        by_prompt.setdefault(p["prompt"][0]["content"], []).append(p)
    assert s["negatives_per_object"] == 3 and len(by_prompt) == len(one)
    for p in one:  # the first negative of each object is the one it gets alone
        group = by_prompt[p["prompt"][0]["content"]]
        assert group[0]["rejected"] == p["rejected"] and len(group) <= 3
        assert {q["chosen"] for q in group} == {p["chosen"]}
        assert len({q["rejected"] for q in group}) == len(group)  # distinct negatives
    assert sum(len(g) < 3 for g in by_prompt.values()) == s["fewer_negatives"] < 0.1 * len(by_prompt)


def test_embedded_echo_pairs_add_the_asked_name_as_a_rejected_side(objects, tmp_path):
    """echo: each object's pairs as without it, plus one whose rejected side is its name alone in backticks."""
    pairs.build({"embedded": pairs_embedded.source(objects, 0.5, 0.1)}, tmp_path / "plain.parquet")
    plain = pq.read_table(tmp_path / "plain.parquet").to_pylist()
    stats = pairs.build({"embedded": pairs_embedded.source(objects, 0.5, 0.1, echo=True)}, tmp_path / "echo.parquet")
    got = pq.read_table(tmp_path / "echo.parquet").to_pylist()
    echo = [p for p in got if p["negative"] == "echo"]
    assert [p for p in got if p["negative"] != "echo"] == plain
    assert len(echo) == len(plain) and stats["sources"]["embedded"]["negatives"]["echo"] == len(plain)
    for p, q in zip(plain, echo):  # the same prompt, chosen answer, split and group as the object's other pair
        assert {k: q[k] for k in ("prompt", "chosen", "split", "group")} == {k: p[k] for k in ("prompt", "chosen",
                                                                                             "split", "group")}
        assert q["rejected"] == f"`{p['prompt'][0]['content'].split('`')[1]}`"  # the name the question asks about


def test_embedded_probe_pairs_draw_held_out_phrases_outside_train(objects, tmp_path):
    """probes: each object's pairs as without them, plus a content-free reply and a template naming it as rejected
    sides; a train object's from the TRAIN lists, a val or eval object's from the HELDOUT lists (none shared)."""
    pairs.build({"embedded": pairs_embedded.source(objects, 0.5, 0.1, echo=True)}, tmp_path / "plain.parquet")
    plain = pq.read_table(tmp_path / "plain.parquet").to_pylist()
    pairs.build({"embedded": pairs_embedded.source(objects, 0.5, 0.1, echo=True, probes=True)},
                tmp_path / "probes.parquet")
    got = pq.read_table(tmp_path / "probes.parquet").to_pylist()
    kinds = ("nonanswer", "template")
    assert [p for p in got if p["negative"] not in kinds] == plain
    objects_n = sum(p["negative"] == "echo" for p in plain)
    assert [sum(p["negative"] == k for p in got) for k in kinds] == [objects_n, objects_n]
    assert not set(pairs_embedded.TRAIN_NONANSWERS) & set(pairs_embedded.HELDOUT_NONANSWERS)
    assert not set(pairs_embedded.TRAIN_TEMPLATES) & set(pairs_embedded.HELDOUT_TEMPLATES)
    lists = {True: (pairs_embedded.TRAIN_NONANSWERS, pairs_embedded.TRAIN_TEMPLATES),
             False: (pairs_embedded.HELDOUT_NONANSWERS, pairs_embedded.HELDOUT_TEMPLATES)}
    sides = set()
    for p in got:
        if p["negative"] in kinds:
            name = p["prompt"][0]["content"].split("`")[1]
            assert p["rejected"] == pairs_embedded.probe_answers(name, p["split"])[p["negative"]]
            nonanswers, templates = lists[p["split"] == "train"]  # the side's own lists, the name filled in
            allowed = nonanswers if p["negative"] == "nonanswer" else [t.format(name) for t in templates]
            assert p["rejected"] in allowed
            sides.add(p["split"] == "train")
    assert sides == {True, False}  # both sides of the split drew probes
    assert any(p["rejected"] in pairs_embedded.HELDOUT_NONANSWERS for p in got if p["split"] != "train")
