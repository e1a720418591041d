"""Experiment folders stay small and re-analysable: `speedrun.experiment` keeps a run as a few files with its -S
overrides (no params copy), `speedrun.eval.replot` draws a chat experiment's figures from its metrics, and no
committed experiment holds a PNG or a params.yaml copy."""
import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from speedrun import experiment, kept
from speedrun.eval import replot as replot_cli
from speedrun.eval.replot import replot, result_from_metrics

REPO = Path(__file__).resolve().parents[1]


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_overrides_are_the_changed_keys_as_dvc_arguments():
    base = {"task": {"seeds": [1, 2], "train": {"lr": 0.0003, "steps": 100}}, "beta": 0.04}
    run = {"task": {"seeds": [301, 302], "train": {"lr": 0.0003, "steps": 100}}, "beta": 0.1}
    diff = experiment.overrides(base, run)
    assert diff == {"beta": 0.1, "task.seeds": [301, 302]}
    assert experiment.override_args(diff) == "-S 'beta=0.1' -S 'task.seeds=[301,302]'"


def test_keep_writes_a_few_files_and_the_overrides(tmp_path):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"task": {"seeds": [1, 2], "run": ["checker"]}}))
    folder = tmp_path / "reports/experiments/x"
    with pytest.raises(SystemExit, match="README.md: no such file"):
        experiment.keep(folder, "task", tmp_path)
    folder.mkdir(parents=True)
    (folder / "README.md").write_text("# x\n\n## Plan\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "base")
    git(tmp_path, "add", "params.yaml")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "params")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"task": {"seeds": [301, 302], "run": ["checker"]}}))
    with pytest.raises(SystemExit, match="task.md: no such file"):
        experiment.keep(folder, "task", tmp_path)
    (tmp_path / "reports/metrics/task_grpo").mkdir(parents=True)
    (tmp_path / "reports/task.md").write_text("# report\n")
    (tmp_path / "reports/metrics/task.json").write_text("{}")
    (tmp_path / "reports/metrics/task_grpo/checker_s301.json").write_text(json.dumps({"seed": 301}))
    (tmp_path / "outs/task_eval").mkdir(parents=True)
    pd.DataFrame({"text": ["`13`"]}).to_parquet(tmp_path / "outs/task_eval/answers.parquet")
    with pytest.raises(SystemExit, match=r"runs \['checker_s302'\]"):
        experiment.keep(folder, "task", tmp_path)
    for s in (1, 302):  # checker_s1: the committed run's, left in the workspace: not this experiment's
        (tmp_path / f"reports/metrics/task_grpo/checker_s{s}.json").write_text(json.dumps({"seed": s}))
    written = experiment.keep(folder, "task", tmp_path)
    assert sorted(p.relative_to(folder).as_posix() for p in written) == [
        "answers.parquet", "metrics/task.json", "metrics/task_grpo.json", "task.md"]
    assert sorted(f.name for f in folder.iterdir()) == ["README.md", "results.zip"]  # two files in git
    assert kept.read_json(folder / "metrics/task_grpo.json") == {"checker_s301": {"seed": 301},
                                                                 "checker_s302": {"seed": 302}}
    assert kept.read_parquet(folder / "answers.parquet")["text"].tolist() == ["`13`"]
    readme = (folder / "README.md").read_text()
    assert readme.startswith("# x\n\n## Plan\n\n## Files") and "-S 'task.seeds=[301,302]'" in readme
    bundle = (folder / "results.zip").read_bytes()
    experiment.keep(folder, "task", tmp_path)  # kept again (a rerun): the one Files section is replaced
    assert (folder / "README.md").read_text() == readme and (folder / "results.zip").read_bytes() == bundle


def test_keep_chat_adds_the_full_result_and_every_runs_weights(tmp_path):
    """A chat experiment keeps the evaluation's whole result, the RM's metrics and each run's prompt weights and draws
    in one frame, so the readings of any pair of arms (a manipulation check, a power table) and the RM's held-out
    accuracy recompute from what a clone has."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"grpo": {"seeds": [1], "run": ["density", "baseline"]}}))
    folder = tmp_path / "reports/experiments/x"
    folder.mkdir(parents=True)
    (folder / "README.md").write_text("# x\n\n## Plan\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "params.yaml")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "params")
    (tmp_path / "reports/metrics/grpo").mkdir(parents=True)
    (tmp_path / "reports/report.md").write_text("# report\n")
    (tmp_path / "reports/metrics/diversity.json").write_text("{}")
    (tmp_path / "outs/eval").mkdir(parents=True)
    pd.DataFrame({"response": ["hi"]}).to_parquet(tmp_path / "outs/eval/samples.parquet")
    for arm, weight in (("density", [0.75, 0.25]), ("baseline", [0.5, 0.5])):
        (tmp_path / f"reports/metrics/grpo/{arm}_s1.json").write_text(json.dumps({"seed": 1}))
        (tmp_path / f"outs/grpo/{arm}_s1").mkdir(parents=True)
        pd.DataFrame({"prompt_id": [0, 1], "group": ["a", "b"], "weight": weight, "draws": [3, 1]}).to_parquet(
            tmp_path / f"outs/grpo/{arm}_s1/weights.parquet")
    with pytest.raises(SystemExit, match="result.json: no such file"):
        experiment.keep(folder, "chat", tmp_path)
    (tmp_path / "outs/eval/result.json").write_text(json.dumps({"comparisons": []}))
    with pytest.raises(SystemExit, match="rm.json: no such file"):
        experiment.keep(folder, "chat", tmp_path)
    (tmp_path / "reports/metrics/rm.json").write_text(json.dumps({"by_kind": {"hard": {"acc": 0.75}}}))
    written = experiment.keep(folder, "chat", tmp_path)
    assert sorted(p.relative_to(folder).as_posix() for p in written) == [
        "metrics/diversity.json", "metrics/grpo.json", "metrics/rm.json", "report.md", "result.json",
        "samples.parquet", "weights.parquet"]
    assert kept.read_json(folder / "result.json") == {"comparisons": []}
    assert kept.read_json(folder / "metrics/rm.json")["by_kind"]["hard"]["acc"] == 0.75
    w = kept.read_parquet(folder / "weights.parquet")
    assert w.groupby("run")["weight"].apply(list).to_dict() == {"baseline_s1": [0.5, 0.5], "density_s1": [0.75, 0.25]}
    assert "`weights.parquet`" in (folder / "README.md").read_text()


def test_keep_command_line_checks_the_track_and_the_plan(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        experiment.main(["x", "--track", "nope"])
    assert e.value.code == 2 and "'nope' is not one of 'chat', 'task'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        experiment.main(["x"])
    assert e.value.code == 2 and "Missing option '--track'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="README.md: no such file"):
        experiment.main(["x", "--track", "chat"])


def test_replot_draws_a_chat_experiment_from_its_metrics(tmp_path, capsys):
    runs = {f"grpo_{v}_s{s}": {"reward": 0.1 * s + (v == "density"), "distinct_2": 0.5 + 0.01 * s}
            for v in ("baseline", "density") for s in (1, 2)}
    flat = runs | {"sft": {"reward": 0.0, "distinct_2": 0.6}, "density_vs_baseline": {
        "delta": {"reward": 1.0, "distinct_2": 0.0}, "ci_low": {"reward": 0.5, "distinct_2": -0.1},
        "ci_high": {"reward": 1.5, "distinct_2": 0.1}, "verdict": {"distinct_2": 0}, "mde_share_distinct_2": 0.4}}
    result = result_from_metrics(flat)
    assert result["primary"] == ["distinct_2"] and result["variants"]["density"] == ["grpo_density_s1",
                                                                                      "grpo_density_s2"]
    (c,) = result["comparisons"]
    assert c["per_seed"][2]["reward"] == pytest.approx(1.0) and c["delta"]["distinct_2"]["role"] == "primary"
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics/diversity.json").write_text(json.dumps(flat))
    assert [p.name for p in replot(tmp_path)] == ["metrics.png", "forest_density_vs_baseline.png", "scatter.png"]
    replot_cli.main([str(tmp_path), str(tmp_path)])  # several folders; a success returns: no SystemExit(0)
    assert capsys.readouterr().out.split("\n").count(str(tmp_path / "figures/scatter.png")) == 2
    with pytest.raises(SystemExit) as e:
        replot_cli.main([])
    assert e.value.code == 2 and "Missing argument 'FOLDER'" in capsys.readouterr().err


def test_committed_experiments_are_two_files_with_no_figure_or_params_copy():
    """Each experiment is its README and results.zip, beside an answers file too large to gain from the zip
    (reports/ at most 160 files: the consolidation left 146 and capped 150, reached by the second SmolLM2 pilot);
    no zip holds a figure (replot draws them) or a copy of params.yaml (the README names the commit and the -S
    overrides)."""
    import zipfile
    listed = subprocess.run(["git", "ls-files", "reports"], cwd=REPO, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    files = listed.stdout.split()
    assert len(files) <= 160, len(files)
    experiments = [f.split("/", 3)[2:] for f in files if f.startswith("reports/experiments/") and f.count("/") > 2]
    loose = [rest for rest in experiments if rest[1] not in ("README.md", "results.zip")]  # only large answers
    assert experiments and all(r[1].endswith(".parquet") and (REPO / "reports/experiments" / r[0] / r[1]).stat().st_size
                               >= kept.LOOSE_BYTES for r in loose), loose
    for name in {e[0] for e in experiments if e[1] == "results.zip"}:
        members = zipfile.ZipFile(REPO / "reports/experiments" / name / "results.zip").namelist()
        assert not [m for m in members if m.endswith(".png") or m.endswith("params.yaml")], name
