"""Checkpoints: model.pt (a plain state dict) + meta.json (config, tokenizer digest, step, metrics).
Everything loads with torch.load(weights_only=True): no pickled code."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from speedrun.common import read_json, torch_load, torch_save, write_json
from speedrun.model import GPT, GPTConfig


def save_model(out_dir: Path, state_dict: dict[str, torch.Tensor], config: GPTConfig, meta: dict) -> None:
    out_dir = Path(out_dir)
    torch_save(out_dir / "model.pt", {k: v.detach().cpu().contiguous() for k, v in state_dict.items()})
    write_json(out_dir / "meta.json", {"config": asdict(config), **meta})


def load_meta(ckpt_dir: Path) -> dict:
    return read_json(Path(ckpt_dir) / "meta.json")


def load_model(ckpt_dir: Path, device: str = "cpu", tokenizer_digest: str | None = None) -> tuple[GPT, dict]:
    """The GPT of a checkpoint dir, on device, in eval mode; checks the tokenizer it was trained with."""
    meta = load_meta(ckpt_dir)
    if tokenizer_digest and meta.get("tokenizer") not in (None, tokenizer_digest):
        raise ValueError(f"{ckpt_dir}: trained with tokenizer {meta['tokenizer']}, not {tokenizer_digest}")
    model = GPT(GPTConfig(**meta["config"]))
    model.load_state_dict(torch_load(Path(ckpt_dir) / "model.pt"))
    return model.to(device).eval(), meta


def save_resume(path: Path, state: dict) -> None:
    torch_save(path, state)


def load_resume(path: Path, fingerprint: str) -> dict | None:
    """The scratch state of an interrupted run with the same settings, or None."""
    path = Path(path)
    if not path.exists():
        return None
    state = torch_load(path)
    return state if state.get("fingerprint") == fingerprint else None
