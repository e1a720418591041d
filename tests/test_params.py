"""params.yaml is the one place a knob's value lives: each stage declares the keys it reads (READS), dvc.yaml lists
exactly those under `params:`, every key of params.yaml is read by some stage, and a bad key or value stops a stage
before any work, naming the key."""
import importlib
import os
import re
import subprocess
import sys
import time

import pytest
import yaml

from conftest import REPO
from speedrun import params
from speedrun.params import Params

STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
# dvc.yaml's templated ids, as the stages name them in READS
IDS = {"arm": "${item.arm}", "seed": "${item.seed}", "cycle": "${key}"}


def module_of(stage: dict) -> str:
    return re.search(r"^speedrun (\w+)", stage.get("do", stage)["cmd"]).group(1)


def reads_of(stage: dict) -> list[str]:
    return [r.format(**IDS) for r in importlib.import_module(f"stages.{module_of(stage)}").READS]


@pytest.mark.parametrize("name", sorted(STAGES))
def test_dvc_params_are_exactly_the_keys_the_stage_reads(name):
    stage = STAGES[name].get("do", STAGES[name])
    reads = reads_of(STAGES[name])
    if name == "preflight":  # the one stage that tracks the whole file, keys no stage reads included
        assert stage["params"] == [{"params.yaml": None}]  # the DAG's checks read:
        assert reads == ["adversarial.cycles", "base", "task.base", "task.source", "task.train_clusters"]
        return
    assert sorted(stage["params"]) == sorted(reads)


def test_no_knob_on_a_command_line():
    """A cmd is `speedrun <name>` plus the run's ids: every knob reaches the stage through params.yaml."""
    for name, spec in STAGES.items():
        cmd = " ".join(spec.get("do", spec)["cmd"].split())
        assert re.fullmatch(r"speedrun (\w+)( --(arm|seed|cycle) \$\{[\w.]+\})*", cmd), (name, cmd)
        assert module_of(spec) == name, (name, cmd)


def test_every_key_is_read_by_some_stage():
    read = {r.split(".$")[0] for s in STAGES.values() for r in reads_of(s)}
    unread = [k for k, _ in params.leaves(Params) if not any(k == r or k.startswith(r + ".") for r in read)]
    assert not unread, f"params.yaml keys no stage reads: {unread}"


def test_the_committed_params_load_and_every_knob_has_help():
    p = params.load(REPO / "params.yaml")
    assert p.grpo.train.steps >= 1 and p.grpo.variants["density"].sampling == "density"
    assert all(f.metadata["help"] for _, f in params.leaves(Params))


@pytest.mark.parametrize("override, message", [
    ("grpo.train.stepz=5", "grpo.train.stepz: unknown key"),
    ("pretrain.steps=five", "pretrain.steps: expected int, got 'five'"),
    ("pretrain.steps=0", "pretrain.steps: must be >= 1"),
    ("grpo.train.steps=-1", "grpo.train.steps: must be >= 1"),
    ("rm.batch_size=0", "rm.batch_size: must be >= 1"),
    ("grpo.train.adv_scale=grp", "grpo.train.adv_scale: expected one of group, batch, none"),
    ("eval.reward_keep=1.5", "eval.reward_keep: must be <= 1"),
    ("grpo.seeds=[1, 1]", "grpo.seeds: expected a non-empty list of distinct values"),
    ("sft.hf_name=", "sft.hf_name: expected a string, got nothing"),
    ("grpo.train.lr=.inf", "grpo.train.lr: must be a finite number, got inf"),
    ("adversarial.rm.save_every=5", "adversarial.rm.save_every: must be <= 0"),  # it was accepted and did nothing
    ("grpo.variants={'tic_0.5': {sampling: uniform, reward: rm, tic_bonus: 0.5, tic_scope: all, entropy_bonus: 0.0}}",
     "grpo.variants.tic_0.5: a name of letters, digits, '_' and '-' only"),
    ("adversarial.cycles={'../x': {prev: 0, init: outs/pretrain}}", "adversarial.cycles.../x: a name of letters"),
    ("eval.control_temperatures=[0.4, -1.0]", "eval.control_temperatures[1]: must be > 0, got -1.0"),  # list items
    ("pairs.only=[hh, nope]", "pairs.only[1]: expected one of hh, uf, se, embedded, got 'nope'"),
    ("pairs.only=hh,uf,se", "pairs.only: expected a list, got the string 'hh,uf,se': write [hh,uf,se]"),
    ("eval.primary=ead_1_first,distinct_2_first", "eval.primary: expected a list, got the string"),
    ("eval.comparisons=['density:nope']", "eval.comparisons[0]: 'density:nope' must be 'a:b', two different arms of "
                                          "grpo.run"),
    ("task.eval.comparisons=['density:density']", "task.eval.comparisons[0]: 'density:density' must be 'a:b'"),
    ("task.run=[checker, nope]", "task.run[1]: 'nope' is not one of task.variants"),
    ("task.eval.run_temperatures=[0.75]", "task.eval.run_temperatures: must include task.train.temperature (1)"),
])
def test_a_bad_override_names_its_key(override, message):
    with pytest.raises(params.ParamsError, match=re.escape(message)):
        params.load(REPO / "params.yaml", [override])


def test_preflight_refuses_a_trained_cluster_the_task_does_not_have():
    from speedrun.data.task import TEMPLATES
    p = params.load(REPO / "params.yaml", ["task.train_clusters=[numbers, evns]"])
    with pytest.raises(params.ParamsError, match=re.escape("task.train_clusters[1]: 'evns' is not a cluster")):
        params.dag_check(p, "params.yaml", TEMPLATES)
    params.dag_check(params.load(REPO / "params.yaml"), "params.yaml", TEMPLATES)


@pytest.mark.parametrize("key", ["base", "task.base"])  # the chat track's, the task track's
@pytest.mark.parametrize("base", ["'gguf:'", "'hf: '", "smollm2", "/models/x.gguf"])  # YAML reads gguf: as a map
def test_preflight_refuses_a_base_model_it_cannot_name(base, key, tmp_path):
    p = params.load(REPO / "params.yaml", [f"{key}={base}"])
    want = f"params.yaml: {re.escape(key)}: .* is not a base model .own \\| smollm2"
    with pytest.raises(params.ParamsError, match=want):
        params.dag_check(p, "params.yaml")
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    for good in ("own", "smollm2-135m", f"gguf:{tmp_path / 'x.gguf'}", f"hf:{tmp_path}",
                 "hf:HuggingFaceTB/SmolLM2-360M-Instruct"):  # a hub id: downloaded on a node
        params.dag_check(params.load(REPO / "params.yaml", [f"{key}={good}"]), "params.yaml")


@pytest.mark.parametrize("key", ["base", "task.base"])
@pytest.mark.parametrize("base, what", [("gguf:/nonexistent/x.gguf", "file"), ("gguf:models/x.gguf", "file"),
                                        ("hf:/nonexistent/folder", "folder"), ("hf:./no/such/folder", "folder")])
def test_preflight_refuses_a_local_base_that_is_not_there(base, what, key):
    """Before DVC removes the base stage's output, not inside the stage after it has."""
    p = params.load(REPO / "params.yaml", [f"{key}={base}"])
    want = f"params.yaml: {re.escape(key)}: " + re.escape(f"'{base}': no {what} ")
    with pytest.raises(params.ParamsError, match=want):
        params.dag_check(p, "params.yaml")


def test_preflight_links_a_local_base_for_dvc_to_hash(tmp_path):
    """outs/base_checkpoint (base) and outs/task_base_checkpoint (task.base): a link to the local checkpoint (DVC
    follows it: test_pipeline.py), else to preflight's own text; always a link (a file turned into a link breaks
    the next `dvc exp run`: test_pipeline.py runs two base experiments in a row)."""
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    (tmp_path / "m.gguf").write_bytes(b"GGUF v1")
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'src'}"}
    gguf = f"gguf:{tmp_path / 'm.gguf'}"
    for chat, task in (("own", "own"), (gguf, "own"), ("own", gguf), ("own", "own")):
        res = subprocess.run([sys.executable, "-m", "speedrun", "preflight", "-S", f"base={chat}", "-S",
                              f"task.base={task}", "--out", "pf.txt", "--base", "chat_link", "--task-base",
                              "task_link"], cwd=tmp_path, capture_output=True, text=True, env=env)
        assert res.returncode == 0, res.stderr
        for link, base in ((tmp_path / "chat_link", chat), (tmp_path / "task_link", task)):
            assert link.is_symlink()
            assert link.read_bytes() == (b"GGUF v1" if base != "own" else (tmp_path / "pf.txt").read_bytes())


def test_every_wheel_base_has_its_wheel():
    from speedrun.pretrained import BASES
    assert set(BASES) == set(params.WHEEL_BASES)


def test_the_matched_primary_needs_run_temperatures():
    with pytest.raises(params.ParamsError, match="task.eval.primary: matched reads each run on its own temperature"):
        params.load(REPO / "params.yaml", ["task.eval.primary=matched", "task.eval.run_temperatures=[1.0]"])


def test_a_list_knob_is_one_dvc_experiment_and_a_comma_string_a_sweep():
    """DVC's own -S parser: the list form is one run with three sources; the comma form is a sweep of three runs,
    which is why a list knob refuses a comma string (above) instead of reading it as one value."""
    from dvc.utils.cli_parse import to_path_overrides
    from dvc.utils.hydra import get_hydra_sweeps

    one = get_hydra_sweeps(to_path_overrides(["pairs.only=[hh,uf,se]"]))
    assert len(one) == 1
    assert params.load(REPO / "params.yaml", one[0]["params.yaml"]).pairs.only == ["hh", "uf", "se"]
    assert len(get_hydra_sweeps(to_path_overrides(["pairs.only=hh,uf,se"]))) == 3


def test_params_read_as_dvc_reads_them(tmp_path):
    """YAML 1.2, DVC's reading: `1e-3` is a number in the file and in -S (PyYAML's YAML 1.1 reads a string)."""
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text().replace("  lr: 0.0001\n", "  lr: 1e-4\n"))
    assert params.load(tmp_path / "params.yaml").grpo.train.lr == 0.0001
    assert params.load(REPO / "params.yaml", ["grpo.train.lr=1e-3"]).grpo.train.lr == 0.001


@pytest.mark.parametrize("stage, ids, message", [
    ("grpo", ["--arm", "../../../evil", "--seed", "1"], "--arm '../../../evil': letters, digits, '_' and '-' only"),
    ("grpo", ["--arm", "nope", "--seed", "1"], "--arm 'nope': not one of grpo.variants (density, baseline"),
    ("task_grpo", ["--arm", "baseline", "--seed", "1"], "--arm 'baseline': not one of task.variants (checker, "),
])
def test_a_run_id_cannot_leave_the_workspace_or_name_nothing(stage, ids, message):
    """One word per role in both tracks (--arm); the section it names is the one the stage reads."""
    res = subprocess.run([sys.executable, "-m", f"stages.{stage}", *ids], cwd=REPO, capture_output=True, text=True)
    assert res.returncode != 0 and message in res.stderr, res.stderr


def test_an_error_names_where_the_value_came_from(tmp_path):
    """A bad value given with -S names the -S; one in the file names the file. --help with a bad params.yaml shows
    the help and the error, not a traceback."""
    with pytest.raises(params.ParamsError, match=re.escape("-S grpo.train.steps=-1: grpo.train.steps: must be >= 1")):
        params.load(REPO / "params.yaml", ["beta=0.1", "grpo.train.steps=-1"])
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text().replace("\nbeta:", "\nbetta:"))
    with pytest.raises(params.ParamsError, match=re.escape(f"{tmp_path / 'params.yaml'}: betta: unknown key")):
        params.load(tmp_path / "params.yaml", ["grpo.train.steps=5"])
    res = subprocess.run([sys.executable, "-m", "stages.grpo", "--help"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode != 0 and "--arm" in res.stdout and "betta: unknown key" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_a_typo_in_the_file_stops_a_stage_in_about_a_second(tmp_path):
    original = (REPO / "params.yaml").read_text()
    text = re.sub(r"(\ngrpo:\n(?:.*\n)*?  train:\n    )steps:", r"\1stepz:", original, count=1)
    assert text != original  # else the stage would run a whole GRPO run
    (tmp_path / "params.yaml").write_text(text)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "stages.grpo", "--arm", "density", "--seed", "1", "--params",
                          str(tmp_path / "params.yaml")], cwd=REPO, capture_output=True, text=True)
    assert res.returncode != 0 and "grpo.train.stepz: unknown key" in res.stderr, res.stderr
    assert time.perf_counter() - t0 < 30  # before loading any model (a generous bound for a loaded CI machine)


def test_a_stage_cannot_read_a_key_it_does_not_declare():
    view = params.StageView(params.load(REPO / "params.yaml"), ["seed", "corpus.val_frac", "grpo.variants.density"])
    assert view.corpus.val_frac == 0.1 and view.grpo.variants["density"].sampling == "density"
    for read in (lambda: view.corpus.source, lambda: view.beta, lambda: view.grpo.variants["baseline"]):
        with pytest.raises(AttributeError, match="not declared in the stage's READS"):
            read()


def test_help_lists_every_key_the_stage_reads_with_its_value():
    out = subprocess.run([sys.executable, "-m", "stages.grpo", "--help"], cwd=REPO, capture_output=True,
                         text=True).stdout
    for key in ("beta = 0.04", "grpo.train.top_k = 0", "grpo.train.max_prompt_len = 0", "grpo.density.k = 50",
                "compute.dtype = 'auto'"):
        assert key in out, key
    assert "-S, --set KEY=VALUE" in out and "[grpo.density]" in out  # keys grouped by section


# knobs that once had their only default in code: each is now in params.yaml and in its stage's dvc.yaml params:,
# so `dvc exp run -S` reaches it (tests/test_pipeline.py runs one through DVC)
HIDDEN = {"grpo": ["grpo.train.warmup_steps", "grpo.train.top_k", "grpo.train.max_prompt_len", "grpo.train.grad_clip"],
          "pretrain": ["pretrain.weight_decay", "pretrain.final_lr_frac", "pretrain.grad_clip", "pretrain.micro_batch"],
          "sft": ["sft.weight_decay", "sft.final_lr_frac", "sft.grad_clip", "sft.micro_batch", "sft.micro_tokens"],
          "train_rm": ["rm.weight_decay", "rm.final_lr_frac", "rm.grad_clip", "rm.micro_batch", "rm.micro_tokens"],
          "tokenizer": ["tokenizer.max_chars"], "eval_diversity": ["eval.max_prompt_len"]}


@pytest.mark.parametrize("stage", sorted(HIDDEN))
def test_formerly_hidden_knobs_are_tracked(stage):
    declared = STAGES[stage].get("do", STAGES[stage])["params"]
    p = params.load(REPO / "params.yaml")
    for key in HIDDEN[stage]:
        params.value_at(p, key)  # in params.yaml
        assert any(key == d or key.startswith(d + ".") for d in declared), (stage, key)


def test_yaml_anchors_and_aliases_are_refused_at_load(tmp_path):
    """An alias can expand a few lines into gigabytes: refused before anything is built, naming the line."""
    text = (REPO / "params.yaml").read_text().replace("\nbeta: 0.04", "\nbeta: &b 0.04\nbetb: *b", 1)
    (tmp_path / "params.yaml").write_text(text)
    with pytest.raises(params.ParamsError, match=r"params.yaml: line \d+: YAML anchors and aliases are refused"):
        params.load(tmp_path / "params.yaml")
    with pytest.raises(params.ParamsError, match="anchors and aliases are refused"):
        params.load(REPO / "params.yaml", ["grpo.seeds=[&a 1, *a]"])


def test_a_free_string_has_a_length_bound():
    with pytest.raises(params.ParamsError, match=re.escape("grpo.controls.tic: a string of 100,000 characters: at "
                                                           "most 1,000")):
        params.load(REPO / "params.yaml", ["grpo.controls.tic=" + "x" * 100_000])


@pytest.mark.parametrize("override", ["grpo.train.lr=" + "9" * 100_000, "task.run=[" + "x" * 100_000 + "]",
                                      "grpo.train." + "k" * 100_000 + "=1", "pairs.only=" + "a," * 50_000])
def test_an_error_about_a_huge_value_stays_short(override):
    with pytest.raises(params.ParamsError) as e:
        params.load(REPO / "params.yaml", [override])
    assert len(str(e.value)) < 1000, len(str(e.value))


@pytest.mark.parametrize("override, message", [
    ("eval.primary=[ead_1_firts]", "eval.primary[0]: expected one of distinct_1"),
    ("rm.train_kinds=[sft_sampel]", "rm.train_kinds[0]: expected one of sft_sample, hard, random"),
    ("task.rm.train_kinds=[tsk]", "task.rm.train_kinds[0]: expected one of"),
])
def test_names_of_metrics_and_pair_kinds_are_checked_at_load(override, message):
    with pytest.raises(params.ParamsError, match=re.escape(message)):
        params.load(REPO / "params.yaml", [override])


def test_the_primary_names_are_the_evaluations_metrics():
    import typing
    from speedrun.config import DiversityMetric
    from speedrun.eval.compare import METRIC_BY_NAME
    assert set(typing.get_args(DiversityMetric)) <= set(METRIC_BY_NAME)


@pytest.mark.parametrize("init", ["/etc", "../elsewhere", "outs/../../x", "outs/link"])
def test_preflight_refuses_an_init_outside_the_workspace(tmp_path, init):
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    (tmp_path / "outs").mkdir()
    (tmp_path / "outs" / "link").symlink_to("/etc")  # inside by name, outside through the link
    res = subprocess.run([sys.executable, "-m", "speedrun", "preflight", "-S", f"adversarial.cycles.1.init={init}",
                          "--out", str(tmp_path / "pf.txt")], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'src'}"})
    assert res.returncode != 0 and "adversarial.cycles.1.init" in res.stderr and "inside the workspace" in res.stderr
    assert "Traceback" not in res.stderr, res.stderr  # a user's failure: one line
    assert not (tmp_path / "pf.txt").exists()
