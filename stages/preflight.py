"""Stage preflight: the whole params.yaml checked before any other stage starts or loses an output. Every other
stage depends on this stage's output, so `dvc repro` and `dvc exp run` run it first whenever any key changes (it
tracks the whole file, keys no stage reads included): every key known, typed and in range (list items too), run ids
that cannot leave the workspace, and the checks across keys (speedrun.params). A failure stops DVC here, in about a
second, naming the key; the output is the same text every time, so passing it reruns nothing downstream.
A local base or task.base (gguf:<file>, hf:<folder>) must exist, and outs/base_checkpoint (outs/task_base_checkpoint)
becomes a link to it: stage base (task_base) depends on that link, so DVC hashes the checkpoint itself and a file
replaced in place reruns the stage (and a missing one stops here, not after DVC has removed its output). Any other
base: a link to outs/preflight.txt. -> outs/preflight.txt, outs/base_checkpoint, outs/task_base_checkpoint"""
import os
from pathlib import Path

from speedrun import params as params_lib
from speedrun.common import write_text
from speedrun.data import task
from speedrun.stage import run_stage

# dvc.yaml tracks all of params.yaml, and run_stage has checked it by the time main runs; READS: the DAG's own checks
READS = ("adversarial.cycles", "base", "task.base", "task.source", "task.train_clusters")
PATHS = {"out": "outs/preflight.txt", "base": "outs/base_checkpoint", "task_base": "outs/task_base_checkpoint"}


def main(p, io) -> None:
    try:
        params_lib.dag_check(p, "params.yaml", task.TEMPLATES)
    except params_lib.ParamsError as e:
        raise SystemExit(f"error: {e}")
    write_text(io.out, "params.yaml checked: every key known, typed and in range; ids; cross-references\n")
    mark_base(io.base, p.base, io.out)
    mark_base(io.task_base, p.task.base, io.out)


def mark_base(path: Path, base: str, fallback: Path) -> None:
    """A link to the local checkpoint a base knob names (which DVC follows and hashes), else to `fallback` (preflight's
    own constant text: the base knob, a params dep of its stage, names the model); replaced atomically. Always a
    link: a git-tracked file that turned into a link conflicts with the stash `dvc exp run` re-applies (DVC 3.67.1)."""
    local = params_lib.base_file(base)
    target = local.resolve() if local is not None else Path(os.path.relpath(fallback, path.parent))
    tmp = path.with_name(f".{path.name}.link")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, path)


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
