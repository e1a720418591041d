"""`speedrun`: one Typer command per DVC stage, in DAG order. `speedrun --help` lists them; `speedrun <stage> --help`
lists the stage's options and every params.yaml key it reads. dvc.yaml's cmds are these commands: run by hand with no
options a stage does what `dvc repro` does (git-tracked reports aside: see speedrun.stage)."""
from __future__ import annotations

import ast
import functools
import importlib
import os
import sys
from pathlib import Path

import typer
import yaml

from speedrun.typer_app import FAILURE_HELP

STAGES = ("preflight", "corpus", "tokenizer", "pretrain", "base", "sft",  # the base model
          "task_data", "task_base", "task_sft", "task_rm", "task_grpo", "task_eval",  # the task track
          "download_pairs", "dedup_prompts", "onpolicy_pairs", "train_rm", "grpo", "eval_diversity",  # the chat track
          "adv_data", "adv_rm", "adv_grpo", "adv_eval")  # the adversarial cycle

app = typer.Typer(help=__doc__, epilog=FAILURE_HELP, no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  pretty_exceptions_enable=False, context_settings={"max_content_width": 120})


def stages_dir() -> Path:
    """The stages of the working directory (the repository root, as `python -m stages.<name>` would use), else the
    checkout's own."""
    here = Path.cwd() / "stages"
    return here if (here / "__init__.py").is_file() else Path(__file__).resolve().parents[2] / "stages"


@functools.cache
def dag_stages() -> dict:
    """dvc.yaml's stages (read once: every command's help line comes from it)."""
    dag = stages_dir().parent / "dvc.yaml"
    return yaml.load(dag.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))["stages"] \
        if dag.is_file() else {}


def summary(name: str) -> str:
    """A stage's one line: its dvc.yaml desc (what `dvc stage list` shows), else the first sentence of its module
    docstring; read without importing the stage (no torch)."""
    if desc := dag_stages().get(name, {}).get("desc"):
        return desc
    doc = ast.get_docstring(ast.parse((stages_dir() / f"{name}.py").read_text(encoding="utf-8"))) or ""
    first = " ".join(doc.split()).split(". ")[0].rstrip(".")
    return first.split(": ", 1)[1] if first.startswith("Stage ") and ": " in first else first


def invoke(name: str, argv: list[str]) -> None:
    """Run stage `name` with its command line."""
    root = str(stages_dir().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from speedrun.stage import run_stage, stage_spec
    spec = stage_spec(stages_dir() / f"{name}.py")
    if "seed" in (spec.IDS or {}):  # a GRPO run: beside its track's other stale runs (speedrun.runs)
        return importlib.import_module("speedrun.runs").batch(name, argv, spec)
    mod = importlib.import_module(f"stages.{name}")
    run_stage(mod.main, mod.__doc__, mod.READS, mod.PATHS, getattr(mod, "IDS", None), argv=argv, name=name)


def _register(name: str) -> None:
    def command(ctx: typer.Context) -> None:
        invoke(name, list(ctx.args))
    app.command(name=name, help=summary(name), short_help=summary(name), add_help_option=False,
                context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(command)


for _name in STAGES:
    _register(_name)


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")  # a stage's lines reach DVC's log as they are printed
    from speedrun.common import die_with_parent
    die_with_parent()  # a stage ends with the DVC process or shell that started it
    app()


if __name__ == "__main__":
    main()
