"""One default per knob: every flag dvc.yaml templates from params.yaml defaults to that value, so a stage run by
hand with no flags trains what `dvc repro` trains; --help still documents every knob."""
import importlib
import inspect
import re
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from conftest import REPO
from speedrun import params

STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
COMMITTED = params.load(REPO / "params.yaml")


def templated_flags(stage: dict) -> tuple[str, dict[str, str]]:
    """(stage module, {flag: params key}) of a dvc.yaml stage (foreach/matrix items left out: per-run values)."""
    cmd = stage.get("do", stage)["cmd"]
    module = re.search(r"python -m stages\.(\w+)", cmd).group(1)
    flags = {f: k for f, k in re.findall(r"--([\w-]+) \$\{([\w.]+)\}", cmd) if not k.startswith(("item.", "key"))}
    return module, flags


def committed(key: str):
    value = COMMITTED
    for part in key.split("."):
        value = value[part]
    return value


@pytest.mark.parametrize("name", sorted(STAGES))
def test_flag_defaults_are_the_committed_params(name):
    module, flags = templated_flags(STAGES[name])
    assert flags or name == "interpreter", name  # the Python probe is the one stage without knobs
    signature = inspect.signature(importlib.import_module(f"stages.{module}").main)
    wrong = []
    for flag, key in flags.items():
        option = signature.parameters[flag.replace("-", "_")].default
        default = str(option.default) if isinstance(option.default, Path) else option.default
        if default != committed(key):
            wrong.append(f"--{flag}: default {default!r}, params.yaml {key} = {committed(key)!r}")
    assert not wrong, f"stage {name} (stages/{module}.py):\n" + "\n".join(wrong)


@pytest.mark.parametrize("module", sorted({templated_flags(s)[0] for s in STAGES.values()}))
def test_help_documents_every_templated_flag(module):
    app = typer.Typer()
    app.command()(importlib.import_module(f"stages.{module}").main)
    out = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200", "TERM": "dumb"})
    assert out.exit_code == 0, out.output
    flags = {f for s in STAGES.values() if templated_flags(s)[0] == module for f in templated_flags(s)[1]}
    missing = [f for f in flags if f"--{f}" not in out.output]
    assert not missing, f"stages/{module}.py --help lacks {missing}"


def test_param_default_names_a_missing_key():
    with pytest.raises(KeyError, match="no 'rm.nope'"):
        params.param_default("rm.nope")
    assert params.param_default("rm.steps") == committed("rm.steps")


def test_from_options_builds_a_config_from_a_stages_flags():
    """A stage's locals() -> its TrainConfig: the fields it has flags for, the fixed ones, dataclass defaults else."""
    from speedrun.train.loop import TrainConfig
    options = {"steps": 7, "lr": 0.5, "patience": 2, "dtype": "fp32", "out_dir": Path("x"), "monitor": "ignored"}
    cfg = params.from_options(TrainConfig, options, bf16=True, monitor="val_bpb")
    assert cfg == TrainConfig(steps=7, lr=0.5, patience=2, bf16=True, monitor="val_bpb")
    with pytest.raises(TypeError, match="steps"):  # a required field the stage lacks is an error, not a default
        params.from_options(TrainConfig, {"lr": 0.5})
