"""Declared families across experiments: Holm over every task-track member, the chat track's own calls listed, and
the committed index equal to what the command renders."""
import json
from pathlib import Path

import pytest

from speedrun import families

REPO = Path(__file__).resolve().parents[1]


def write_task(root: Path, name: str, ps: dict[str, float]) -> None:
    gap = {c: {"gap": {"value": 0.1, "ci_low": -0.1, "ci_high": 0.3, "mde": 0.15, "collapse": 0.5, "p": p}}
           for c, p in ps.items()}
    (root / name / "metrics").mkdir(parents=True)
    (root / name / "metrics/task.json").write_text(json.dumps({"comparisons": gap}))


def test_task_family_is_holm_corrected_across_experiments(tmp_path):
    write_task(tmp_path, "first", {"density:checker": 0.01, "balanced:checker": 0.04})
    write_task(tmp_path, "second", {"density:checker": 0.02})
    (tmp_path / "families.yaml").write_text(
        "task track:\n  kind: task\n  correction: Holm\n  about: x\n  members:\n"
        "    - {experiment: first, comparison: 'density:checker'}\n"
        "    - {experiment: first, comparison: 'balanced:checker'}\n"
        "    - {experiment: second, comparison: 'density:checker'}\n")
    rows = [r for r in families.render(tmp_path).splitlines() if r.startswith("| [")]
    # within "first" alone, 0.04 would be called at Holm x1; across the family of three it is 0.04 (x1 after two
    # smaller ones are rejected at 0.03 and 0.04), while 0.01 x 3 = 0.03 and 0.02 x 2 = 0.04 are called
    assert [r.split("|")[-2].strip() for r in rows] == ["0.030 **called**", "0.040 **called**", "0.040 **called**"]
    write_task(tmp_path, "third", {"density:checker": 0.5})
    (tmp_path / "families.yaml").write_text((tmp_path / "families.yaml").read_text()
                                            + "    - {experiment: third, comparison: 'density:checker'}\n")
    rows = [r for r in families.render(tmp_path).splitlines() if r.startswith("| [")]
    assert rows[0].split("|")[-2].strip() == "0.040 **called**" and "called" not in rows[3]  # re-adjusted
    (tmp_path / "families.yaml").write_text((tmp_path / "families.yaml").read_text()
                                            + "    - {experiment: planned, comparison: 'density:checker'}\n")
    rows = [r for r in families.render(tmp_path).splitlines() if r.startswith("| [")]
    assert "planned, not run yet" in rows[4] and rows[0].split("|")[-2].strip() == "0.040 **called**"  # not counted
    write_task(tmp_path / "planned", "sft_27", {"density:checker": 0.001})  # one upstream model kept, not pooled
    rows = [r for r in families.render(tmp_path).splitlines() if r.startswith("| [")]
    assert "running: 1 upstream models kept, not pooled or read yet" in rows[4]
    assert rows[0].split("|")[-2].strip() == "0.040 **called**"  # a sub-run is not a member's result


def test_chat_family_lists_each_experiments_own_call(tmp_path):
    (tmp_path / "old" / "metrics").mkdir(parents=True)
    block = {"delta": {"ead_1": 0.02, "distinct_2": 0.01}, "ci_low": {"ead_1": 0.01, "distinct_2": -0.01},
             "ci_high": {"ead_1": 0.03, "distinct_2": 0.03}, "verdict": {"ead_1": 1, "distinct_2": 0}}
    (tmp_path / "old" / "metrics/diversity.json").write_text(json.dumps({"density_vs_baseline": block}))
    (tmp_path / "families.yaml").write_text("chat:\n  kind: chat\n  correction: none\n  about: x\n  members:\n"
                                            "    - {experiment: old, comparison: density_vs_baseline}\n")
    with pytest.raises(SystemExit, match="old names no primary"):
        families.render(tmp_path)
    (tmp_path / "families.yaml").write_text((tmp_path / "families.yaml").read_text().replace(
        "density_vs_baseline}", "density_vs_baseline, primary: [ead_1, distinct_2]}"))
    row = [r for r in families.render(tmp_path).splitlines() if r.startswith("| [old]")][0]
    assert "ead_1 +0.020 [+0.010, +0.030]" in row and row.endswith("ead_1 diversity-raising |")


def test_command_line_prints_or_writes_the_tables(tmp_path, monkeypatch, capsys):
    root = tmp_path / families.ROOT
    write_task(root, "first", {"density:checker": 0.01})
    (root / "families.yaml").write_text("task:\n  kind: task\n  correction: holm\n  about: x\n  members:\n"
                                        "    - {experiment: first, comparison: 'density:checker'}\n")
    (root / "README.md").write_text(f"# index\n\n{families.START}\nold\n{families.END}\n\nrest\n")
    monkeypatch.chdir(tmp_path)
    families.main([])  # a success returns: no SystemExit(0)
    assert capsys.readouterr().out == families.render(root) + "\n"
    families.main(["--write"])
    assert (root / "README.md").read_text() == f"# index\n\n{families.render(root)}\n\nrest\n"
    with pytest.raises(SystemExit) as e:
        families.main(["--write", "extra"])
    assert e.value.code == 2 and "Got unexpected extra argument" in capsys.readouterr().err


def test_committed_index_matches_the_command():
    readme = (REPO / "reports/experiments/README.md").read_text()
    if families.START not in readme:
        pytest.fail("reports/experiments/README.md has no family section: run python -m speedrun.families --write")
    section = readme[readme.index(families.START):readme.index(families.END) + len(families.END)]
    assert section == families.render(REPO / "reports/experiments")
