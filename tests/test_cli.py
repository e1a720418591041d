"""speedrun.cli: a stage's flag defaults come from its dvc.yaml cmd (params resolved), else the stage, else FLAGS."""
import inspect
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from speedrun import cli, params

DVC_YAML = """
stages:
  one:
    cmd: >-
      python -m stages.test_cli --lr ${train.lr} --out-dir outs/one --pairs a.parquet --pairs b.parquet
      --seed ${item.seed} --metrics reports/${key}.json --no-hh
  other:
    cmd: python -m stages.other --lr 1
"""


@pytest.fixture
def pipeline(tmp_path, monkeypatch):
    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    (tmp_path / "params.yaml").write_text("train:\n  lr: 0.25\n")
    monkeypatch.chdir(tmp_path)
    cli._stage_cmds.cache_clear()
    params._defaults.cache_clear()
    yield tmp_path
    cli._stage_cmds.cache_clear()
    params._defaults.cache_clear()


def test_cmd_values_resolve_params_and_skip_per_run_values(pipeline):
    assert cli.cmd_values("test_cli") == {"lr": 0.25, "out_dir": "outs/one", "pairs": ["a.parquet", "b.parquet"],
                                          "no_hh": True}
    with pytest.raises(KeyError, match="no stage runs `python -m stages.nope`"):
        cli.cmd_values("nope")


def test_defaults_from_the_cmd_then_the_stage_then_flags(pipeline):
    @cli.stage_flags(seed=7)
    def main(lr: float, out_dir: Path, pairs: list[Path], seed: int, metrics: Path, no_hh: bool,
             weight_decay: float) -> None:
        print(lr, out_dir, pairs, seed, metrics, no_hh, weight_decay)

    options = {n: p.default for n, p in inspect.signature(main).parameters.items()}
    assert options["lr"].default == 0.25 and options["out_dir"].default == Path("outs/one")
    assert options["pairs"].default == [Path("a.parquet"), Path("b.parquet")]
    assert options["seed"].default == 7  # per-run in dvc.yaml: the stage's own
    assert options["metrics"].default is ...  # per-run and no default anywhere: required
    assert options["weight_decay"].default == cli.FLAGS["weight_decay"][0]
    assert options["lr"].help == cli.FLAGS["lr"][1]
    app = typer.Typer()
    app.command()(main)
    out = CliRunner().invoke(app, ["--metrics", "m.json", "--lr", "0.5"])
    assert out.exit_code == 0, out.output
    assert out.output.split() == ["0.5", "outs/one", "[PosixPath('a.parquet'),", "PosixPath('b.parquet')]", "7",
                                  "m.json", "True", "0.0"]
    assert "--no-no-hh" not in CliRunner().invoke(app, ["--help"]).output  # a switch, not a --x/--no-x pair


def test_a_flag_without_help_or_a_stray_default_is_an_error(pipeline):
    with pytest.raises(KeyError, match="'learning_rate' has no entry in speedrun.cli.FLAGS"):
        @cli.stage_flags()
        def main(learning_rate: float) -> None: ...
    with pytest.raises(KeyError, match=r"defaults for flags it does not have: \['seed'\]"):
        @cli.stage_flags(seed=1)
        def main2(lr: float) -> None: ...


def test_flag_defaults_agree_with_the_library_configs():
    """A knob params.yaml does not hold has its CLI default in FLAGS; where a library config has a field of that name
    (TrainConfig, GRPOConfig), the two defaults must not drift apart."""
    import dataclasses
    from speedrun.rl.trainer import GRPOConfig
    from speedrun.train.loop import TrainConfig
    checked = []
    for config in (TrainConfig, GRPOConfig):
        for field in dataclasses.fields(config):
            default = cli.FLAGS.get(field.name, (cli.NONE,))[0]
            if default is not cli.NONE and field.default is not dataclasses.MISSING:
                assert default == field.default, (config.__name__, field.name, default, field.default)
                checked.append(field.name)
    assert {"weight_decay", "final_lr_frac", "grad_clip", "top_k", "inner_updates"} <= set(checked)
