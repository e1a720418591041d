"""One default per knob: every flag dvc.yaml's cmd passes a stage defaults to that value (params.yaml's for a
`${key}`, the path for an output), so a stage run by hand with no flags does what `dvc repro` does; --help still
documents every knob. Parsed here independently of speedrun.cli, which derives the defaults."""
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


def cmd_flags(stage: dict) -> tuple[str, dict[str, list[str]]]:
    """(stage module, {flag: [values as written]}) of a dvc.yaml stage; per-run values (foreach/matrix) left out."""
    cmd = " ".join(stage.get("do", stage)["cmd"].split())
    module = re.search(r"python -m stages\.(\w+)", cmd).group(1)
    flags: dict[str, list[str]] = {}
    for flag, value in re.findall(r"--([\w-]+) ([^-\s]\S*)", cmd):
        if not re.search(r"\$\{(item|key)\b", value):
            flags.setdefault(flag, []).append(value)
    return module, flags


def committed(key: str):
    value = COMMITTED
    for part in key.split("."):
        value = value[part]
    return value


def as_written(value) -> str:
    return str(value) if isinstance(value, Path) else value


@pytest.mark.parametrize("name", sorted(STAGES))
def test_flag_defaults_are_what_dvc_passes(name):
    module, flags = cmd_flags(STAGES[name])
    assert any(v[0].startswith("${") for v in flags.values()), name  # every stage has knobs in params.yaml
    signature = inspect.signature(importlib.import_module(f"stages.{module}").main)
    wrong = []
    for flag, values in flags.items():
        option = signature.parameters[flag.replace("-", "_")].default
        default = [as_written(v) for v in option.default] if isinstance(option.default, list) else \
            [as_written(option.default)]
        expected = [committed(v[2:-1]) if v.startswith("${") else v for v in values]
        if default != expected:
            wrong.append(f"--{flag}: default {default!r}, dvc.yaml passes {expected!r} ({values})")
    assert not wrong, f"stage {name} (stages/{module}.py):\n" + "\n".join(wrong)


@pytest.mark.parametrize("module", sorted({cmd_flags(s)[0] for s in STAGES.values()}))
def test_help_documents_every_flag(module):
    app = typer.Typer()
    app.command()(importlib.import_module(f"stages.{module}").main)
    out = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200", "TERM": "dumb"})
    assert out.exit_code == 0, out.output
    signature = inspect.signature(importlib.import_module(f"stages.{module}").main)
    flags = {name.replace("_", "-") for name, p in signature.parameters.items() if p.name != "ctx"}
    missing = [f for f in flags if f"--{f}" not in out.output]
    assert not missing, f"stages/{module}.py --help lacks {missing}"
    assert all(signature.parameters[f.replace("-", "_")].default.help for f in flags)


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
