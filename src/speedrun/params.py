"""params.yaml: the one place every knob's default lives.

Stage flags that dvc.yaml templates from params.yaml (`--lr ${sft.lr}`) take their defaults from it
(`param_default`, via speedrun.cli), so `python -m stages.<name>` with no flags does what `dvc repro` does with the
committed params (tests/test_params.py checks every flag). Stages that need more of it than flags carry (the GRPO
runs: variants x seeds) read it with `load` and `grpo_variants`.
"""
from __future__ import annotations

import functools
import dataclasses
from pathlib import Path
from typing import Any, TypeVar

import yaml

PARAMS = Path("params.yaml")


def repo_file(name: str) -> Path:
    """`name` in the working directory (the repository root, where DVC runs the stages), else the checkout's own
    (for runs from elsewhere)."""
    here = Path(name)
    return here if here.is_file() else Path(__file__).resolve().parents[2] / name


def load(path: Path = PARAMS) -> dict[str, Any]:
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: params file not found (run from the repository root)")
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f) or {}


@functools.lru_cache(maxsize=None)
def _defaults(path: str) -> dict[str, Any]:
    return load(Path(path))


def param_default(key: str) -> Any:
    """The value of a dotted params.yaml key (e.g. "rm.steps"): params.yaml of the working directory (the
    repository root, where DVC runs the stages), else the checkout's own."""
    value: Any = _defaults(str(repo_file(str(PARAMS))))
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(f"params.yaml has no {key!r} (a stage's flag default names it)")
        value = value[part]
    return value


T = TypeVar("T")


def from_options(cls: type[T], options: dict[str, Any], **fixed: Any) -> T:
    """A config dataclass from a stage's options (its locals()): every field the stage has a flag for, plus `fixed`;
    the rest keep the dataclass's defaults. One line instead of each field spelled out again."""
    names = {f.name for f in dataclasses.fields(cls)} - set(fixed)
    return cls(**{k: options[k] for k in names if k in options}, **fixed)


def grpo_variants(params: dict[str, Any], where: str = "params.yaml") -> tuple[dict[str, str], list[int]]:
    """({variant: sampling mode}, training seeds) from grpo.variants and grpo.seeds: one GRPO run per pair."""
    grpo = params.get("grpo", {})
    variants, seeds = grpo.get("variants") or {}, grpo.get("seeds") or []
    if not variants or not seeds:
        raise ValueError(f"{where}: grpo.variants and grpo.seeds must both be non-empty")
    if len(set(seeds)) != len(seeds) or not all(isinstance(s, int) for s in seeds):
        raise ValueError(f"{where}: grpo.seeds must be distinct integers, got {seeds}")
    for name, spec in variants.items():
        if not isinstance(spec, dict) or set(spec) != {"sampling"}:
            raise ValueError(f"{where}: grpo.variants.{name} must be {{sampling: density|uniform}}, got {spec}")
    return {str(name): spec["sampling"] for name, spec in variants.items()}, [int(s) for s in seeds]
