"""dedup_prompts: prompt ids, exact and near-duplicate merges, the eval split, byte-identical outs."""
import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from speedrun.data import pairs as pairs_lib
from speedrun.data import prompts
from conftest import call_stage

LONG = ("I am planning a trip to the mountains next month with my two kids and our dog, and I would like "
        "to know which hiking trails are safe for young children and which gear we should pack for the cold")


def user(text):
    return [{"role": "user", "content": text}]


def pair(src, prompt, chosen="good answer", rejected="bad answer", group=None, negative=None):
    return pairs_lib.make_pair(src, "train", prompt, chosen, rejected, group=group, negative=negative)


def sample_pairs():
    return [
        pair("hh", user(LONG)),
        pair("uf", user(LONG.replace("  ", " ")), "another good", "another bad"),  # exact duplicate of the above
        pair("uf", user("  " + LONG.replace("trip", "journey") + " ")),  # near-duplicate (one word)
        pair("se", user(LONG), "se good", "se bad"),  # exact dup from a third source
        pair("hh", [*user("Hi"), {"role": "assistant", "content": "Hello"}, *user("What is 2+2?")]),
        pair("hh", user("What is 2+2?")),  # the last turn alone is a different prompt
        pair("embedded", user("What does `json.dumps` do?"), "Serialize obj.", "Deserialize s.", "json", "hard"),
        pair("embedded", user("What does `json.loads` do?"), "Deserialize s.", "Serialize obj.", "json", "random"),
        pair("embedded", user("Briefly describe `typing.Final`."), "A final name.", "x", "typing", "hard"),
        pair("embedded", user("Briefly describe `typing.final`."), "A final decorator.", "x", "typing", "hard"),
    ]


def write_pairs(path, rows):
    pq.write_table(pa.Table.from_pylist(rows, schema=pairs_lib.SCHEMA), path)


def run(tmp_path, pairs_path, *args):
    out = tmp_path / "prompts"
    call_stage("dedup_prompts", "--pairs", pairs_path, "--out-dir", out, *args)
    return (pd.read_parquet(out / "prompts.parquet"), pq.read_table(out / "pairs.parquet").to_pylist(),
            pd.read_csv(out / "prompt_id_map.tsv", sep="\t"), json.loads((out / "stats.json").read_text()))


def test_prompt_id_normalises_text_but_keeps_roles_and_turns():
    pid = prompts.prompt_id(user("Ｈｅｌｌｏ   world\n"))
    assert pid == prompts.prompt_id(user("Hello world")) and len(pid) == 16
    assert pid != prompts.prompt_id([{"role": "assistant", "content": "Hello world"}])
    assert pid != prompts.prompt_id([*user("Hi"), {"role": "assistant", "content": "Hey"}, *user("Hello world")])
    import hashlib
    assert pid == hashlib.sha256(b"user: Hello world").hexdigest()[:16]


def test_near_duplicates_merge_into_the_earliest_id():
    texts = {
        "b": "user: " + LONG,
        "a": "user: " + LONG + " please",
        "c": "user: " + LONG.replace("trip", "journey"),  # Jaccard 0.84 to a: joins a
        "f": "user: " + LONG.replace("dog", "cat").replace("trip", "journey"),  # 0.73 to a: a new prompt
        "d": "user: What does `json.dumps` do?",
        "e": "user: What does `json.loads` do?",
    }
    rep = prompts.near_duplicates(texts, 0.8)
    assert rep == {"a": "a", "b": "a", "c": "a", "d": "d", "e": "e", "f": "f"}
    assert prompts.near_duplicates(dict(reversed(list(texts.items()))), 0.8) == rep  # order-free
    assert prompts.near_duplicates(texts, 1.0) == {k: k for k in texts}
    sh = prompts.shingles(texts["a"])
    assert prompts.jaccard(sh, sh) == 1.0 and len(prompts.minhash(sh)) == prompts.N_PERM


def test_stage_outputs(tmp_path):
    rows = sample_pairs()
    write_pairs(tmp_path / "pairs.parquet", rows)
    uniq, out_pairs, id_map, stats = run(tmp_path, tmp_path / "pairs.parquet", "-S", "prompts.eval_frac=0.5")
    assert list(uniq.columns) == ["prompt_id", "prompt", "n_pairs", "srcs", "split", "group", "n_variants"]
    assert stats["total_pairs"] == 10 and stats["unique_prompts_exact"] == 8
    assert stats["near_dup_merges"] == 1 and stats["unique_prompts"] == len(uniq) == 7
    trip = uniq[uniq["n_pairs"] == 4].iloc[0]
    assert list(trip["srcs"]) == ["hh", "se", "uf"] and trip["n_variants"] == 2
    assert trip["prompt_id"] == min(prompts.prompt_id(user(LONG)),
                                    prompts.prompt_id(user(LONG.replace("trip", "journey"))))
    assert set(uniq["split"]) <= {"train", "val", "eval"}
    assert stats["eval_prompts"] == int((uniq["split"] == "eval").sum())
    embedded = uniq.loc[uniq["srcs"].map(lambda s: "embedded" in s), "group"]
    assert sorted(embedded) == ["json", "json", "typing", "typing"]
    hub = uniq.loc[uniq["srcs"].map(lambda s: "embedded" not in s), "group"]  # clusters of their words, not sources
    assert set(hub) <= {f"cluster_{i:02d}" for i in range(16)} and sum(
        c["prompts"] for c in stats["hub_clusters"].values()) == len(hub)
    # every pair carries its (merged) prompt_id and that prompt's split; the source split is kept
    split_of = dict(zip(uniq["prompt_id"], uniq["split"]))
    assert len(out_pairs) == 10 and all(p["split"] == split_of[p["prompt_id"]] for p in out_pairs)
    assert all(p["src_split"] == "train" for p in out_pairs)
    assert dict(zip(id_map["pair_id"], id_map["prompt_id"])) == {p["id"]: p["prompt_id"] for p in out_pairs}
    assert stats["per_source"]["uf"] == {"pairs": 2, "prompts": 1,
                                         "eval_prompts": int(split_of[trip["prompt_id"]] == "eval")}


def test_stage_is_byte_identical_and_row_order_free(tmp_path):
    rows = sample_pairs()
    write_pairs(tmp_path / "a.parquet", rows)
    write_pairs(tmp_path / "b.parquet", rows[::-1])
    run(tmp_path / "a", tmp_path / "a.parquet")
    run(tmp_path / "a2", tmp_path / "a.parquet")
    run(tmp_path / "b", tmp_path / "b.parquet")
    for name in ("prompts.parquet", "pairs.parquet", "prompt_id_map.tsv", "stats.json"):
        assert (tmp_path / "a/prompts" / name).read_bytes() == (tmp_path / "a2/prompts" / name).read_bytes(), name
    for name in ("prompts.parquet", "prompt_id_map.tsv", "stats.json"):  # pairs.parquet keeps the input order
        assert (tmp_path / "a/prompts" / name).read_bytes() == (tmp_path / "b/prompts" / name).read_bytes(), name


def test_hub_prompt_split_is_a_stable_fraction():
    ids = [prompts.prompt_id(user(f"question {i}")) for i in range(4000)]
    splits = [prompts.hash_split(i, 0.1, 0.1) for i in ids]
    assert 0.08 < splits.count("eval") / len(ids) < 0.12 and 0.07 < splits.count("val") / len(ids) < 0.11
    assert [prompts.hash_split(i, 0.1, 0.1) for i in ids[:50]] == splits[:50]
    assert all(prompts.hash_split(i, 0.0, 0.0) == "train" for i in ids)


def test_bad_input_rows_are_refused_by_file_row_and_column(tmp_path):
    """A repeated pair id, a prompt message with no text, and a prompts file whose prompt ids repeat (GRPO would
    draw the repeat twice as often) stop the stage or the loader, naming the file and the row."""
    import pytest
    from speedrun import tokenizer
    from speedrun.rl.prompts import load_prompts
    rows = sample_pairs()
    path = tmp_path / "pairs.parquet"
    write_pairs(path, rows[:3] + [rows[0]])
    with pytest.raises(SystemExit, match=r"error: .*pairs.parquet: rows 0 and 3, column 'id': the same id"):
        run(tmp_path, path)  # the stage's one line
    bad = dict(rows[4], prompt=[{"role": "user", "content": None}])
    write_pairs(path, rows[:2] + [bad])
    with pytest.raises(SystemExit, match=r"pairs.parquet: row 2, column 'prompt': message 0: expected a role and a "):
        run(tmp_path, path)
    write_pairs(path, rows)
    uniq = run(tmp_path, path, "-S", "prompts.eval_frac=0.0")[0]
    twice = pd.concat([uniq, uniq.iloc[:1]], ignore_index=True)
    twice.to_parquet(tmp_path / "twice.parquet")
    tok = tokenizer.train(iter(["some text to train a tiny tokenizer on"] * 20), 300)
    with pytest.raises(ValueError, match=rf"twice.parquet: rows 0 and {len(uniq)}, column 'prompt_id'"):
        load_prompts(tmp_path / "twice.parquet", tok, "train", 64)


def test_grpo_prompts_are_cut_as_the_rm_cuts_them(tmp_path, capsys):
    """load_prompts (GRPO, the evaluation) keeps a long prompt's chat header and end, and says how many it cut."""
    from speedrun import tokenizer
    from speedrun.rl.prompts import load_prompts
    tok = tokenizer.Tokenizer(tokenizer.train(iter(["some text to train a tiny tokenizer on"] * 20), 300), "t")
    msgs = [[{"role": "user", "content": "short?"}], [{"role": "user", "content": "long " * 50 + "end?"}]]
    pd.DataFrame({"prompt_id": ["a", "b"], "prompt": msgs, "split": ["train", "train"], "group": ["g", "g"]}
                 ).to_parquet(tmp_path / "p.parquet")
    _, ids = load_prompts(tmp_path / "p.parquet", tok, "train", 16)
    assert ids[0] == tok.render_prompt(msgs[0]) and ids[1] == tokenizer.cut_prompt(tok.render_prompt(msgs[1]), 16)
    assert len(ids[1]) == 16 and ids[1][:2] == [tok.bos_id, tok.user_start_id]
    assert "1 of 2 train prompts longer than 16 tokens" in capsys.readouterr().out


def test_hub_prompts_are_grouped_by_their_words_not_their_source():
    """Hub prompts have no module: their group is a k-means cluster of the words embedding, which puts prompts on one
    topic together whatever source they came from; on the task's prompts (text only) the clusters are nearly pure."""
    from collections import Counter, defaultdict

    from speedrun.data import task
    from speedrun.embeddings import word_embeddings
    from speedrun.rl.density import cluster_labels
    from stages.dedup_prompts import cluster_hub_prompts
    topics = {"bread": "How long should I bake {} bread dough at home?", "git": "How do I undo a git {} commit?",
              "tax": "Which tax form do I file for {} income?"}
    rows = [(t, f"{src}", q.format(w)) for t, q in topics.items() for src, w in
            zip(["hh", "uf", "se"] * 3, ["rye", "sour", "wheat", "merged", "pushed", "local", "rental", "farm", "gig"])]
    df = pd.DataFrame({"prompt": [[{"role": "user", "content": q}] for _, _, q in rows],
                       "srcs": [[s] for _, s, _ in rows], "group": [s for _, s, _ in rows]})
    out, mix = cluster_hub_prompts(df, 3, seed=0)
    assert {frozenset(out["group"][[i for i, r in enumerate(rows) if r[0] == t]]) for t in topics} == {
        frozenset({c}) for c in ("cluster_00", "cluster_01", "cluster_02")}
    assert all(m["prompts"] == 9 and m["hh"] == m["uf"] == m["se"] == 3 for m in mix.values())
    assert cluster_hub_prompts(df, 0, seed=0)[0]["group"].tolist() == df["group"].tolist()
    items = [i for i in task.all_items(0.1, 0.25, 70) if i.split == "train"]
    labels = cluster_labels(word_embeddings([i.prompt() for i in items]), 16, seed=0)
    assert labels == cluster_labels(word_embeddings([i.prompt() for i in items]), 16, seed=0)
    members = defaultdict(Counter)
    for lab, item in zip(labels, items):
        members[lab][item.cluster] += 1
    assert sum(m.most_common(1)[0][1] for m in members.values()) / len(items) > 0.9


def test_the_evaluation_refuses_fewer_than_two_held_out_prompts(tmp_path):
    """One held-out prompt cannot be swapped with another (the read-its-prompt check): the stage stops with one line
    naming the prompts file and what holds out more, not a traceback from the swap."""
    import pytest
    from types import SimpleNamespace

    from speedrun import params, tokenizer as tokenizer_lib
    from speedrun.common import UserError
    from conftest import REPO
    from stages.eval_diversity import held_out_prompts

    rows = [pairs_lib.make_pair("embedded", split, user(f"What does `json.f{i}` do?"), f"answer {i}", "x", group="json",
                                negative="hard") for i, split in enumerate(("train", "train", "eval"))]
    write_pairs(tmp_path / "raw.parquet", rows)
    run(tmp_path, tmp_path / "raw.parquet")
    tokenizer_lib.save(tokenizer_lib._encoding({bytes([b]): b for b in range(256)}), tmp_path / "tok")
    p = params.load(REPO / "params.yaml", ["eval.max_prompt_len=64"])
    io = SimpleNamespace(prompts=tmp_path / "prompts/prompts.parquet", pairs=tmp_path / "prompts/pairs.parquet",
                         sft_dir=tmp_path / "no_model")
    with pytest.raises(UserError, match=r"prompts.parquet: 1 held-out prompt\(s\) to evaluate, and the evaluation "
                                        r"needs 2: .* a larger prompts.eval_frac"):
        held_out_prompts(p, io, tokenizer_lib.load(tmp_path / "tok"))
