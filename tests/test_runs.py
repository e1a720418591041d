"""stages.runs: a track's GRPO runs side by side on CPU, in turn elsewhere; a failed run stops the stage, named.
(The runs' bytes against a run by hand: the end-to-end test.)"""
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO
from speedrun import common, params
from stages import runs


def test_runs_go_side_by_side_only_on_cpu_in_one_process_each(monkeypatch):
    monkeypatch.setattr(common, "usable_cores", lambda: 8)
    assert common.runs_at_once(1, 1, "cpu") == 8 and common.runs_at_once(2, 1, "cpu") == 4
    assert common.runs_at_once(16, 1, "cpu") == 1  # more threads than cores: one at a time
    assert common.runs_at_once(0, 1, "cpu") == 1  # torch's default threads: one at a time, as DVC would
    assert common.runs_at_once(1, 2, "cpu") == 1 and common.runs_at_once(1, 1, "cuda") == 1


def test_the_run_list_is_the_tracks_arms_by_seeds():
    p = params.load(REPO / "params.yaml", ["task.run=[checker, density]", "task.seeds=[3, 1]"])
    assert runs.run_list(p, "task_grpo") == [("checker", 3), ("checker", 1), ("density", 3), ("density", 1)]
    assert runs.run_list(p, "grpo") == [(v, s) for v in p.grpo.run for s in p.grpo.seeds]


def test_a_failed_run_stops_the_stage_naming_it_and_its_command(tmp_path):
    """No task SFT model here: the run fails; the stage exits non-zero with the run's output and the command that
    reruns it alone, -S overrides included."""
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    res = subprocess.run([sys.executable, "-m", "stages.runs", "task_grpo", "-S", "task.run=[checker,density]",
                          "-S", "task.seeds=[7]"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO}:{REPO / 'src'}"})
    assert res.returncode != 0
    assert "task_grpo: 2 runs on cpu" in res.stdout and "No such file or directory" in res.stdout, res.stdout
    assert re.search(r"task_grpo: run (checker|density)_s7 failed \(exit 1\); .* Rerun it alone: python -m "
                     r"stages.task_grpo --arm (checker|density) --seed 7 -S task.run=\[checker,density\] "
                     r"-S task.seeds=\[7\]$", res.stderr.strip()), res.stderr


def test_no_run_outlives_a_failed_one(monkeypatch, tmp_path):
    """One run fails while another is still going: the stage stops it before exiting."""
    started = []

    def command(stage, name, seed, passthrough):
        code = "import sys; sys.exit(3)" if name == "bad" else "import time; time.sleep(60)"
        return [sys.executable, "-c", code]

    real_popen = subprocess.Popen

    def popen(*a, **k):
        started.append(real_popen(*a, **k))
        return started[-1]

    monkeypatch.setattr(runs, "run_command", command)
    monkeypatch.setattr(runs.subprocess, "Popen", popen)
    with pytest.raises(SystemExit, match="run bad_s1 failed \\(exit 3\\)"):
        runs.run_all("task_grpo", [("slow", 1), ("bad", 1)], 2, [], tmp_path)
    assert len(started) == 2 and started[0].poll() is not None  # the slow run was killed, not left running
