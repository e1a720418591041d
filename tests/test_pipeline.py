"""End to end: the real DVC DAG in a fresh repo on micro params."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from conftest import dvc, git, make_pipeline_repo, pythonpath, run_module, run_queue, set_params
from speedrun.common import SHELLS
from speedrun.train.checkpoint import load_model

GRPO_RUNS = [f"grpo@{v}-{s}" for v in ("density", "baseline", "tic_2") for s in (1, 2)]
TASK_ARMS = ("checker", "density", "filter", "shuffled", "rm")
TASK_RUNS = [f"task_grpo@{a}-{s}" for a in TASK_ARMS for s in (1, 2)]
MICRO = {"corpus.max_docs": 600, "tokenizer.vocab_size": 512}

MICRO_DAG = {
    **MICRO,
    "model.depth": 1, "model.head_dim": 32, "model.seq_len": 64,
    "pretrain.steps": 6, "pretrain.batch_size": 4, "pretrain.eval_every": 3, "pretrain.eval_windows": 4,
    "pretrain.warmup_steps": 2, "pretrain.save_every": 0,
    "sft.steps": 4, "sft.batch_size": 4, "sft.eval_every": 2, "sft.eval_convs": 8, "sft.warmup_steps": 1,
    "sft.per_object": 1, "sft.max_len": 64, "sft.save_every": 0,
    "pairs.limit_per_source": 300, "pairs.embedded_negatives": 2,
    "onpolicy.samples_per_prompt": 1, "onpolicy.max_new_tokens": 8,
    "rm.eval_pairs": 16, "rm.steps": 4, "rm.batch_size": 4, "rm.eval_every": 2, "rm.max_len": 64, "rm.warmup_steps": 1,
    "rm.save_every": 0,
    "grpo.train.steps": 2, "grpo.train.prompts_per_step": 2, "grpo.train.group_size": 2,
    "grpo.train.max_new_tokens": 8, "grpo.train.pool": 6,  # 2 steps x 2 prompts from a pool of 6
    "eval.max_prompts": 4, "eval.samples_per_prompt": 2, "eval.seeds": 2, "eval.max_new_tokens": 8,
    "eval.n_boot": 20, "grpo.seeds": [1, 2],  # two seeds: the smallest verdict; the test adds a third
    "grpo.run": ["density", "baseline", "tic_2"],
    "eval.comparisons": ["density:baseline", "tic_2:baseline"],  # a control
    "eval.control_temperatures": [0.05, 5.0],  # extreme: a micro model must still order them
    "eval.gold.samples": 2, "eval.gold.max_new_tokens": 6,
    "sft.gold_per_item": 1, "prompts.eval_frac": 0.3,  # 0.3: the 300 embedded pairs hold a few eval modules
    "task.sft.steps": 4, "task.sft.batch_size": 4, "task.sft.eval_every": 2, "task.sft.eval_convs": 8,
    "task.sft.per_item": 1, "task.sft.warmup_steps": 1, "task.rm.steps": 4, "task.rm.batch_size": 4,
    "task.rm.eval_every": 2, "task.rm.warmup_steps": 1, "task.seeds": [1, 2], "task.train.steps": 2,
    "task.train.prompts_per_step": 2, "task.train.group_size": 2, "task.train.max_new_tokens": 6,
    "task.eval.samples": 2, "task.eval.max_new_tokens": 6, "task.eval.temperatures": [0.5, 1.0], "task.eval.n_boot": 20,
    "task.eval.run_temperatures": [1.0, 1.5], "task.eval.primary": "matched",  # the stage's matched path
    "adversarial.seq_len": 16, "adversarial.data.train_rows": 16, "adversarial.data.val_rows": 8,
    "adversarial.data.val_pure_rows": 4, "adversarial.data.batch_size": 16, "adversarial.rm.steps": 4,
    "adversarial.rm.batch_size": 4, "adversarial.rm.eval_every": 2, "adversarial.train.prompts": 8,
    "adversarial.train.steps": 2, "adversarial.train.prompts_per_step": 2, "adversarial.train.group_size": 2,
    "adversarial.eval.prompts": 4, "adversarial.eval.bpb_windows": 4,
}

# a checkpoint's chat template (a system turn, role names) takes more tokens than the lab's: the README's SmolLM2
# command sets these lengths too
LLAMA_LENGTHS = ["-S", "task.sft.max_len=128", "-S", "task.rm.max_len=128", "-S", "task.train.max_prompt_len=96"]


@pytest.mark.slow
def test_tokenizer_stages_cache_and_rerun(tmp_path):
    repo = make_pipeline_repo(tmp_path, MICRO)
    out = dvc(repo, "repro", "tokenizer")
    assert "Running stage 'corpus'" in out and "Running stage 'tokenizer'" in out
    metrics = json.loads((repo / "reports/metrics/tokenizer.json").read_text())
    assert metrics["vocab_size"] == 512 and metrics["val_chars_per_token"] > 1.5
    assert ran(dvc(repo, "repro", "tokenizer")) == set()  # nothing stale
    pin = repo / "data/interpreter.json"
    ours = pin.read_text()
    pin.write_text(ours.replace('"stdlib_digest": "', '"stdlib_digest": "another-python-'))  # pinned elsewhere
    assert ran(dvc(repo, "repro", "tokenizer")) == {"corpus"}  # same stdlib read: same corpus, tokenizer up to date
    assert pin.read_text() == ours and dvc(repo, "status", "tokenizer").strip() == "Data and pipelines are up to date."

    set_params(repo, {"tokenizer.vocab_size": 600})
    out = dvc(repo, "repro", "tokenizer")
    assert "Running stage 'tokenizer'" in out and "Running stage 'corpus'" not in out


def assert_held_out(repo) -> None:
    """On the run's own artifacts: no evaluation prompt, nor its module, nor a gold-task item of the evaluation,
    reaches SFT, the pairs the RM trains and validates on, the on-policy samples, or a GRPO run's prompt pool."""
    from speedrun import params
    from speedrun.data import gold, sft
    from speedrun.data.docstrings import heldout_split, load_objects
    p = params.load(repo / "params.yaml")
    prompts = pd.read_parquet(repo / "data/prompts/prompts.parquet")
    pairs = pd.read_parquet(repo / "data/prompts/pairs.parquet")
    eval_ids = set(prompts.loc[prompts["split"] == "eval", "prompt_id"])
    text = lambda msgs: msgs[-1]["content"]  # noqa: E731
    eval_texts = set(prompts.loc[prompts["split"] == "eval", "prompt"].map(text))
    assert eval_ids and len(eval_ids) < len(prompts)
    objects = repo / "data/corpus/objects.parquet"
    convs = sft.embedded_conversations(objects, p.corpus.val_frac, p.prompts.eval_frac, p.seed, p.sft.per_object,
                                       p.sft.gold_per_item)
    sft_questions = {c[0]["content"] for split in convs.values() for c in split}
    assert sft_questions and not sft_questions & eval_texts
    items = gold.gold_items(load_objects(objects), p.corpus.val_frac, p.prompts.eval_frac)
    assert any(i.split == "eval" for i in items)
    # no SFT question, gold-task options included, names a module (or a member of one) that is held out
    eval_tops = {o.top for o in load_objects(objects) if o.kind != "topic"
                 and heldout_split(o.top, p.corpus.val_frac, p.prompts.eval_frac) == "eval"}
    named = [q for q in sft_questions if "topic" not in q  # pydoc topics share names with modules (`types`)
             for t in eval_tops if f"`{t}`" in q or f"`{t}." in q]
    assert eval_tops and not named, named[:3]
    # the modules of the eval prompts are in no trained pair
    trained = pairs[pairs["split"] != "eval"]
    eval_groups = set(pairs.loc[pairs["split"] == "eval", "group"]) - {"pydoc_topics"}
    assert not eval_groups & set(trained["group"]) and not eval_ids & set(trained["prompt_id"])
    onpolicy = pd.read_parquet(repo / "data/onpolicy/pairs.parquet")
    assert not eval_ids & set(onpolicy["prompt_id"])
    for run in (repo / "outs/grpo").iterdir():
        pool = set(pd.read_parquet(run / "weights.parquet")["prompt_id"])
        assert pool and pool <= set(prompts.loc[prompts["split"] == "train", "prompt_id"]), run
    # the task track: no eval item in the task SFT conversations, the task pairs or a task GRPO run's pool
    from speedrun.data import task
    items = task.load_items(repo / "data/task/items.parquet")
    eval_items = {i.item_id for i in items if i.split == "eval"}
    eval_q = {i.question(t) for i in items if i.split == "eval" for t in range(len(task.TEMPLATES[i.cluster]))}
    assert eval_items and all(any(i.split == "eval" and i.cluster == c for i in items) for c in task.TEMPLATES)
    task_convs = task.conversations(items, "train", p.task.sft.per_item, p.seed)
    assert task_convs and not {c[0]["content"] for c in task_convs} & eval_q
    assert not eval_items & set(pd.read_parquet(repo / "data/task/pairs.parquet")["prompt_id"])
    for run in (repo / "outs/task_grpo").iterdir():
        pool = set(pd.read_parquet(run / "weights.parquet")["prompt_id"])
        assert pool and not pool & eval_items, run


def ran(out: str) -> set[str]:
    return {line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage '")}


def _first_repro(repo: Path) -> None:
    """The whole DAG runs; its metrics, report, held-out splits and plots are there; nothing is stale."""
    out = dvc(repo, "repro")
    stages = ran(out)
    for s in ["corpus", "tokenizer", "pretrain", "sft", "download_pairs", "dedup_prompts", "onpolicy_pairs", "train_rm",
              *GRPO_RUNS, "eval_diversity", "adv_data@1", "adv_rm@1", "adv_grpo@1", "adv_data@2", "adv_rm@2",
              "adv_grpo@2", "adv_eval", "task_data", "task_sft", *TASK_RUNS, "task_rm", "task_eval"]:
        assert s in stages, (s, sorted(stages))
    # one DVC stage per run; the track's first stage trains every run, two at a time on the 2-core machine, one
    # thread each, and the others install theirs from that batch
    assert {f"grpo/{v}_s{s}" for v in ("density", "baseline", "tic_2") for s in (1, 2)} == {
        f"grpo/{r.name}" for r in (repo / "outs/grpo").iterdir()}
    assert {f.name for f in (repo / "reports/metrics/task_grpo").iterdir()} == {
        f"{a}_s{s}.json" for a in TASK_ARMS for s in (1, 2)}
    assert "task_grpo: training checker_s1, checker_s2, density_s1" in out and "--- [10/10] " in out
    assert out.count("was trained beside an earlier run of the track; installing it") == 9 + 5
    for stage, monitor in (("pretrain", "val_bpb"), ("sft", "val_loss"), ("task_sft", "val_loss")):
        evals = pd.read_csv(repo / f"outs/{stage}/eval.csv").query("step > 0")  # a checkpoint's step: its weights'
        assert json.loads((repo / f"outs/{stage}/meta.json").read_text())["step"] == \
            evals["step"][evals[monitor].idxmin()], stage
    diversity = json.loads((repo / "reports/metrics/diversity.json").read_text())
    assert {"grpo_density_s1", "grpo_baseline_s2", "sft", "density_vs_baseline", "density_vs_sft"} <= set(diversity)
    assert set(diversity["density_vs_baseline"]["delta"]) >= {"ead_1", "reward", "ref_loglik", "tic_share"}
    assert "tic_share" in diversity["tic_2_vs_baseline"]["delta"] and "tic_share" in diversity["grpo_tic_2_s1"]
    assert 1.0 <= diversity["grpo_density_s1"]["within_vendi"] <= 2.0  # 2 samples per prompt: Vendi in [1, 2]
    tic_run = json.loads((repo / "reports/metrics/grpo/tic_2_s1.json").read_text())
    assert "tic_share_end" in tic_run and tic_run["epochs"] == round(4 / 6, 4)  # drawn from the pool only
    report = (repo / "reports/report.md").read_text()
    assert "**density vs baseline** (2 vs 2 GRPO training seeds)" in report and "Holm" in report
    assert "temperature control" in report and "Task performance (gold-checked)" in report
    assert {"task_pass@1", "task_coverage@2"} <= set(diversity["sft"])
    assert_held_out(repo)
    task_result = json.loads((repo / "reports/metrics/task.json").read_text())
    assert set(task_result["arms"]) == set(TASK_ARMS) and set(task_result["sft"]) == {"0.5",
                                                                                                            "1.0"}
    assert task_result["rm"]["pairs"] > 0 and 0 <= task_result["rm"]["acc"] <= 1  # the RM scored held-out task pairs
    assert {"pass@1", "pass@2", "coverage", "entropy", "top_phrasing_share"} <= set(task_result["sft"]["1.0"]["all"])
    assert set(task_result["frontier_gap"]["checker"]) >= {"gap", "ci_low", "ci_high", "collapsed"}
    density = task_result["comparisons"]["density:checker"]  # the default density-against-uniform comparison
    assert {"value", "ci_low", "ci_high", "mde"} <= set(density["gap"]) and "verdict" in density["pass@1"]
    assert density["primary"] == "matched" and {"p_holm", "extended_share"} <= set(density["matched"])
    assert task_result["run_temperatures"] == [1.5] and "p_holm" not in density["gap"]
    task_md = (repo / "reports/task.md").read_text()
    assert "Manipulation check" in task_md and "## Semantic diversity (a sentence encoder)" in task_md
    assert "Primary (matched): Δ coverage at equal pass@1 at the control arm's pass@1" in task_md
    assert set(density["range"]["readings"]) == {"gap", "same_temperature", "matched", "matched_other"}
    assert "## Does the model read its prompt?" in task_md and "| collapsed by the reward |" in task_md
    sem = task_result["semantic"]  # every model's, with the temperature control the report reads first
    assert set(sem["sft"]) == {"0.5", "1.0"} and set(sem["arms"]) == set(task_result["arms"])
    assert set(sem["control"]) == {"rho", "bar", "passed"} and 0 <= sem["sft"]["1.0"]["all"] <= 2
    adversarial = json.loads((repo / "reports/metrics/adversarial.json").read_text())
    assert adversarial
    assert ran(dvc(repo, "repro")) == set()
    assert dvc(repo, "status").strip() == "Data and pipelines are up to date."
    # a dry run in a finished workspace lists what a change would rerun, and runs nothing (`dvc exp run --dry` runs
    # in a temporary copy without the outputs and fails there: treeverse/dvc#9818; the README says so)
    assert ran(dvc(repo, "repro", "--dry")) == set()
    params_text = (repo / "params.yaml").read_text()
    set_params(repo, {"grpo.variants.density.sampling": "uniform"})
    dry = dvc(repo, "repro", "--dry")
    assert ran(dry) == {"preflight", "grpo@density-1", "grpo@density-2", "eval_diversity"}, ran(dry)
    (repo / "params.yaml").write_text(params_text)
    assert dvc(repo, "status").strip() == "Data and pipelines are up to date."
    # every declared per-step curve renders from the run's own logs
    plots = json.loads(dvc(repo, "plots", "show", "--json"))["data"]
    declared = [next(iter(p)) for p in yaml.safe_load((repo / "dvc.yaml").read_text())["plots"]]
    assert set(plots) == set(declared) and {"grpo_reward", "grpo_kl", "rm_loss", "adv_policy_reward"} <= set(plots)
    for name, rendered in plots.items():
        assert [r["type"] for r in rendered] == ["vega"] and not rendered[0].get("errors"), name
        assert rendered[0]["content"]["data"]["values"], name


def test_a_fresh_clone_previews_the_whole_run(tmp_path):
    """On a fresh clone (no outputs, no cache) `dvc status` works and the dry run lists every stage. DVC's
    `repro --dry` hashes a stage's missing deps for its run cache and fails on them (treeverse/dvc#9818), so a
    fresh clone previews with --force (everything runs there anyway); a finished workspace with plain --dry (the
    end-to-end test). outs/preflight.txt is git-tracked so the first stage's deps exist."""
    repo = make_pipeline_repo(tmp_path, MICRO)
    assert "changed" in dvc(repo, "status") or "deleted" in dvc(repo, "status")
    for cmd in (["repro", "--dry", "--force"], ["exp", "run", "--dry", "--force", "-S", "beta=0.1"]):
        stages = ran(dvc(repo, *cmd))
        assert {"preflight", "corpus", "grpo@density-1", "task_grpo@checker-1", "adv_grpo@2", "task_eval"} <= stages
    assert not (repo / "data/corpus").exists() and not (repo / "outs/pretrain").exists()  # nothing ran


def _reruns_are_byte_identical(repo: Path) -> None:
    """Same params -> byte-identical artifacts: force-rerun every stage that samples or trains."""
    artifacts = ["outs/pretrain/model.pt", "outs/sft/model.pt", "outs/task_sft/model.pt",
                 "outs/task_grpo/density_s1/model.pt", "reports/metrics/task.json", "data/onpolicy/pairs.parquet",
                 "outs/rm/model.pt",
                 "outs/grpo/density_s1/model.pt", "outs/grpo/baseline_s2/model.pt", "reports/metrics/diversity.json",
                 "data/adv/cycle_1/train.parquet", "outs/adv/cycle_1/disc/model.pt", "outs/adv/cycle_1/policy/model.pt"]
    digest = lambda: {a: hashlib.sha256((repo / a).read_bytes()).hexdigest() for a in artifacts}  # noqa: E731
    first = digest()
    # the GRPO runs compared below, each rerun alone (in its stage's process) against the batch that trained it
    forced = ["pretrain", "sft", "task_sft", "task_grpo@density-1", "task_eval", "onpolicy_pairs", "train_rm",
              "grpo@density-1", "grpo@baseline-2", "eval_diversity", "adv_data@1", "adv_rm@1", "adv_grpo@1"]
    assert ran(dvc(repo, "repro", "-f", "-s", *forced)) == set(forced)  # -s: these stages only, not downstream
    assert digest() == first
    # a run by hand, alone, is the same bytes as the DAG's run beside another: compute.run_threads fixes its threads
    run_module("stages.task_grpo", "--arm", "density", "--seed", "1", "--out-dir", str(repo / "scratch/alone"),
               "--metrics", str(repo / "scratch/alone.json"), cwd=repo, env={"OMP_NUM_THREADS": "2"})
    for name in ("model.pt", "log.csv"):
        assert (repo / "scratch/alone" / name).read_bytes() == (repo / "outs/task_grpo/density_s1" / name).read_bytes()


def _tree(repo: Path) -> dict[str, tuple[int, int]]:
    """Every file under outs/, reports/ and scratch/: size and modification time."""
    return {str(f.relative_to(repo)): (f.stat().st_size, f.stat().st_mtime_ns) for d in ("outs", "reports", "scratch")
            for f in (repo / d).rglob("*") if f.is_file()}


def _kill_mid_run(repo: Path, cmd: list[str], ready) -> None:
    """Start `cmd` (dvc repro, or a shell running a stage), wait until ready(its processes), kill -9 it: a second later
    no process of the stage is left (none with its working directory in the repo), and no file under outs/,
    reports/ or scratch/ changes after."""
    import psutil
    env = dict(os.environ, DVC_SITE_CACHE_DIR=str(repo / ".dvc-site-cache"), DVC_NO_ANALYTICS="1",
               OMP_NUM_THREADS="1", PYTHONPATH=pythonpath(repo / "src"))
    env.pop("SHELL", None)  # DVC then runs the stage as `/bin/sh -c`, which (dash) stays between it and the stage (CI)
    parent = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not ready(psutil.Process(parent.pid).children(recursive=True)):
        assert parent.poll() is None and time.time() < deadline, f"{cmd} ended before the kill"
        time.sleep(0.02)
    parent.kill()
    parent.wait()

    def left() -> list[str]:  # the stage's live processes: a runner, its forks, torchrun's ranks (not DVC's daemons)
        out = []
        for p in psutil.process_iter(["cwd", "cmdline", "status"]):
            line = " ".join(p.info["cmdline"] or [])
            if p.info["status"] != psutil.STATUS_ZOMBIE and p.info["cwd"] and Path(p.info["cwd"]).is_relative_to(repo) \
                    and ("speedrun" in line or "stages." in line):
                out.append(f"{p.pid} {line[:160]}")
        return out
    deadline = time.time() + 1.0
    while left() and time.time() < deadline:
        time.sleep(0.05)
    assert not left(), f"{cmd}: processes of the stage outlived a kill -9 of what started it: {left()}"
    before = _tree(repo)
    time.sleep(1.5)
    assert _tree(repo) == before, f"{cmd}: files changed after the kill"


def _killed_stages_leave_nothing_behind(repo: Path) -> None:
    """kill -9 of what started a stage (`dvc repro`; a shell) mid-run: a GRPO runner training two runs in forks, and
    task_eval (one process) end with it and write nothing after; the rerun gives every output's bytes again."""
    grpo = ["outs/grpo/density_s1", "outs/grpo/baseline_s1", "reports/metrics/grpo/density_s1.json",
            "reports/metrics/grpo/baseline_s1.json"]
    outs = [*grpo, "outs/task_eval/answers.parquet", "reports/metrics/task.json", "reports/task.md"]
    files = [f for o in outs for f in ([repo / o] if (repo / o).is_file() else sorted((repo / o).rglob("*")))]
    kept = {f: f.read_bytes() for f in files if f.is_file()}
    untimed = lambda data, f: data if f.suffix != ".json" else {  # noqa: E731  (a run's metrics time it, too)
        k: v for k, v in json.loads(data).items() if k not in ("seconds", "completion_tokens_per_s")}
    def count(procs, word: str) -> int:  # the stage's own processes: not the shell between, not DVC's daemon forks
        n = 0
        for p in procs:
            try:
                n += p.name() not in SHELLS and word in " ".join(p.cmdline())
            except Exception:  # a process that ended meanwhile
                pass
        return n
    forks = lambda procs: count(procs, "speedrun grpo") >= 3  # noqa: E731  (the runner and its two runs)
    evaluated = lambda procs: any((repo / "scratch/task_eval").glob("*.parquet"))  # noqa: E731  (its first model)
    shell = lambda line: ["bash", "-c", f"{line}; true"]  # noqa: E731  (bash stays the stage's parent)
    by_hand = "speedrun grpo --arm density --seed 1 --metrics reports/metrics/grpo/density_s1.json"
    dvc_repro = [sys.executable, "-m", "dvc", "repro", "-f", "-s"]
    for cmd, ready, stage in ((dvc_repro + ["grpo@density-1"], forks, "grpo@density-1"),
                              (shell(by_hand), forks, "grpo@density-1"),
                              (dvc_repro + ["task_eval"], evaluated, "task_eval"),
                              (shell("speedrun task_eval"), evaluated, "task_eval")):
        if ready is forks:  # baseline_s1 stale, and no trained copy of it waiting in scratch/: the runner trains
            shutil.rmtree(repo / "outs/grpo/baseline_s1")  # it beside density_s1
            shutil.rmtree(repo / "scratch/runs", ignore_errors=True)
        _kill_mid_run(repo, cmd, ready)
        dvc(repo, "repro", "-f", "-s", stage)
        dvc(repo, "repro")
        changed = [str(f.relative_to(repo)) for f, b in kept.items() if not f.is_file() or untimed(f.read_bytes(), f)
                   != untimed(b, f)]
        assert not changed, (cmd, changed)
    assert dvc(repo, "status").strip() == "Data and pipelines are up to date."


def _task_eval_resumes_byte_identical(repo: Path, elsewhere: Path) -> None:
    """task_eval killed after its first models reads them back on the rerun: the DAG's bytes, answers and metrics."""
    outs = {"answers": "outs/task_eval/answers.parquet", "metrics": "reports/metrics/task.json",
            "report": "reports/task.md"}
    flags = [a for k, v in outs.items() for a in (f"--{k}", str(elsewhere / Path(v).name))]
    scratch = elsewhere / "scratch"
    cmd = [sys.executable, "-m", "stages.task_eval", *flags, "--scratch-dir", str(scratch)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None and len(list(scratch.glob("*.parquet"))) < 2:
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    kept = len(list(scratch.glob("*.parquet")))
    assert kept >= 2 and not (elsewhere / "task.json").exists(), kept  # killed half way
    res = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("read back from") == kept, res.stdout[-3000:]  # atomic writes: every kept model
    for k, v in outs.items():
        assert (elsewhere / Path(v).name).read_bytes() == (repo / v).read_bytes(), v
    assert not scratch.exists()  # done: the next run samples afresh


def _two_processes_match_one(repo: Path, elsewhere: Path) -> None:
    """A GRPO run and the chat evaluation under 2 processes against the DAG's."""
    # one GRPO run (the planted-tic control: its bonus and tic count go through the ranks' shares) under 2 processes
    # takes the DAG's steps: same draws, same rewards and tic share up to float rounding (each rank scores half)
    run_module("stages.grpo", "--arm", "tic_2", "--seed", "1", "-S", "compute.nproc=2", "--out-dir",
               str(elsewhere / "run"), "--metrics", str(elsewhere / "run.json"), cwd=repo)
    one, two = (json.loads(f.read_text())
                for f in (repo / "reports/metrics/grpo/tic_2_s1.json", elsewhere / "run.json"))
    assert (two["steps"], two["epochs"], two["draws_per_prompt_max"]) == (one["steps"], one["epochs"],
                                                                           one["draws_per_prompt_max"])
    for k in ("reward_start", "reward_end", "tic_share_start", "tic_share_end", "completion_len_end"):
        assert abs(two[k] - one[k]) <= 0.05 * max(1.0, abs(one[k])), (k, one[k], two[k])

    # the chat evaluation under 2 processes (each samples every other model): the DAG's bytes (the task evaluation
    # shares its models with the same distributed.map_jobs, tested in test_train.py)
    outs = {"samples-out": "outs/eval/samples.parquet", "result-out": "outs/eval/result.json",
            "metrics": "reports/metrics/diversity.json"}
    moved = {k: elsewhere / "eval" / Path(v).name for k, v in outs.items()}
    flags = [a for k, f in moved.items() for a in (f"--{k}", str(f))]
    run_module("stages.eval_diversity", "-S", "compute.nproc=2", *flags, "--report", str(elsewhere / "eval/report.md"),
               "--fig-dir", str(elsewhere / "figures"), "--scratch-dir", str(elsewhere / "scratch"), cwd=repo)
    for k, v in outs.items():
        assert moved[k].read_bytes() == (repo / v).read_bytes(), v


def _queued_experiment_and_frontier(repo: Path) -> None:
    """The README's recipe: metrics, a queued experiment, the frontier of a sweep."""
    # the README's comparison recipe: metrics side by side, then an experiment
    show = dvc(repo, "metrics", "show")
    assert "grpo_density_s1" in show and "density_vs_baseline" in show
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "baseline run")
    # an experiment run the way the README's sweep runs it: queued, then a queue worker runs it in its own workspace
    # (one queued value, 'a,b' expands to one run per value: test_params.py). Its knob is the chat GRPO runs' lr, not
    # the README's beta, which every GRPO stage reads: the same queue, without rerunning the task and adversarial runs
    dvc(repo, "exp", "run", "--queue", "-n", "lr-2e-4", "-S", "grpo.train.lr=0.0002")
    status = run_queue(repo)
    assert "Failed" not in status, status
    stages = ran(dvc(repo, "queue", "logs", "lr-2e-4"))
    assert stages == {"preflight", *GRPO_RUNS, "eval_diversity"}, stages  # the rest from the cache
    diff = dvc(repo, "exp", "diff", "HEAD", "lr-2e-4")
    assert "grpo.train.lr" in diff and "reports/metrics/grpo/" in diff  # (micro diversity metrics may not move)
    assert "reports/metrics/grpo/" in dvc(repo, "metrics", "diff", "HEAD", "lr-2e-4")
    # then the reward-diversity frontier of all runs, along the swept knob
    (repo / "exps.json").write_text(dvc(repo, "exp", "show", "--json"))
    res = subprocess.run([sys.executable, "-m", "speedrun.frontier", "--show-json", "exps.json", "--sweep",
                          "grpo.train.lr", "--out", "frontier.png"], cwd=repo, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=pythonpath(repo / "src")))
    assert res.returncode == 0, res.stderr
    for lr in ("0.0002", "0.0001"):
        for variant in ("density", "baseline"):
            assert f"| {lr} | {variant} |" in res.stdout, (lr, variant, res.stdout)
    assert (repo / "frontier.png").read_bytes()[:4] == b"\x89PNG"


def _additions_rerun_only_their_stages(repo: Path) -> None:
    """A cycle, a seed or a knob reruns only what reads it; a failed evaluation keeps the last report."""
    # one more adversarial cycle runs that cycle and the adversarial evaluation, nothing else
    set_params(repo, {"adversarial.cycles.3": {"prev": 2, "init": "outs/adv/cycle_2/policy"}})
    assert ran(dvc(repo, "repro")) == {"preflight", "adv_data@3", "adv_rm@3", "adv_grpo@3", "adv_eval"}
    assert set(json.loads((repo / "reports/metrics/adversarial.json").read_text())["cycles"]) == {"1", "2", "3"}

    # one more training seed trains only that seed's runs (side by side, in the first one's stage)
    set_params(repo, {"grpo.seeds": [1, 2, 3]})
    out = dvc(repo, "repro")
    assert ran(out) == {"preflight", "grpo@density-3", "grpo@baseline-3", "grpo@tic_2-3", "eval_diversity"}
    assert "grpo: training density_s3, baseline_s3, tic_2_s3 on cpu" in out and "--- [3/3] " in out
    assert "(3 vs 3 GRPO training seeds)" in (repo / "reports/report.md").read_text()
    # an experiment that changes one arm's settings retrains that arm's runs only
    out = dvc(repo, "exp", "run", "-S", "grpo.variants.tic_2.tic_bonus=1.0")
    assert ran(out) == {"preflight", "grpo@tic_2-1", "grpo@tic_2-2", "grpo@tic_2-3", "eval_diversity"}, ran(out)
    assert "grpo: training tic_2_s1, tic_2_s2, tic_2_s3 on cpu" in out

    # a knob that once had its default in code reaches its stage through `dvc exp run -S`, and only that stage
    assert ran(dvc(repo, "exp", "run", "-S", "eval.max_prompt_len=32")) == {"preflight", "eval_diversity"}
    # a failed evaluation leaves the last report in place (its cache: false outputs are persist)
    report = (repo / "reports/report.md").read_bytes()
    set_params(repo, {"eval.comparisons": ["density:nope"]})
    res = subprocess.run([sys.executable, "-m", "dvc", "repro", "eval_diversity"], cwd=repo, capture_output=True,
                         text=True, env=dict(os.environ, DVC_SITE_CACHE_DIR=str(repo / ".dvc-site-cache"),
                                             PYTHONPATH=pythonpath(repo / "src")))
    assert res.returncode != 0 and "eval.comparisons" in res.stdout + res.stderr
    assert (repo / "reports/report.md").read_bytes() == report


def _unknown_keys_stop_before_any_stage(repo: Path) -> None:
    """A key no stage reads stops DVC at the check, before any output is lost."""
    # a key no stage reads, in the file or added with -S +key, stops DVC at the check before any stage loses an output
    set_params(repo, {"eval.comparisons": ["density:baseline", "tic_2:baseline"]})
    kept = {a: (repo / a).read_bytes() for a in ("reports/metrics/diversity.json", "reports/task.md",
                                                  "outs/eval/result.json", "outs/grpo/density_s1/model.pt")}
    good = (repo / "params.yaml").read_text()
    env = dict(os.environ, DVC_SITE_CACHE_DIR=str(repo / ".dvc-site-cache"), PYTHONPATH=pythonpath(repo / "src"))
    (repo / "params.yaml").write_text(good + "betta: 0.1\n")
    for cmd in (["repro"], ["exp", "run", "-S", "grpo.train.lr=0.5"]):
        res = subprocess.run([sys.executable, "-m", "dvc", *cmd], cwd=repo, capture_output=True, text=True, env=env)
        assert res.returncode != 0 and "betta: unknown key" in res.stdout + res.stderr, res.stdout + res.stderr
        assert ran(res.stdout) == {"preflight"}, res.stdout
    (repo / "params.yaml").write_text(good)
    res = subprocess.run([sys.executable, "-m", "dvc", "exp", "run", "-S", "+betta=0.1"], cwd=repo,
                         capture_output=True, text=True, env=env)
    assert res.returncode != 0 and "betta: unknown key" in res.stdout + res.stderr, res.stdout + res.stderr
    assert ran(res.stdout) == {"preflight"} and all((repo / a).read_bytes() == b for a, b in kept.items())
    (repo / "params.yaml").write_text(good)  # DVC wrote the -S into the file before the check refused it


def _a_pretrained_base_runs_the_task_track(repo: Path, elsewhere: Path) -> None:
    """The README's pretrained-base experiment, on a tiny random Llama written here as a GGUF file: task_base reads
    it, and the task track runs from it (task SFT in its ChatML template, the RM on its trunk, every GRPO run, the
    evaluation), the task SFT and every GRPO run training the last of its two blocks only; nothing of the chat or
    adversarial tracks reruns. Two arms, the two rewards the base reaches (the checker; the RM on its trunk): the
    others differ from the checker arm in prompt selection and reward shuffling only, which no base touches."""
    from tiny_llama import write_gguf, write_hf
    path = write_gguf(elsewhere / "tiny.gguf", write_hf(elsewhere / "hf", tied=True)[0])
    arms = ("checker", "rm")
    out = dvc(repo, "exp", "run", "-n", "tiny-llama", "-S", f"task.base=gguf:{path}", *LLAMA_LENGTHS,
              "-S", "task.sft.frozen_blocks=1", "-S", "task.train.frozen_blocks=1",
              "-S", f"task.run=[{','.join(arms)}]", "-S", "task.eval.comparisons=['rm:checker']")
    runs = [f"task_grpo@{a}-{s}" for a in arms for s in (1, 2)]
    assert ran(out) == {"preflight", "task_base", "task_sft", "task_rm", *runs, "task_eval"}, ran(out)
    base, sft, run = (load_model(repo / d)[0].state_dict() for d in ("outs/task_base", "outs/task_sft",
                                                                      "outs/task_grpo/rm_s1"))
    for name in base:  # the embedding (the tied head) and block 0 stay the base's; block 1 and the norm train
        assert torch.equal(base[name], sft[name]) == (not name.startswith(("blocks.1.", "norm_f."))), name
        assert torch.equal(sft[name], run[name]) == (not name.startswith(("blocks.1.", "norm_f."))), name
    assert "task_base: gguf:" in out and "a Llama of" in out
    meta = json.loads((repo / "outs/task_sft/meta.json").read_text())
    assert meta["arch"] == "llama" and meta["init"].startswith("tiny.gguf sha256 ")
    assert json.loads((repo / "outs/task_rm/meta.json").read_text())["arch"] == "llama"
    task_result = json.loads((repo / "reports/metrics/task.json").read_text())
    assert set(task_result["arms"]) == set(arms)
    assert "task.base" in dvc(repo, "exp", "show", "--csv")
    # the base file replaced in place: DVC hashes it through outs/task_base_checkpoint, so task_base is stale
    write_gguf(path, write_hf(elsewhere / "hf_other", tied=True, seed=1)[0])
    assert "outs/task_base_checkpoint" in dvc(repo, "status") and "task_base" in ran(dvc(repo, "repro", "--dry"))


def _the_chat_pilot_runs_from_a_pretrained_base(repo: Path, elsewhere: Path) -> None:
    """The SmolLM2 chat pilot's script in its dry form (analysis/chat_pilot.sh: the pilot's design, a few steps), on
    a tiny random Qwen2 written here as a Hugging Face folder, right after the task track's base experiment (two base
    experiments in a row): stage base reads it, SFT at 0 steps passes it on as it came, and every chat stage runs
    from it in its ChatML template and tokenizer (the on-policy pairs, the RM on its trunk, the pilot's five arms with
    the last block trained, the evaluation of its four comparisons); the lab's GPT, the task track and the
    adversarial track are not rerun (the target is eval_diversity)."""
    from conftest import dvc_env
    from tiny_llama import write_hf
    folder = write_hf(elsewhere / "hf", tied=False, family="qwen2")[0]
    env = dvc_env(repo, PROFILE="dry", BASE=f"hf:{folder}", E="tiny-chat", PYTHON=sys.executable)
    res = subprocess.run(["bash", "analysis/chat_pilot.sh"], cwd=repo, env=env, capture_output=True, text=True)
    out = res.stdout
    assert res.returncode == 0, f"{out}\n{res.stderr}"
    arms = ("baseline", "density", "shuffled", "balanced", "distinct")
    runs = {f"grpo@{a}-1" for a in arms}
    assert ran(out) == {"preflight", "base", "sft", "download_pairs", "dedup_prompts", "onpolicy_pairs", "train_rm",
                        *runs, "eval_diversity"}, ran(out)
    assert "base: hf:" in out and "a Llama of" in out
    base, sft, run = (load_model(repo / d)[0].state_dict() for d in ("outs/base", "outs/sft", "outs/grpo/density_s1"))
    for name in base:  # SFT at 0 steps is the base; GRPO trains block 1, the norm and the untied head only
        assert torch.equal(base[name], sft[name]), name
        assert torch.equal(sft[name], run[name]) == (not name.startswith(("blocks.1.", "norm_f.", "lm_head."))), name
    tok_meta = json.loads((repo / "outs/base/tokenizer/tokenizer.json").read_text())
    assert tok_meta["template"] == "chatml"
    for d in ("outs/sft", "outs/rm", "outs/grpo/baseline_s1"):
        assert json.loads((repo / d / "meta.json").read_text())["arch"] == "llama", d
    result = json.loads((repo / "reports/metrics/diversity.json").read_text())
    compared = {"baseline_vs_shuffled", "density_vs_baseline", "balanced_vs_baseline", "distinct_vs_baseline"}
    assert {"sft", *compared, *(f"grpo_{a}_s1" for a in arms)} <= set(result), sorted(result)
    assert "base" in dvc(repo, "exp", "show", "--csv")


@pytest.mark.e2e(first=True)
def test_whole_dag_repro_experiment_and_metrics(tmp_path, tmp_path_factory):
    repo = make_pipeline_repo(tmp_path, MICRO_DAG)
    _first_repro(repo)
    _reruns_are_byte_identical(repo)
    _killed_stages_leave_nothing_behind(repo)
    _task_eval_resumes_byte_identical(repo, tmp_path_factory.mktemp("task_eval_killed"))
    _two_processes_match_one(repo, tmp_path_factory.mktemp("grpo_two_processes"))  # outside the repo (tmp_path)
    _queued_experiment_and_frontier(repo)
    _additions_rerun_only_their_stages(repo)
    _unknown_keys_stop_before_any_stage(repo)
    _a_pretrained_base_runs_the_task_track(repo, tmp_path_factory.mktemp("tiny_llama"))
    _the_chat_pilot_runs_from_a_pretrained_base(repo, tmp_path_factory.mktemp("tiny_chat"))

def test_grpo_plots_cover_every_run_of_params():
    """dvc.yaml's GRPO plots name each run's log by hand (top-level plots cannot loop): they must match params."""
    from speedrun import params
    from conftest import REPO
    grpo = params.load(REPO / "params.yaml").grpo
    expected = {f"outs/grpo/{v}_s{s}/log.csv" for v in grpo.run for s in grpo.seeds}
    for plot in yaml.safe_load((REPO / "dvc.yaml").read_text())["plots"]:
        name, spec = next(iter(plot.items()))
        if name.startswith("grpo_"):
            assert set(spec["y"]) == expected, name

