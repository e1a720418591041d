"""A track's GRPO runs: one DVC stage each (`grpo@density-1`, `task_grpo@checker-2`), still side by side on CPU.

DVC runs one stage at a time, and at these small shapes two runs on a core each end 1.4-1.5x sooner than in turn
(bench/parallel_runs.py). So the first stale run of a track that DVC starts also trains, beside itself, every other
run of the track that is certainly stale (its output missing, or its metrics stamped with another key), each into
scratch/runs/<stage>/<key>/; when DVC reaches those runs' own stages, each finds its result under its key and
installs it in a second. The key hashes what DVC reruns a run for: its params (the stage's StageView), its ids and
its dvc.yaml deps. A run's bytes do not depend on what runs beside it (compute.run_threads fixes its threads), so a
run trained beside another is the run trained alone. DVC keeps its per-run cache: adding a seed trains that seed's
runs only, and a run whose settings and inputs are unchanged is restored, never retrained. Each run is a child
process (on Linux a fork of the runner, whose imports are done once) that dies with its runner, however the runner
dies (PR_SET_PDEATHSIG), and writes only under its key: no stale run can reach outs/. On a GPU, under torchrun or
with run_threads 0 a stage trains its own run only, in its own process."""
from __future__ import annotations

import fcntl
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Callable

import yaml

from speedrun import params as params_lib
from speedrun.common import die_with_parent, files_digest, pick_device, read_json, runs_at_once, stable_hash, write_json
from speedrun.params import Params, StageView
from speedrun.stage import reads_for, run_stage

TRACKS = {"grpo": "grpo", "task_grpo": "task"}  # stage: its params section; a run is (--arm, --seed)
SCRATCH = Path("scratch/runs")


def run_list(p: Params, stage: str) -> list[tuple[str, int]]:
    """(arm, seed) for every run of the track: arm by arm, so runs side by side are alike in length."""
    section = params_lib.value_at(p, TRACKS[stage])
    return [(name, seed) for name in section.run for seed in section.seeds]


def default_io(mod: ModuleType | SimpleNamespace, ids: dict[str, Any]) -> SimpleNamespace:
    """A run's files in the DVC layout."""
    return SimpleNamespace(**{k: Path(v.format(**ids)) if isinstance(v, str) else v for k, v in mod.PATHS.items()})


def dag_deps(stage: str) -> list[Path]:
    """The files dvc.yaml's stage declares as deps (code and inputs; the same for every run of the track)."""
    spec = yaml.safe_load(Path("dvc.yaml").read_text())["stages"][stage] if Path("dvc.yaml").is_file() else {}
    return [Path(d) for d in spec.get("deps", []) if "${" not in d]


def run_key(mod: ModuleType | SimpleNamespace, p: Params, ids: dict[str, Any], io: SimpleNamespace) -> str:
    """What DVC reruns a run for: its params (the stage's StageView), its ids and its deps (dvc.yaml's; else the
    run's input files and the code)."""
    deps = dag_deps(mod.__name__.rsplit(".", 1)[-1]) or [
        *(v for k, v in vars(io).items() if k not in ("out_dir", "metrics")), Path(mod.__file__),
        *sorted(Path(params_lib.__file__).parent.rglob("*.py"))]
    view = StageView(p, reads_for(mod.READS, ids))
    return stable_hash(mod.__name__, json.dumps(ids, sort_keys=True), view.digest(), files_digest(*deps), n_hex=24)


def certainly_stale(key: str, io: SimpleNamespace) -> bool:
    """A sibling run to train now: its output or metrics are missing, or they are of another key (the key a batch
    wrote into the metrics, which DVC checks out and git keeps together with the output). Metrics without a key
    (written by a run by hand) may be current: left to the run's own stage."""
    if not io.out_dir.exists() or not io.metrics.is_file():
        return True
    stamped = read_json(io.metrics).get("run_key")
    return stamped is not None and stamped != key


def start(cmd: list[str], log, main: Callable[[list[str]], None] | None = None) -> subprocess.Popen | Forked:
    """A run as a child the runner owns: in its process group, killed if the runner dies (Linux). With `main` (a
    stage's command line in this process, on Linux) the child is a fork of the runner that calls main(cmd[3:])
    instead of starting `python -m stages.<stage>` afresh: it skips the interpreter's start and the imports (torch,
    the stage's code; about 2.5 s a run), already done here."""
    linux = sys.platform.startswith("linux")
    if main is not None and linux:
        return Forked(main, cmd[3:], log)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent if linux else None)


class Forked:
    """A forked run with Popen's poll/kill/wait/returncode. The child writes to `log`, exits with the stage's code
    (a SystemExit's message printed as Python prints it) and never returns into the runner (os._exit)."""

    def __init__(self, main: Callable[[list[str]], None], argv: list[str], log):
        sys.stdout.flush()  # what the runner printed is not the child's to print again
        sys.stderr.flush()
        parent, self.returncode = os.getpid(), None
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                if os.getppid() != parent:  # the runner died before the fork returned
                    os._exit(1)
                die_with_parent()
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                sys.stdout, sys.stderr = (open(fd, "w", buffering=1, closefd=False) for fd in (1, 2))  # not a wrapper
                main(argv)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (print(e.code, file=sys.stderr) or 1)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


def run_all(stage: str, jobs: list[tuple[str, list[str], Path]], width: int, tmp: Path,
            main: Callable[[list[str]], None] | None = None) -> None:
    """Keep `width` runs going until every run has ended, each marking its entry done; the first failure kills the
    rest and exits, naming the run and the command that reruns it alone. `main`: forked runs (start)."""
    pending, live, done, t_start = list(jobs), {}, 0, time.perf_counter()
    try:
        while pending or live:
            while pending and len(live) < width:
                run, cmd, entry = pending.pop(0)
                log = (tmp / f"{run}.log").open("w+")
                live[run] = (start(cmd, log, main), log, cmd, entry)
            time.sleep(0.05)
            for run, (proc, log, cmd, entry) in list(live.items()):
                if proc.poll() is None:
                    continue
                del live[run]
                log.seek(0)
                out = log.read().rstrip()
                log.close()
                if proc.returncode != 0:
                    print(out[-6000:], flush=True)
                    sys.exit(f"{stage}: run {run} failed (exit {proc.returncode}); its output is above. Rerun it "
                             f"alone: python {' '.join(cmd[1:])}")
                (entry / "done").write_text("")
                done += 1
                print(f"--- [{done}/{len(jobs)}] {run}, {time.perf_counter() - t_start:.0f} s into the stage\n{out}",
                      flush=True)
    finally:  # a failed run or an interrupt: no run outlives the stage
        for proc, log, *_ in live.values():
            proc.kill()
            proc.wait()
            log.close()


def install(key: str, entry: Path, io: SimpleNamespace) -> None:
    """Move a finished run from its scratch entry into the stage's outputs, its metrics stamped with its key."""
    if io.out_dir.exists():
        shutil.rmtree(io.out_dir)
    io.out_dir.parent.mkdir(parents=True, exist_ok=True)
    os.replace(entry / "out", io.out_dir)  # one filesystem: scratch/ and outs/ are both in the workspace
    write_json(io.metrics, {**read_json(entry / "metrics.json"), "run_key": key})
    shutil.rmtree(entry)


def hold_track(root: Path, stage: str):
    """An exclusive lock on the track's scratch entries (scratch/runs/<stage>/.lock), held until this process and the
    runs it forked have ended (the kernel drops it then, however they end). A second runner of the track refuses,
    naming the first: two runners never train into, or remove, the same entries."""
    root.mkdir(parents=True, exist_ok=True)
    lock = (root / ".lock").open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        sys.exit(f"error: {stage}: {holder} is training this track's runs in {root}; wait for it to end, or stop it, "
                 "then rerun")
    lock.truncate(0)
    lock.write(f"process {os.getpid()} ({' '.join(sys.argv)[:200]})")
    lock.flush()
    return lock


def _passthrough(argv: list[str]) -> tuple[list[str], Path | None]:
    """The -S overrides (as `-S k=v` pairs) and --params of a command line: every run of the batch gets them."""
    sets, params, it = [], None, iter(argv)
    for a in it:
        if a in ("-S", "--set"):
            sets += [a, next(it, "")]
        elif a.startswith("--set="):
            sets += ["-S", a.split("=", 1)[1]]
        elif a == "--params":
            params = Path(next(it, ""))
        elif a.startswith("--params="):
            params = Path(a.split("=", 1)[1])
    return sets, params


def batch(stage: str, argv: list[str], spec: SimpleNamespace) -> None:
    """`speedrun grpo|task_grpo --<id> NAME --seed S`: this run from scratch if a batch trained it, else trained now,
    beside the track's other certainly stale runs. `spec`: the stage module's names (speedrun.stage.stage_spec), so
    that installing a result imports neither the stage nor torch (a second, not three); training imports it."""
    train = lambda *a, **k: importlib.import_module(f"stages.{stage}").main(*a, **k)  # noqa: E731

    def main(view, io, **ids) -> None:
        sets, params_path = _passthrough(argv)
        p = params_lib.load(params_path, sets[1::2])
        own = f"{ids['arm']}_s{ids['seed']}"
        runs = {own: (ids, io)} | {f"{n}_s{s}": ({"arm": n, "seed": s}, default_io(spec, {"arm": n, "seed": s}))
                                   for n, s in run_list(p, stage)}
        root, mine = SCRATCH / stage, vars(io) == vars(default_io(spec, ids))
        keys = {run: run_key(spec, p, i, o) for run, (i, o) in runs.items()} if mine else {}
        if mine and (root / keys[own] / "done").is_file():  # a batch trained it: no need to know the device
            print(f"{stage}: {own} was trained beside an earlier run of the track; installing it", flush=True)
            return install(keys[own], root / keys[own], io)
        width = runs_at_once(p.compute.run_threads, p.compute.nproc, pick_device(p.compute.device))
        if width == 1 or not mine:  # in turn, or files of the user's own: alone
            return train(view, io, **ids)
        pending = [run for run, (i, o) in runs.items() if not (root / keys[run] / "done").is_file()
                   and (run == own or certainly_stale(keys[run], o))]
        if pending == [own]:  # alone: in this process, as by hand (a second process would only cost its start-up)
            train(view, io, **ids)
            write_json(io.metrics, {**read_json(io.metrics), "run_key": keys[own]})
            return
        lock = hold_track(root, stage)  # noqa: F841  (held while this stage lives)
        jobs = []
        for run in pending:
            i, entry = runs[run][0], root / keys[run]
            shutil.rmtree(entry, ignore_errors=True)  # a run killed half way starts over
            entry.mkdir(parents=True)
            cmd = [sys.executable, "-m", f"stages.{stage}", "--arm", i["arm"], "--seed", str(i["seed"]),
                   *sets, *(["--params", str(params_path)] if params_path else []),
                   "--out-dir", str(entry / "out"), "--metrics", str(entry / "metrics.json")]
            jobs.append((run, cmd, entry))
        print(f"{stage}: training {', '.join(r for r, *_ in jobs)} on cpu, {min(width, len(jobs))} at a time, "
              f"{p.compute.run_threads} thread(s) each; each result waits in {root}/<key> for its own stage",
              flush=True)
        mod = importlib.import_module(f"stages.{stage}")  # once, here: each forked run starts with it imported
        if sys.platform.startswith("linux") and len(jobs) > 1:  # a process's first optimizer imports torch._dynamo
            import torch._dynamo  # noqa: F401  (about 1 s): once here, not in every fork (bench/forked_run_startup.py)
        fork_main = lambda a: run_stage(mod.main, mod.__doc__, mod.READS, mod.PATHS, mod.IDS, argv=a)  # noqa: E731
        with tempfile.TemporaryDirectory(prefix=f"{stage}_runs_") as tmp:
            run_all(stage, jobs, width, Path(tmp), fork_main)
        install(keys[own], root / keys[own], io)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"{stage}: terminated"))  # so its runs are stopped too
    run_stage(main, spec.__doc__, spec.READS, spec.PATHS, spec.IDS, argv=argv, name=stage)
