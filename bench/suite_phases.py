"""Where the end-to-end test's time goes: tests/test_pipeline.py's whole-DAG test, its phases run in order as the test
runs them, each one timed (the test's own asserts still apply), in a scratch folder that is kept for a look after.

    python bench/suite_phases.py                     # about 11 minutes on a 2-core CPU, alone
    python bench/suite_phases.py --stages            # then each stage once more alone: `dvc repro -f -s <stage>`

A stage's fixed cost (DVC, Python and torch imports) is most of a micro stage's time, so the phase times follow the
number of stages each phase runs. Run it with nothing else on the cores: the figures are wall times.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import typer

from speedrun.typer_app import new_app

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["preflight", "corpus", "tokenizer", "pretrain", "sft", "download_pairs", "dedup_prompts", "onpolicy_pairs",
          "train_rm", "grpo@density-1", "eval_diversity", "task_data", "task_base", "task_sft", "task_rm",
          "task_grpo@checker-1", "task_eval", "adv_data@1", "adv_rm@1", "adv_grpo@1", "adv_eval"]
app = new_app()


@app.command(help=__doc__)
def main(stages: bool = typer.Option(False, "--stages", help="then time each stage alone, forced")) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    import test_pipeline as t
    from conftest import make_pipeline_repo
    base = Path(tempfile.mkdtemp(prefix="suite_phases_"))
    repo = make_pipeline_repo(base / "repo", t.MICRO_DAG)
    phases = [("first repro", lambda: t._first_repro(repo)),
              ("forced reruns", lambda: t._reruns_are_byte_identical(repo)),
              ("task_eval resume", lambda: t._task_eval_resumes_byte_identical(repo, base / "killed")),
              ("two processes", lambda: t._two_processes_match_one(repo, base / "two")),
              ("queued experiment, frontier", lambda: t._queued_experiment_and_frontier(repo)),
              ("additions", lambda: t._additions_rerun_only_their_stages(repo)),
              ("unknown keys", lambda: t._unknown_keys_stop_before_any_stage(repo)),
              ("pretrained base", lambda: t._a_pretrained_base_runs_the_task_track(repo, base / "tiny"))]
    total = 0.0
    for name, phase in phases:
        start = time.perf_counter()
        phase()
        total += (s := time.perf_counter() - start)
        print(f"{name:<30} {s:7.1f} s", flush=True)
    print(f"{'the whole test':<30} {total:7.1f} s  (workspace: {repo})")
    if not stages:
        return
    env = dict(os.environ, DVC_SITE_CACHE_DIR=str(repo / ".dvc-site-cache"), DVC_NO_ANALYTICS="1",
               OMP_NUM_THREADS="1", PYTHONPATH=str(repo / "src"))
    for stage in STAGES:
        start = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "dvc", "repro", "-f", "-s", stage], cwd=repo, env=env,
                             capture_output=True, text=True)
        print(f"{stage:<30} {time.perf_counter() - start:7.1f} s{'' if res.returncode == 0 else '  (failed)'}")


if __name__ == "__main__":
    app()
