"""`speedrun`: one Typer command per DVC stage, in DAG order, each the cmd of its dvc.yaml stage; a stage's --help lists
the params.yaml keys it reads by section; run by hand, a stage leaves the git-tracked reports alone."""
import json
import re

import yaml
from typer.testing import CliRunner

from conftest import REPO
from speedrun import cli

runner = CliRunner()


def test_help_lists_every_stage_of_the_dag_in_order_one_line_each():
    res = runner.invoke(cli.app, ["--help"])
    assert res.exit_code == 0, res.output
    listed = [m.group(1) for m in re.finditer(r"^  (\w+)\s{2,}\S", res.output, re.M)]
    assert listed == list(cli.STAGES)
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert list(stages) == list(cli.STAGES)  # every DVC stage is a command, in dvc.yaml's order, and none is extra
    for name, spec in stages.items():
        assert spec.get("do", spec)["cmd"].split()[:2] == ["speedrun", name], spec
    assert all(cli.summary(name) and len(cli.summary(name)) < 200 for name in cli.STAGES)


def test_the_tracks_come_in_one_order_everywhere():
    """The lab's own model, the task track, the chat track, the adversarial cycle: in `speedrun --help` (and
    dvc.yaml, above), the README's DAG table and params.yaml's sections."""
    readme = (REPO / "README.md").read_text().split("## The DAG", 1)[1].split("\n## ", 1)[0]
    rows = [n for line in readme.splitlines() if line.startswith("| `") for n in re.findall(r"`(\w+)", line)[:1]]
    firsts = [s for s in cli.STAGES if s in rows]
    assert [r for r in rows if r in cli.STAGES] == firsts == sorted(firsts, key=cli.STAGES.index)
    sections = list(yaml.safe_load((REPO / "params.yaml").read_text()))
    assert sections.index("sft") < sections.index("task") < sections.index("pairs") < sections.index("grpo") \
        < sections.index("adversarial")


def test_a_stage_help_lists_its_keys_by_section_with_value_and_help(monkeypatch):
    monkeypatch.chdir(REPO)
    res = runner.invoke(cli.app, ["task_grpo", "--help"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "--arm" in out and "-S, --set KEY=VALUE" in out and "--out-dir" in out
    assert "  [task.train]\n    task.train.steps = " in out and "  [compute]\n" in out
    assert max(map(len, out.splitlines())) <= 120  # wrapped, however long a value or help is


def test_a_usage_error_names_the_option_and_exits_2(monkeypatch):
    monkeypatch.chdir(REPO)
    res = runner.invoke(cli.app, ["pretrain", "--arm", "density"])
    assert res.exit_code == 2 and "No such option: --arm" in res.output


def test_a_stage_run_by_hand_keeps_its_tracked_report_out_of_reports(tmp_path, monkeypatch, tiny_corpus):
    """By hand, the tokenizer's metrics go to scratch/by_hand/ unless named; under DVC (DVC_STAGE set), to reports/."""
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_STAGE", raising=False)
    args = ["tokenizer", "--corpus-dir", str(tiny_corpus / "corpus"), "--out-dir", "tok", "--tokens-dir", "tokens",
            "-S", "tokenizer.vocab_size=300"]
    res = runner.invoke(cli.app, args)
    assert res.exit_code == 0, res.output
    assert "by hand: --metrics scratch/by_hand/reports/metrics/tokenizer.json" in res.output
    assert json.loads((tmp_path / "scratch/by_hand/reports/metrics/tokenizer.json").read_text())["vocab_size"] == 300
    assert not (tmp_path / "reports").exists()
    monkeypatch.setenv("DVC_STAGE", "tokenizer")
    assert runner.invoke(cli.app, args).exit_code == 0
    assert (tmp_path / "reports/metrics/tokenizer.json").is_file()



def test_preflight_stops_a_typo_in_the_trained_clusters(tmp_path, monkeypatch):
    """The embedded task's cluster names are checked before any stage runs; a hub task's are its data's (the knob
    does not apply there)."""
    monkeypatch.chdir(REPO)
    # every output in tmp_path: the base links too (run in the repo, they were written into its outs/)
    out = ["--out", str(tmp_path / "preflight.txt"), "--base", str(tmp_path / "b"), "--task-base", str(tmp_path / "t")]
    res = runner.invoke(cli.app, ["preflight", "-S", "task.train_clusters=[numbers,evns]", *out])
    assert res.exit_code != 0 and "task.train_clusters[1]: 'evns' is not a cluster" in res.output
    assert runner.invoke(cli.app, ["preflight", "-S", "task.source=gsm8k", "-S", "task.train_clusters=[c1]",
                                   *out]).exit_code == 0
