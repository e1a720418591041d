"""Stage preflight: the whole params.yaml checked before any other stage starts or loses an output. Every other
stage depends on this stage's output, so `dvc repro` and `dvc exp run` run it first whenever any key changes (it
tracks the whole file, keys no stage reads included): every key known, typed and in range (list items too), run ids
that cannot leave the workspace, and the checks across keys (speedrun.params). A failure stops DVC here, in about a
second, naming the key; the output is the same text every time, so passing it reruns nothing downstream.
-> outs/preflight.txt"""
from speedrun import params as params_lib
from speedrun.common import write_text
from speedrun.data import task
from speedrun.stage import run_stage

# dvc.yaml tracks all of params.yaml, and run_stage has checked it by the time main runs; READS: the DAG's own checks
READS = ("adversarial.cycles", "task.base", "task.source", "task.train_clusters")
PATHS = {"out": "outs/preflight.txt"}


def main(p, io) -> None:
    try:
        params_lib.dag_check(p, "params.yaml", task.TEMPLATES)
    except params_lib.ParamsError as e:
        raise SystemExit(f"error: {e}")
    write_text(io.out, "params.yaml checked: every key known, typed and in range; ids; cross-references\n")


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
