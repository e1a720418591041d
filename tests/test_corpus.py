import json

import pandas as pd
import yaml
import pytest

from speedrun.data import corpus
from speedrun.data.docstrings import collect, split_of


def run_stage(tmp_path, *args):
    from typer.testing import CliRunner
    import typer
    from stages.corpus import main

    app = typer.Typer()
    app.command()(main)
    res = CliRunner().invoke(app, [*args, "--out-dir", str(tmp_path / "corpus")])
    assert res.exit_code == 0, res.output + repr(res.exception)
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


def test_embedded_stage_is_deterministic(tmp_path):
    a = run_stage(tmp_path / "a", "--max-docs", "400")
    b = run_stage(tmp_path / "b", "--max-docs", "400")
    for name in ["train.parquet", "val.parquet", "stats.json"]:
        assert (tmp_path / "a/corpus" / name).read_bytes() == (tmp_path / "b/corpus" / name).read_bytes()
    train, val, stats = a
    assert len(train) > 0 and len(val) > 0 and list(train.columns) == ["id", "text", "source"]
    assert stats["docs_in"] == stats["kept"] + sum(stats["skipped"].values())
    assert not set(train["id"]) & set(val["id"])


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
    train, val, stats = run_stage(tmp_path, "--source", "hf", "--hf-path", str(path), "--hf-name", "", "--max-docs", "8",
                                  "--val-frac", "0.0")
    assert stats["docs_in"] == 8 and stats["kept"] == 4
    assert stats["skipped"] == {"duplicate": 1, "empty": 2, "missing": 1}
    assert "Never read" not in " ".join(train["text"])
    assert len(val) == 0


def test_hf_missing_column_names_file_and_row(tmp_path):
    path = tmp_path / "docs.jsonl"
    pd.DataFrame({"content": ["x"]}).to_json(path, orient="records", lines=True)
    with pytest.raises(KeyError, match=r"docs.jsonl row 0: no column 'text'"):
        list(corpus.hf_docs(str(path), None, "train", "text", 10, 0.1))


def test_only_the_corpus_stage_reads_the_stdlib(tmp_path, monkeypatch):
    """The corpus stage writes the object table and what it read; SFT and pair data come from that table
    alone: with the interpreter's stdlib unreadable they still build."""
    _, _, stats = run_stage(tmp_path, "--max-docs", "50")
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
    convs = sft.embedded_conversations(objects_file, 0.1, seed=0, per_object=1)
    assert len(convs["train"]) > 1000
    from typer.testing import CliRunner
    import typer
    from stages.download_pairs import main
    app = typer.Typer()
    app.command()(main)
    res = CliRunner().invoke(app, ["--only", "embedded", "--limit-per-source", "100", "--objects", str(objects_file),
                                   "--out-dir", str(tmp_path / "pairs")])
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert 90 <= len(pd.read_parquet(tmp_path / "pairs" / "pairs.parquet")) <= 100  # 100 rows read, some skipped
    sft.embedded_qa.cache_clear()
    import pathlib
    stage_sources = {p.name: p.read_text() for p in (pathlib.Path(__file__).parents[1] / "stages").glob("*.py")}
    readers = {n for n, text in stage_sources.items()
               if "import collect" in text or ", collect" in text or "speedrun.data.stdlib" in text}
    assert readers == {"corpus.py", "interpreter.py"}  # the object table, and the fingerprint of what it read


def test_another_python_reruns_the_corpus(tmp_path):
    """DVC cannot see the interpreter: the always-running `interpreter` stage writes a fingerprint of the stdlib files
    the corpus reads, and the corpus stage depends on it. The fingerprint moves with those files' content only."""
    from speedrun.data.stdlib import interpreter_fingerprint
    (tmp_path / "json").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "json" / "__init__.py").write_text('"""JSON."""')
    (tmp_path / "tests" / "test_json.py").write_text("pass")
    first = interpreter_fingerprint(tmp_path)
    assert first["stdlib_files"] == 1 and first["python"].count(".") == 2
    (tmp_path / "tests" / "test_json.py").write_text("pass  # a test suite: not read")
    assert interpreter_fingerprint(tmp_path) == first
    (tmp_path / "json" / "__init__.py").write_text('"""JSON, another Python."""')
    assert interpreter_fingerprint(tmp_path)["stdlib_digest"] != first["stdlib_digest"]
    import pathlib
    stages = yaml.safe_load((pathlib.Path(__file__).parents[1] / "dvc.yaml").read_text())["stages"]
    assert stages["interpreter"]["always_changed"] is True
    assert "data/interpreter.json" in stages["corpus"]["deps"]


def test_a_bad_object_table_names_the_row(tmp_path):
    from speedrun.data import docstrings
    df = docstrings.objects_frame(collect()[0][:3])
    df.loc[1, "docstring"] = None
    df.to_parquet(tmp_path / "o.parquet")
    with pytest.raises(ValueError, match="o.parquet row 1"):
        docstrings.load_objects(tmp_path / "o.parquet")
    with pytest.raises(FileNotFoundError, match="dvc repro corpus"):
        docstrings.load_objects(tmp_path / "missing.parquet")
