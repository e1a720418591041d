"""dvc.yaml lists, for every stage, the code it runs: its stage script and every module of `speedrun` that script
imports, directly or through other modules. A missing one would let DVC call a stale artifact up to date."""
import ast
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import yaml
import pytest

from conftest import REPO

SRC = REPO / "src"


def module_file(name: str) -> Path | None:
    """The file of a dotted module name under src/ or the repo root (stages.*), or None if it is not ours."""
    for root in (SRC, REPO):
        base = root.joinpath(*name.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
    return None


def imported_files(path: Path) -> set[Path]:
    """Our modules imported by one file (`from speedrun.x import y` also counts speedrun/x/y.py if y is a module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name.split(".")[0] in ("speedrun", "stages") and (f := module_file(name)):
                out.add(f)
    return out


COMPANIONS = {SRC / "speedrun" / "kernels.py": {SRC / "speedrun" / f for f in  # the C++ a module builds
                                                ("cpu_attention.cpp", "cpu_kernels.cpp", "cpu_kernels.h")}}


def transitive(path: Path) -> set[Path]:
    seen, todo = set(), [path]
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo.extend(imported_files(f))
    seen |= set().union(*(COMPANIONS.get(f, set()) for f in seen))
    return {f for f in seen if f.name != "__init__.py" or has_code(f)}


PLUMBING = {SRC / "speedrun" / "__init__.py"}  # picks which checkout's modules load; computes nothing


def has_code(path: Path) -> bool:
    """A package __init__ holding only its docstring (or import plumbing) runs nothing a stage depends on."""
    if path in PLUMBING:
        return False
    body = ast.parse(path.read_text()).body
    return any(not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) for n in body)


def stage_specs() -> dict[str, dict]:
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    return {name: spec.get("do", spec) for name, spec in stages.items()}


def stage_modules(spec: dict) -> list[str]:
    """The modules a cmd (`speedrun <stage> ...`) runs: the command line's, a track's runner, and the stage's own."""
    stage = spec["cmd"].split()[1]
    return ["speedrun.cli", "speedrun.stage", *(["speedrun.runs"] if stage in ("grpo", "task_grpo") else []),
            f"stages.{stage}"]


def test_every_stage_declares_the_code_it_imports():
    missing = []
    for name, spec in stage_specs().items():
        deps = [REPO / d for d in spec.get("deps", []) if "${" not in d]
        for f in sorted(set().union(*(transitive(module_file(m)) for m in stage_modules(spec)))):
            if not any(f == d or d in f.parents for d in deps):
                missing.append(f"stage {name}: {f.relative_to(REPO)} is imported but not in its deps")
    assert not missing, "\n".join(missing)


def test_every_stage_waits_for_the_params_check():
    """DVC orders stages by their deps: depending on preflight's output is what makes the check run first."""
    late = [name for name, spec in stage_specs().items()
            if name != "preflight" and "outs/preflight.txt" not in spec.get("deps", [])]
    assert not late, f"stages that could start before params.yaml is checked: {late}"


def test_the_checker_sees_indirect_imports():
    files = {f.relative_to(REPO).as_posix() for f in transitive(REPO / "stages/grpo.py")}
    # stages/grpo.py -> speedrun.rl.trainer -> speedrun.engine -> speedrun.model
    assert {"stages/grpo.py", "src/speedrun/rl/trainer.py", "src/speedrun/engine.py", "src/speedrun/model.py",
            "src/speedrun/cpu_kernels.cpp", "src/speedrun/cpu_attention.cpp", "src/speedrun/cpu_kernels.h"} <= files


def test_the_committed_lock_names_only_stages_of_dvc_yaml(tmp_path):
    """DVC keeps a removed stage's entry in dvc.lock: a stale entry would describe artifacts no stage makes."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, DVC_SITE_CACHE_DIR=str(tmp_path), DVC_NO_ANALYTICS="1")
    res = subprocess.run([sys.executable, "-m", "dvc", "stage", "list", "--name-only"], cwd=REPO, env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    locked = set(yaml.safe_load((REPO / "dvc.lock").read_text())["stages"])
    assert locked <= set(res.stdout.split()), sorted(locked - set(res.stdout.split()))


def test_a_stage_imports_the_library_of_its_own_copy_of_the_repo(tmp_path):
    """A queued experiment's copy of the repo runs its own src/speedrun, not the one the editable install names."""
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "__init__.py").write_text((REPO / "stages" / "__init__.py").read_text())
    (tmp_path / "src" / "speedrun").mkdir(parents=True)
    (tmp_path / "src" / "speedrun" / "__init__.py").write_text("")
    code = "import stages, speedrun; print(speedrun.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()).resolve() == (tmp_path / "src" / "speedrun" / "__init__.py").resolve()


def test_every_path_a_stage_touches_is_declared_in_dvc_yaml():
    """A stage's PATHS (its default files) lie in its dvc.yaml deps, outs, metrics or plots: the path itself, a file
    or folder above it, or a folder whose declared files it reads (outs/sft for outs/sft/model.pt); scratch/ is the
    only undeclared place. A new input that skips dvc.yaml would leave DVC blind to its changes."""
    import importlib
    import re

    def norm(path: str) -> str:  # {arm}_s{seed} and ${item.arm}_s${item.seed} alike
        return re.sub(r"\$?\{[^}]*\}", "*", str(path)).rstrip("/")

    missing = []
    for name, spec in stage_specs().items():
        module = importlib.import_module(stage_modules(spec)[-1])
        declared = [norm(next(iter(e)) if isinstance(e, dict) else e)
                    for key in ("deps", "outs", "metrics", "plots") for e in spec.get(key) or []]
        for key, value in module.PATHS.items():
            for path in (value if isinstance(value, list) else [value]):
                p = norm(path)
                if path is None or p.startswith("scratch/"):
                    continue
                if not any(p == d or p.startswith(d + "/") or d.startswith(p + "/") for d in declared):
                    missing.append(f"stage {name}: --{key.replace('_', '-')} {path} is in no dvc.yaml entry")
    assert not missing, "\n".join(missing)


def test_the_speedrun_command_runs_the_library_of_the_checkout_it_starts_in(tmp_path):
    """`speedrun <stage>` from a copy of the repo (console script, editable install naming another tree) imports the
    copy's src/speedrun modules."""
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "src" / "speedrun").mkdir(parents=True)
    (tmp_path / "src" / "speedrun" / "__init__.py").write_text((SRC / "speedrun" / "__init__.py").read_text())
    (tmp_path / "src" / "speedrun" / "only_here.py").write_text("WHERE = 'the copy'\n")
    code = f"import sys; sys.path.insert(0, {str(SRC)!r}); import speedrun.only_here as m; print(m.WHERE, m.__file__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["the", "copy"] and str(tmp_path) in out.stdout, out.stdout


@pytest.mark.slow
def test_a_queued_experiment_runs_and_hashes_the_code_it_was_queued_with(tmp_path):
    """`dvc exp run --queue`, then an edit to the workspace's src/ before `dvc queue start`: the queued stage runs the
    code committed with it (its own copy's), and the experiment's dvc.lock holds that code's md5."""
    from conftest import dvc, git, make_pipeline_repo, run_queue
    repo = make_pipeline_repo(tmp_path / "repo", {})
    dag = yaml.safe_load((repo / "dvc.yaml").read_text())
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"preflight": dag["stages"]["preflight"]}}))
    stage_py = repo / "src" / "speedrun" / "stage.py"
    stage_py.write_text(stage_py.read_text() + "\nprint('code-version: queued', flush=True)\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the preflight stage, code version 'queued'")
    queued_md5 = hashlib.md5(stage_py.read_bytes()).hexdigest()
    dvc(repo, "exp", "run", "--queue", "-n", "q1", "-S", "seed=7")
    stage_py.write_text(stage_py.read_text().replace("code-version: queued", "code-version: edited"))  # the workspace
    status = run_queue(repo)
    assert "Success" in status, status
    logs = dvc(repo, "queue", "logs", "q1")
    assert "code-version: queued" in logs and "code-version: edited" not in logs, logs
    dvc(repo, "exp", "branch", "q1", "q1-branch")
    lock = yaml.safe_load(subprocess.run(["git", "show", "q1-branch:dvc.lock"], cwd=repo, capture_output=True,
                                         text=True, check=True).stdout)
    deps = {d["path"]: d["md5"] for d in lock["stages"]["preflight"]["deps"]}
    assert deps["src/speedrun/stage.py"] == queued_md5


def test_the_library_imports_down_its_floors():
    """rl/ (training) imports nothing from eval/ (reading models): what both use, the prompt embeddings and their
    sentence encoder, lives a floor down (speedrun.embeddings, speedrun.minilm)."""
    up = [f"{f.relative_to(REPO)} imports {g.relative_to(REPO)}" for f in sorted((SRC / "speedrun" / "rl").glob("*.py"))
          for g in imported_files(f) if (SRC / "speedrun" / "eval") in g.parents]
    down = [f"{g.relative_to(REPO)} imports {f.relative_to(REPO)}" for g in (SRC / "speedrun" / "embeddings.py",
            SRC / "speedrun" / "minilm.py") for f in imported_files(g) if f.parent != SRC / "speedrun"]
    assert not up and not down, up + down
