"""An experiment packed into README.md + results.zip reads back by the paths it had: bytes, JSON, parquet, glob,
in-place writes; the zip's bytes depend only on its members."""
import json

import pandas as pd
import pytest

from speedrun import kept


def _experiment(folder):
    (folder / "metrics").mkdir(parents=True)
    (folder / "sft_4/metrics").mkdir(parents=True)
    (folder / "README.md").write_text("# x\n")
    (folder / "task.md").write_text("# report\n")
    (folder / "metrics/task.json").write_text(json.dumps({"a": 1}))
    (folder / "sft_4/metrics/task.json").write_text(json.dumps({"seed": 4}))
    pd.DataFrame({"model": ["task_sft"], "text": ["`13`"]}).to_parquet(folder / "answers.parquet")


def test_a_packed_folder_reads_back_by_the_paths_it_had(tmp_path):
    folder = tmp_path / "exp"
    _experiment(folder)
    before = {p: kept.read_bytes(folder / p) for p in ("task.md", "metrics/task.json", "sft_4/metrics/task.json",
                                                       "answers.parquet")}
    (folder / "figures").mkdir()
    (folder / "figures/metrics.png").write_bytes(b"png")  # replot's, ignored by git: stays out of the zip
    assert kept.pack(folder) == folder / "results.zip"
    assert sorted(f.name for f in folder.iterdir()) == ["README.md", "figures", "results.zip"]  # the rest moved
    assert not (folder / "metrics").exists() and kept.exists(folder / "metrics")  # a folder of members
    assert "figures/metrics.png" not in kept._members(folder / "results.zip")
    assert {p: kept.read_bytes(folder / p) for p in before} == before
    assert kept.read_json(folder / "sft_4/metrics/task.json") == {"seed": 4}
    assert kept.read_parquet(folder / "answers.parquet")["text"].tolist() == ["`13`"]
    assert kept.exists(folder / "sft_4") and kept.exists(folder / "task.md") and not kept.exists(folder / "nope.md")
    assert kept.glob(folder, "sft_*/metrics/task.json") == [folder / "sft_4/metrics/task.json"]
    assert kept.glob(folder / "sft_4", "metrics/*.json") == [folder / "sft_4/metrics/task.json"]  # a sub-folder
    with pytest.raises(FileNotFoundError, match="nope.md: no such file, nor a member of a results.zip"):
        kept.read_bytes(folder / "nope.md")


def test_the_zip_depends_only_on_its_members_and_writes_replace_one(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _experiment(a)
    _experiment(b)
    (b / "task.md").touch()  # another mtime, the same bytes
    assert kept.pack(a).read_bytes() == kept.pack(b).read_bytes()
    kept.write(a / "metrics/task.json", b'{"a": 2}')  # into the zip, no file on disk
    assert kept.read_json(a / "metrics/task.json") == {"a": 2} and not (a / "metrics").exists()
    assert kept.read_bytes(a / "task.md") == b"# report\n"
    kept.write(tmp_path / "loose.json", b"{}")  # no zip above: a plain file
    assert (tmp_path / "loose.json").read_bytes() == b"{}"


def test_a_large_file_stays_beside_the_zip_and_leaves_no_older_copy_in_it(tmp_path):
    folder = tmp_path / "exp"
    _experiment(folder)
    kept.pack(folder)  # the small answers file: a member
    big = bytes(kept.LOOSE_BYTES)
    (folder / "answers.parquet").write_bytes(big)  # kept again, now large: a file on disk
    kept.pack(folder)
    assert (folder / "answers.parquet").read_bytes() == big == kept.read_bytes(folder / "answers.parquet")
    assert "answers.parquet" not in kept._members(folder / "results.zip") and kept.exists(folder / "task.md")


def test_sub_runs_kept_on_their_own_are_found_then_merged_into_their_experiment(tmp_path):
    """An upstream experiment keeps each sub-run as its own README + results.zip (speedrun.experiment); pooling finds
    their members, and packing the experiment moves them into its one zip, unzipped."""
    folder = tmp_path / "exp"
    for s in (4, 5):
        _experiment(folder / f"sft_{s}")
        (folder / f"sft_{s}/metrics/task.json").write_text(json.dumps({"seed": s}))
        kept.pack(folder / f"sft_{s}")
    (folder / "README.md").write_text("# the plan\n")
    found = kept.glob(folder, "sft_*/metrics/task.json")
    assert found == [folder / "sft_4/metrics/task.json", folder / "sft_5/metrics/task.json"]
    assert [kept.read_json(p)["seed"] for p in found] == [4, 5]
    kept.write(folder / "metrics/task.json", b'{"pooled": 1}')  # the pooled metrics, a plain file for now
    kept.pack(folder)
    assert sorted(f.name for f in folder.iterdir()) == ["README.md", "results.zip"]
    members = kept._members(folder / "results.zip")
    assert "sft_4/results.zip" not in members and "sft_4/README.md" in members and "sft_5/answers.parquet" in members
    assert kept.glob(folder, "sft_*/metrics/task.json") == found and kept.read_json(found[1]) == {"seed": 5}
    assert kept.read_json(folder / "metrics/task.json") == {"pooled": 1}


def test_the_command_prints_a_member(tmp_path, capsysbinary):
    folder = tmp_path / "exp"
    _experiment(folder)
    kept.main(["--pack", str(folder)])
    kept.main([str(folder / "task.md")])
    assert capsysbinary.readouterr().out.endswith(b"# report\n")
    with pytest.raises(SystemExit, match="no such file"):
        kept.main([str(folder / "nope.md")])


def test_a_model_kept_elsewhere_drops_from_every_sub_runs_answers(tmp_path):
    """The task SFT model's answers that another experiment keeps byte for byte leave the sub-runs' answers (packed
    or not); the other rows stay as they were, and a model with no rows is refused."""
    folder = tmp_path / "exp"
    for s in (4, 5):
        _experiment(folder / f"sft_{s}")
        pd.DataFrame({"model": ["task_sft", "rm_s1", "task_sft"], "text": ["a", "b", "c"]}).to_parquet(
            folder / f"sft_{s}/answers.parquet")
    kept.pack(folder / "sft_4")  # one sub-run packed, one still files
    assert kept.drop_model(folder, "task_sft") == 4
    for s in (4, 5):
        rows = kept.read_parquet(folder / f"sft_{s}/answers.parquet")
        assert rows.to_dict("list") == {"model": ["rm_s1"], "text": ["b"]}
    with pytest.raises(SystemExit, match="no answers of 'task_sft'"):
        kept.drop_model(folder, "task_sft")
