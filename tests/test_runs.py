"""speedrun.runs: a track's GRPO runs are one DVC stage each, trained side by side on CPU by the first stale one and
installed from scratch by the others; a failed run stops the stage, named; no run outlives its runner, however it dies.
(A new seed trains only its runs, and the runs' bytes against a run by hand: the end-to-end test.)"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from conftest import REPO
from speedrun import common, params, runs


def test_runs_go_side_by_side_only_on_cpu_in_one_process_each(monkeypatch):
    monkeypatch.setattr(common, "usable_cores", lambda: 8)
    assert common.runs_at_once(1, 1, "cpu") == 8 and common.runs_at_once(2, 1, "cpu") == 4
    assert common.runs_at_once(16, 1, "cpu") == 1  # more threads than cores: one at a time
    assert common.runs_at_once(0, 1, "cpu") == 1  # torch's default threads: one at a time, as DVC would
    assert common.runs_at_once(1, 2, "cpu") == 1 and common.runs_at_once(1, 1, "cuda") == 1


def test_a_stage_read_from_its_source_names_what_its_module_does():
    """An install reads the stage's names from its source (speedrun.stage.stage_spec), not by importing it: the same
    docstring, READS, PATHS and IDS as the module, for every stage."""
    import importlib
    from speedrun.cli import STAGES
    from speedrun.stage import stage_spec
    for name in STAGES:
        mod, spec = importlib.import_module(f"stages.{name}"), stage_spec(REPO / "stages" / f"{name}.py")
        assert (spec.__doc__, spec.READS, spec.PATHS, spec.IDS, spec.__name__) == (
            mod.__doc__, mod.READS, mod.PATHS, getattr(mod, "IDS", None), mod.__name__), name


def test_the_install_path_imports_no_torch():
    """What an installing run's process imports (the CLI, the runner, the command line, params) leaves torch out: its
    import is most of a second of every such stage."""
    code = "import sys, speedrun.cli, speedrun.runs, speedrun.stage; print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert res.stdout.strip() == "False", res.stdout + res.stderr


def test_the_run_list_is_the_tracks_arms_by_seeds():
    p = params.load(REPO / "params.yaml", ["task.run=[checker, density]", "task.seeds=[3, 1]"])
    assert runs.run_list(p, "task_grpo") == [("checker", 3), ("checker", 1), ("density", 3), ("density", 1)]
    assert runs.run_list(p, "grpo") == [(v, s) for v in p.grpo.run for s in p.grpo.seeds]


def test_a_runs_key_moves_with_its_own_settings_and_deps_only(tmp_path, monkeypatch):
    """The key hashes what the run reads: its arm's settings and the shared ones, not another arm's nor the seed
    list (adding a seed leaves every other run's key, so its result, as it was)."""
    import importlib
    mod = importlib.import_module("stages.task_grpo")
    monkeypatch.chdir(tmp_path)  # no dvc.yaml: the run's input files and the code
    for name in ("task_sft", "task_rm", "tokenizer"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.pt").write_bytes(name.encode())
    io = SimpleNamespace(sft_dir=tmp_path / "task_sft", rm_dir=tmp_path / "task_rm",
                         tokenizer_dir=tmp_path / "tokenizer", items=tmp_path / "task_sft/model.pt",
                         out_dir=tmp_path / "o", metrics=tmp_path / "m.json")
    key = lambda *s, ids={"arm": "checker", "seed": 1}: runs.run_key(  # noqa: E731
        mod, params.load(REPO / "params.yaml", list(s)), ids, io)
    io.items = tmp_path / "task_sft/model.pt"
    base = key()
    assert key("task.seeds=[1, 2, 3]") == base and key("task.variants.density.sampling=uniform") == base
    assert key("task.train.lr=0.001") != base and key("beta=0.5") != base
    assert key(ids={"arm": "checker", "seed": 2}) != base
    (tmp_path / "task_rm/model.pt").write_bytes(b"another reward model")
    assert key() != base
    # in a DVC workspace, the deps dvc.yaml declares for the stage: what DVC itself reruns a run for
    (tmp_path / "dvc.yaml").write_text("stages:\n  task_grpo:\n    deps: [task_sft/model.pt]\n")
    base = key()
    (tmp_path / "task_rm/model.pt").write_bytes(b"an input dvc.yaml does not list")
    assert key() == base
    (tmp_path / "task_sft/model.pt").write_bytes(b"another SFT model")
    assert key() != base


def test_a_sibling_is_trained_only_when_certainly_stale(tmp_path):
    io = SimpleNamespace(out_dir=tmp_path / "outs/task_grpo/checker_s1", metrics=tmp_path / "checker_s1.json")
    assert runs.certainly_stale("k1", io)  # no output: stale
    io.out_dir.mkdir(parents=True)
    assert runs.certainly_stale("k1", io)  # no metrics: stale
    common.write_json(io.metrics, {"steps": 2})
    assert not runs.certainly_stale("k1", io)  # metrics no batch stamped (a run by hand): left to its own stage
    common.write_json(io.metrics, {"steps": 2, "run_key": "k0"})
    assert runs.certainly_stale("k1", io) and not runs.certainly_stale("k0", io)


def test_a_failed_run_stops_the_stage_naming_it_and_its_command(tmp_path):
    """No task SFT model here: the run fails; the stage exits non-zero with the run's output and the command that
    reruns it alone, -S overrides included."""
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    res = subprocess.run([sys.executable, "-m", "speedrun", "task_grpo", "--arm", "checker", "--seed", "7",
                          "-S", "task.run=[checker,density]", "-S", "task.seeds=[7]"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO}:{REPO / 'src'}", "DVC_STAGE": "t"})
    assert res.returncode != 0
    assert "task_grpo: training checker_s7, density_s7 on cpu" in res.stdout, res.stdout
    assert "No such file or directory" in res.stdout, res.stdout
    assert re.search(r"task_grpo: run (checker|density)_s7 failed \(exit 1\); .* Rerun it alone: python -m "
                     r"stages.task_grpo --arm (checker|density) --seed 7 -S task.run=\[checker,density\] "
                     r"-S task.seeds=\[7\] --out-dir \S+ --metrics \S+$", res.stderr.strip()), res.stderr


def sleeper(tmp_path, name: str, seconds: float, code: int = 0) -> tuple[str, list[str], object]:
    entry = tmp_path / name
    entry.mkdir()
    return name, [sys.executable, "-c", f"import sys, time; time.sleep({seconds}); sys.exit({code})"], entry


def test_no_run_outlives_a_failed_one(monkeypatch, tmp_path):
    """One run fails while another is still going: the stage stops it before exiting."""
    started = []
    real_start = runs.start
    monkeypatch.setattr(runs, "start", lambda cmd, log, main=None: started.append(real_start(cmd, log)) or started[-1])
    with pytest.raises(SystemExit, match="run bad_s1 failed \\(exit 3\\)"):
        runs.run_all("task_grpo", [sleeper(tmp_path, "slow_s1", 60), sleeper(tmp_path, "bad_s1", 0, 3)], 2, tmp_path)
    assert len(started) == 2 and started[0].poll() is not None  # the slow run was killed, not left running
    assert not (tmp_path / "slow_s1" / "done").exists()


FORKED_MAIN = "def main(argv):\n    import time; time.sleep(120)\n"  # a forked run's stage: sleeps


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("forked", [False, True], ids=["started", "forked"])
def test_a_runner_killed_by_sigkill_leaves_no_run_alive(tmp_path, forked):
    """SIGKILL (as an out-of-memory kill) runs no clean-up in the runner: its runs die all the same, whether each
    started afresh or forked from the runner (how a GRPO batch starts its runs)."""
    code = ("import sys, pathlib; from speedrun import runs\n" + FORKED_MAIN +
            "jobs = [(f'r{i}_s1', [sys.executable, '-c', 'import time; time.sleep(120)'], pathlib.Path(sys.argv[1]))"
            " for i in range(2)]\n"
            f"runs.run_all('grpo', jobs, 2, pathlib.Path(sys.argv[1]), {'main' if forked else None})")
    runner = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env={**os.environ,
                              "PYTHONPATH": str(REPO / "src")})
    children = []
    for _ in range(200):  # until both runs have started
        children = [int(c) for c in subprocess.run(["pgrep", "-P", str(runner.pid)], capture_output=True,
                                                      text=True).stdout.split()]
        if len(children) == 2:
            break
        time.sleep(0.05)
    assert len(children) == 2
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(alive(pid) for pid in children):
        time.sleep(0.05)
    assert not any(alive(pid) for pid in children), "a run outlived its SIGKILLed runner"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_stage_behind_a_shell_dies_with_what_started_the_shell(tmp_path):
    """DVC runs a stage as `/bin/sh -c <cmd>` when SHELL is unset (as on CI), and dash does not exec the command: the
    shell stays between DVC and the stage. SIGKILL to DVC (here: the launcher) leaves the shell alive, so the stage
    watches the shell's parent as well (common.die_with_parent), and ends within a second."""
    stage = (f"{sys.executable} -c 'from speedrun.common import die_with_parent; die_with_parent(); "
             f"open(\"{tmp_path}/up\", \"w\").close(); import time; time.sleep(120)'; true")  # `; true`: no exec
    launcher = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.call(['sh', '-c', "
                                 "sys.argv[1]]); import time; time.sleep(120)", stage],
                                env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    deadline = time.time() + 60
    while not (tmp_path / "up").exists():
        assert time.time() < deadline and launcher.poll() is None
        time.sleep(0.05)
    shell = int(subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split()[0])
    stage_pid = int(subprocess.run(["pgrep", "-P", str(shell)], capture_output=True, text=True).stdout.split()[0])
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    deadline = time.time() + 1.0
    while time.time() < deadline and (alive(stage_pid) or alive(shell)):
        time.sleep(0.05)
    assert not alive(stage_pid), "the stage outlived what started its shell"
    assert not alive(shell), "the shell outlived its stage"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has exited; its parent (init) reaps it
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked runs are Linux's")
def test_a_forked_run_reports_as_a_started_one(tmp_path):
    """A forked run (the stage's command line called in a fork of the runner) prints into its own log, which the
    runner shows; its SystemExit message and code stop the stage, naming it, as a started run's would."""
    code = ("import sys, pathlib; from speedrun import runs\n"
            "def main(argv):\n"
            "    print('run argv', argv)\n"
            "    if 'bad' in argv: sys.exit('bad settings: the run stops')\n"
            "root = pathlib.Path(sys.argv[1])\n"
            "jobs = [(n, [sys.executable, '-m', 'stages.grpo', n], root / n) for n in ('ok_s1', 'bad')]\n"
            "[j[2].mkdir() for j in jobs]\n"
            "runs.run_all('grpo', jobs, 1, root, main)\n")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert res.returncode == 1 and "grpo: run bad failed (exit 1)" in res.stderr, res.stdout + res.stderr
    assert "--- [1/2] ok_s1" in res.stdout and "run argv ['ok_s1']" in res.stdout  # the ok run's log, once
    assert res.stdout.count("run argv") == 2 and "bad settings: the run stops" in res.stdout
    assert (tmp_path / "ok_s1" / "done").exists() and not (tmp_path / "bad" / "done").exists()


def test_a_second_runner_of_a_track_refuses_naming_the_first(tmp_path):
    """Two runners never train into (or remove) the same scratch entries: the second stops with one line naming the
    first; once the first has ended (its lock dropped with it), a runner takes the track."""
    first = runs.hold_track(tmp_path / "grpo", "grpo")
    with pytest.raises(SystemExit) as e:
        runs.hold_track(tmp_path / "grpo", "grpo")
    assert str(e.value).startswith(f"error: grpo: process {os.getpid()} (") and "is training" in str(e.value)
    first.close()
    runs.hold_track(tmp_path / "grpo", "grpo").close()
