import json

import pandas as pd
import yaml
import pytest

from conftest import call_stage
from speedrun.data import corpus, hub
from speedrun.data.docstrings import collect, split_of


def run_stage(tmp_path, *args):
    call_stage("corpus", *args, "--interpreter", tmp_path / "interpreter.json", "--out-dir", tmp_path / "corpus")
    out = tmp_path / "corpus"
    return (pd.read_parquet(out / "train.parquet"), pd.read_parquet(out / "val.parquet"),
            json.loads((out / "stats.json").read_text()))


def test_clean_text_reasons():
    assert corpus.clean_text("hi") == ("hi", None)
    assert corpus.clean_text("  \n") == (None, "empty")
    assert corpus.clean_text(None) == (None, "missing")
    assert corpus.clean_text(3) == (None, "not_a_string")
    assert corpus.clean_text(b"\xff\xfe") == (None, "undecodable")
    assert corpus.clean_text("bad \ud800 surrogate") == (None, "undecodable")
    assert corpus.clean_text("caf\u00e9".encode()) == ("caf\u00e9", None)


def test_embedded_documents_name_their_object():
    objects, skipped = collect()
    assert len(objects) > 3000
    by_name = {o.qualname: o for o in objects}
    dumps = by_name["json.dumps"]
    assert dumps.text.startswith("json.dumps(obj, *, skipkeys=False")
    assert "JSON" in dumps.summary
    # a module's objects all land on one side of the split
    assert len({split_of(o.top, 0.1) for o in objects if o.top == "json"}) == 1


def test_build_counts_every_document():
    docs = [("train", "a", "s"), ("train", "a", "s"), ("val", " ", "s"), ("val", None, "s"), ("val", "b", "s")]
    frames, stats = corpus.build(iter(docs))
    assert stats["docs_in"] == 5 and stats["kept"] == 2
    assert stats["skipped"] == {"duplicate": 1, "empty": 1, "missing": 1}
    assert frames["train"]["text"].tolist() == ["a"] and frames["val"]["text"].tolist() == ["b"]


@pytest.mark.slow
def test_embedded_stage_is_deterministic(tmp_path):
    a = run_stage(tmp_path / "a", "-S", "corpus.max_docs=400")
    run_stage(tmp_path / "b", "-S", "corpus.max_docs=400")
    for name in ["train.parquet", "val.parquet", "stats.json"]:
        assert (tmp_path / "a/corpus" / name).read_bytes() == (tmp_path / "b/corpus" / name).read_bytes()
    train, val, stats = a
    assert len(train) > 0 and len(val) > 0 and list(train.columns) == ["id", "text", "source"]
    assert stats["docs_in"] == stats["kept"] + sum(stats["skipped"].values())
    assert not set(train["id"]) & set(val["id"])


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["parquet_dir", "jsonl_file"])
def test_hf_source_on_local_mirror(tmp_path, fmt):
    texts = ["First document about bees.", "", "   ", "First document about bees.", None,
             "Second document, on wasps.", "Third one.", "Fourth and last read.", "Never read: past max_docs."]
    rows = pd.DataFrame({"text": texts, "url": [f"u{i}" for i in range(len(texts))]})
    if fmt == "parquet_dir":  # hub layout: a dataset dir with data/<split>-*.parquet
        (tmp_path / "mirror/data").mkdir(parents=True)
        rows.to_parquet(tmp_path / "mirror/data/train-00000-of-00001.parquet")
        path = tmp_path / "mirror"
    else:
        path = tmp_path / "docs.jsonl"
        rows.to_json(path, orient="records", lines=True)
    train, val, stats = run_stage(tmp_path, "-S", "corpus.source=hf", "-S", f"corpus.hf_path={path}",
                                  "-S", "corpus.hf_name=''", "-S", "corpus.max_docs=8", "-S", "corpus.val_frac=0.0",
                                  "-S", "corpus.hf_shuffle_buffer=0")  # file order: the last row is never read
    assert stats["docs_in"] == 8 and stats["kept"] == 4
    assert stats["skipped"] == {"duplicate": 1, "empty": 2, "missing": 1}
    assert "Never read" not in " ".join(train["text"])
    assert len(val) == 0


def test_hf_missing_column_names_file_and_row(tmp_path):
    path = tmp_path / "docs.jsonl"
    pd.DataFrame({"content": ["x"]}).to_json(path, orient="records", lines=True)
    with pytest.raises(KeyError, match=r"docs.jsonl row 0 of the stream: no column 'text'"):
        list(corpus.hf_docs(str(path), None, "train", "text", 10, 0.1))


@pytest.mark.slow
def test_hub_stream_shuffles_stably(tmp_path):
    """A seeded streaming shuffle: the same rows in the same order on every read, not the files' order, another
    order for another seed; every row once when all are read."""
    (tmp_path / "mirror/data").mkdir(parents=True)
    for shard in range(3):  # shards are shuffled too: the first rows read are not all from the first file
        pd.DataFrame({"text": [f"doc {shard}-{i}" for i in range(20)]}).to_parquet(
            tmp_path / f"mirror/data/train-{shard:05d}-of-00003.parquet")
    path = str(tmp_path / "mirror")
    read = lambda seed, buffer: [r["text"] for r in hub.stream(path, None, "train", seed, buffer)]  # noqa: E731
    in_order, a = read(0, 0), read(0, 16)
    assert a == read(0, 16) and a != in_order and sorted(a) == sorted(in_order) and len(set(a)) == 60
    assert read(1, 16) != a and a[:10] != in_order[:10]
    docs = list(corpus.hf_docs(path, None, "train", "text", 10, 0.0, seed=0, shuffle_buffer=16))
    assert [d[1] for d in docs] == a[:10]


def test_only_the_corpus_stage_reads_the_stdlib(tmp_path, monkeypatch):
    """The corpus stage writes the object table and what it read; SFT and pair data come from that table
    alone: with the interpreter's stdlib unreadable they still build."""
    _, _, stats = run_stage(tmp_path, "-S", "corpus.max_docs=50")
    objects_file = tmp_path / "corpus" / "objects.parquet"
    read = stats["read"]
    assert read["python"].count(".") == 2 and read["objects"] > 3000 and len(read["objects_digest"]) == 16
    from speedrun.data import docstrings, sft
    assert len(docstrings.load_objects(objects_file)) == read["objects"]

    def unreadable(*args, **kwargs):
        raise AssertionError("read the interpreter's stdlib")
    monkeypatch.setattr(docstrings, "collect", unreadable)
    monkeypatch.setattr(docstrings, "stdlib_dir", unreadable)
    sft.embedded_qa.cache_clear()
    convs = sft.embedded_conversations(objects_file, 0.1, 0.1, seed=0, per_object=1)
    assert len(convs["train"]) > 1000
    call_stage("download_pairs", "-S", "pairs.only=[embedded]", "-S", "pairs.limit_per_source=100", "--objects",
               objects_file, "--out-dir", tmp_path / "pairs")
    assert 90 <= len(pd.read_parquet(tmp_path / "pairs" / "pairs.parquet")) <= 100  # 100 rows read, some skipped
    sft.embedded_qa.cache_clear()
    import pathlib
    stage_sources = {p.name: p.read_text() for p in (pathlib.Path(__file__).parents[1] / "stages").glob("*.py")}
    readers = {n for n, text in stage_sources.items()
               if "import collect" in text or ", collect" in text or "speedrun.data.stdlib" in text}
    assert readers == {"corpus.py"}  # the object table, and the pin of what it read


def test_another_python_repins_the_corpus(tmp_path):
    """DVC cannot see the interpreter: the corpus stage depends on a git-tracked pin of the stdlib files it reads, and
    rewrites it only when the running Python's differs (then DVC records the new pin). The pin moves with the content
    of the files read, not with a skipped test suite."""
    from speedrun.data.stdlib import pin_interpreter
    lib, pin = tmp_path / "lib", tmp_path / "interpreter.json"
    (lib / "json").mkdir(parents=True)
    (lib / "tests").mkdir()
    (lib / "json" / "__init__.py").write_text('"""JSON."""')
    (lib / "tests" / "test_json.py").write_text("pass")
    assert pin_interpreter(pin, lib) == {}  # no pin yet: this one is written
    first = json.loads(pin.read_text())
    assert first["stdlib_files"] == 1 and first["python"].count(".") == 2
    stamp = pin.stat().st_mtime_ns
    (lib / "tests" / "test_json.py").write_text("pass  # a test suite: not read")
    assert pin_interpreter(pin, lib) is None and pin.stat().st_mtime_ns == stamp  # same stdlib: file untouched
    (lib / "json" / "__init__.py").write_text('"""JSON, another Python."""')
    assert pin_interpreter(pin, lib) == first
    assert json.loads(pin.read_text())["stdlib_digest"] != first["stdlib_digest"]
    import pathlib
    stages = yaml.safe_load((pathlib.Path(__file__).parents[1] / "dvc.yaml").read_text())["stages"]
    assert "data/interpreter.json" in stages["corpus"]["deps"]
    assert not any(s.get("always_changed") for s in stages.values())  # a no-op `dvc repro` runs nothing
