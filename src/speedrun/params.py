"""params.yaml, read by the stages that need more of it than flags can carry (the GRPO runs: variants x seeds)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

PARAMS = Path("params.yaml")


def load(path: Path = PARAMS) -> dict[str, Any]:
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: params file not found (run from the repository root)")
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f) or {}


def grpo_runs(params: dict[str, Any], where: str = "params.yaml") -> dict[str, dict[int, str]]:
    """{variant: {training seed: sampling mode}} from grpo.variants x grpo.seeds: one GRPO run each."""
    grpo = params.get("grpo", {})
    variants, seeds = grpo.get("variants") or {}, grpo.get("seeds") or []
    if not variants or not seeds:
        raise ValueError(f"{where}: grpo.variants and grpo.seeds must both be non-empty")
    if len(set(seeds)) != len(seeds) or not all(isinstance(s, int) for s in seeds):
        raise ValueError(f"{where}: grpo.seeds must be distinct integers, got {seeds}")
    out = {}
    for name, spec in variants.items():
        if not isinstance(spec, dict) or set(spec) != {"sampling"}:
            raise ValueError(f"{where}: grpo.variants.{name} must be {{sampling: density|uniform}}, got {spec}")
        out[str(name)] = {int(s): spec["sampling"] for s in seeds}
    return out
