"""The node profile as documented: docs/method.md's `dvc exp run` command, run as written on hub-layout mirrors at
micro size (its size, device, compile and location values swapped, every other override kept), and every stage read
hub data: fineweb-edu, smoltalk, hh-rlhf, ultrafeedback_binarized, stack-exchange-preferences and GSM8K."""
import json
import re
import shlex

import pandas as pd
import pytest

import mirrors
from conftest import REPO, dvc, make_pipeline_repo
from test_pipeline import MICRO_DAG

SIZE = {"corpus.max_docs": 300, "tokenizer.vocab_size": 512, "compute.device": "cpu", "compute.dtype": "fp32",
        "compute.nproc": 1, "compute.compile": "false", "model.depth": 1, "model.seq_len": 128, "pretrain.steps": 6,
        "pretrain.batch_size": 4, "pairs.limit_per_source": 300,
        "task.sft.max_len": 128, "task.rm.max_len": 128,  # a problem and its solution
        "task.train.max_prompt_len": 64, "task.train.max_new_tokens": 6, "task.eval.max_new_tokens": 6}
LOCATION = ("corpus.hf_path", "sft.hf_path")  # hub ids, pointed at the mirrors


def documented_overrides() -> list[tuple[str, str]]:
    """The -S key=value pairs of the docs' node command, in order, as the shell passes them to DVC."""
    text = (REPO / "docs/method.md").read_text()
    block = re.search(r"```bash\n(dvc exp run -S corpus\.source=hf.*?)```", text, re.S)
    assert block, "docs/method.md: the node command (dvc exp run -S corpus.source=hf ...) is gone"
    args = shlex.split(block.group(1).replace("\\\n", " "))
    assert args[:3] == ["dvc", "exp", "run"] and args[3::2] == ["-S"] * len(args[3::2])
    return [tuple(a.split("=", 1)) for a in args[4::2]]


def hh_rows(subset: str, split: str) -> list:
    """The mirror's rows (malformed ones included) and a few more with answers of their own: enough prompts for
    every split at micro size once held-out prompts sharing a trained prompt's answer are left out."""
    q = lambda k: f"How do I fix the {k}th gate ({subset}, {split})?"  # noqa: E731
    return mirrors.hh_rows(subset, split) + [
        ({"chosen": mirrors._t(q(k), f"Oil hinge {k} of the {subset} gate."), "rejected": mirrors._t(q(k), "No.")}, 1)
        for k in range(6)]


def uf_rows(split: str) -> list:
    return mirrors.uf_rows(split) + [(mirrors._uf(f"Describe river {k} ({split}).", f"River {k} runs to the sea "
                                                  f"({split}).", "No."), 1) for k in range(12)]


def se_rows(site: str, shard: int) -> list:
    base = 1000 * mirrors.SE_SITES.index(site) + 100 * shard + 50
    return mirrors.se_rows(site, shard) + [
        (mirrors._q(base + k, site, [mirrors._ans(1, 3, f"<p>Run tool {base + k} on {site}.</p>"),
                                     mirrors._ans(2, 1, "<p>Reboot.</p>")]), 1) for k in range(6)]


@pytest.mark.e2e
def test_documented_node_command_runs_on_hub_mirrors(tmp_path):
    docs = documented_overrides()
    keys = [k for k, _ in docs]
    assert set(SIZE) | set(LOCATION) <= set(keys), "the node command lost a size or location override"
    hub = tmp_path / "hub"
    fineweb = mirrors.write_fineweb(hub / "fineweb")
    mirrors.write_gsm8k(hub / "gsm8k")
    mirrors.write_smoltalk(hub / "smoltalk")
    mirrors.write_hh(hub / "hh", hh_rows)
    mirrors.write_uf(hub / "uf", uf_rows)
    mirrors.write_se(hub / "se", se_rows)
    where = {"corpus.hf_path": hub / "fineweb", "sft.hf_path": hub / "smoltalk"}
    args = []
    for k, v in docs:  # the documented overrides, as written, but for their size, device and location values
        args += ["-S", f"{k}={SIZE.get(k, where.get(k, v))}"]
    repo = make_pipeline_repo(tmp_path / "repo", {
        **MICRO_DAG, "grpo.run": ["density", "baseline"], "eval.comparisons": ["density:baseline"],
        "task.run": ["checker", "density"], "task.eval.comparisons": ["density:checker"], "task.hf_clusters": 3,
        "adversarial.cycles": {"1": {"prev": 0, "init": "outs/pretrain"}},  # one cycle on the hub corpus
        "pairs.hh_path": str(hub / "hh"), "pairs.uf_path": str(hub / "uf"), "pairs.se_path": str(hub / "se"),
        "task.hf_path": str(hub / "gsm8k"),
        "sft.max_rows": 64, "sft.eval_convs": 8, "prompts.eval_frac": 0.2})
    preview = dvc(repo, "exp", "run", "--dry", "--force", *args)  # the documented preview: every stage, nothing run
    assert "Running stage 'task_grpo@density-1'" in preview and not (repo / "data/corpus").exists()
    dvc(repo, "exp", "run", *args)

    corpus = json.loads((repo / "data/corpus/stats.json").read_text())
    train = pd.read_parquet(repo / "data/corpus/train.parquet")
    assert corpus["source"] == "hf" and set(train["text"]) <= set(fineweb) and len(train) > 100
    sft = json.loads((repo / "reports/metrics/sft.json").read_text())
    assert sft["source"] == "hf" and sft["train_conversations"] == 2, sft  # the mirror's two good train rows
    pairs = pd.read_parquet(repo / "data/prompts/pairs.parquet")
    assert set(pairs["src"]) == {"hh", "uf", "se"}  # no embedded pair: the prompts GRPO draws are hub prompts
    groups = pd.read_parquet(repo / "data/prompts/prompts.parquet")["group"]  # what the manipulation check counts
    assert groups.str.startswith("cluster_").all() and groups.nunique() > 3
    rm = json.loads((repo / "reports/metrics/rm.json").read_text())
    assert rm["train_kinds"] == ["sft_sample", "hh", "uf", "se"] and not set(rm["train_pairs_left_out"]) & {
        "hh", "uf", "se", "sft_sample"}
    assert {"hh", "uf", "se", "sft_sample"} <= set(rm["by_kind"]) and rm["train_pairs"] > 20
    diversity = json.loads((repo / "reports/metrics/diversity.json").read_text())
    assert {"grpo_density_s1", "grpo_baseline_s2", "density_vs_baseline"} <= set(diversity)
    items = pd.read_parquet(repo / "data/task/items.parquet")
    assert items["text"].str.contains("apples|eggs").all() and set(items["split"]) == {"train", "val", "eval"}
    gsm = json.loads((repo / "reports/metrics/task.json").read_text())
    assert {"pass@1", "pass@2", "coverage"} <= set(gsm["sft"]["1.0"]["all"]) and gsm["source"] == "gsm8k"
    assert {"checker", "density"} <= set(gsm["arms"]) and "GSM8K" in (repo / "reports/task.md").read_text()
    report = (repo / "reports/report.md").read_text()
    assert "stdlib" not in report.split("## ")[1], "the report describes the embedded split on hub prompts"
