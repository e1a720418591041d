"""Checkpoints: model.pt (a plain state dict) + meta.json (config, tokenizer digest, step, metrics; "arch" for a model
other than the lab's GPT). Everything loads with torch.load(weights_only=True): no pickled code."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from speedrun.common import UserError, read_json, torch_load, torch_save, write_json
from speedrun.llama import Llama, LlamaConfig
from speedrun.model import GPT, GPTConfig

ARCHS = {"gpt": (GPT, GPTConfig), "llama": (Llama, LlamaConfig)}  # meta.json's "arch": the model and its config
Config = GPTConfig | LlamaConfig


def arch(config: Config) -> str:
    return next(name for name, (_, cls) in ARCHS.items() if isinstance(config, cls))


def build(config: Config) -> GPT | Llama:
    """A fresh model of the config's architecture (weights from a state dict next)."""
    return ARCHS[arch(config)][0](config)


def model_config(meta: dict, where: Path | str) -> Config:
    """The config a checkpoint's meta.json records (no "arch": the lab's GPT, as every checkpoint before it)."""
    name = meta.get("arch", "gpt")
    if name not in ARCHS:
        raise UserError(f"{where}: arch {name!r} is not one the lab builds ({sorted(ARCHS)})")
    return ARCHS[name][1](**meta["config"])


def save_model(out_dir: Path, state_dict: dict[str, torch.Tensor], config: Config, meta: dict) -> None:
    out_dir = Path(out_dir)
    torch_save(out_dir / "model.pt", {k: v.detach().cpu().contiguous() for k, v in state_dict.items()})
    kind = {} if isinstance(config, GPTConfig) else {"arch": arch(config)}  # a GPT's meta as it always was
    write_json(out_dir / "meta.json", {"config": asdict(config), **kind, **meta})


def load_meta(ckpt_dir: Path) -> dict:
    return read_json(Path(ckpt_dir) / "meta.json")


def context_length(value: int, ckpt_dir: Path, reserve: int = 0, key: str = "max_len") -> int:
    """A length knob's value, or where it is 0 the context of the checkpoint's model (its seq_len) less `reserve`
    (the tokens generated after a prompt): post-training lengths follow model.seq_len unless set."""
    if value:
        return value
    seq_len = load_meta(ckpt_dir)["config"]["seq_len"]
    if seq_len - reserve < 3:
        raise UserError(f"{key} 0: the model's context ({seq_len} tokens, {ckpt_dir}) less the {reserve} generated "
                         f"after the prompt leaves {seq_len - reserve}: set {key}")
    return seq_len - reserve


def load_model(ckpt_dir: Path, device: str = "cpu", tokenizer_digest: str | None = None
               ) -> tuple[GPT | Llama, dict]:
    """The model of a checkpoint dir (the lab's GPT, or a pretrained Llama), on device, in eval mode; checks the
    tokenizer it was trained with."""
    meta = load_meta(ckpt_dir)
    if tokenizer_digest and meta.get("tokenizer") not in (None, tokenizer_digest):
        raise UserError(f"{ckpt_dir}: trained with tokenizer {meta['tokenizer']}, not {tokenizer_digest}")
    model = build(model_config(meta, Path(ckpt_dir) / "meta.json"))
    model.load_state_dict(torch_load(Path(ckpt_dir) / "model.pt"))
    return model.to(device).eval(), meta


def save_resume(path: Path, state: dict, best_state: dict[str, torch.Tensor] | None, best_step: int | None,
                written: int | None) -> int | None:
    """The resume file: model, optimizer and counters (state, with its "step"). The best-by-eval weights are not in it:
    when they are the model's (the save follows the eval that chose them) nothing more is written, else they go to
    best_<step>.pt beside it, once per new best (`written`: the best step already there). Returns the best step held
    apart. The resume file is replaced before an older best file is removed, so a kill leaves a consistent pair."""
    path = Path(path)
    apart = path.with_name(f"best_{best_step}.pt") if best_state is not None and best_step != state["step"] else None
    if apart is not None and written != best_step:
        torch_save(apart, best_state)
    torch_save(path, {**state, "best_step": best_step})
    for old in path.parent.glob("best_*.pt"):
        if old != apart:
            old.unlink()
    return best_step if apart is not None else None


def load_resume(path: Path, fingerprint: str) -> dict | None:
    """The scratch state of an interrupted run with the same settings (its "best_state" restored), or None."""
    path = Path(path)
    if not path.exists():
        return None
    state = torch_load(path)
    if state.get("fingerprint") != fingerprint or "best_step" not in state:  # other settings, or an older layout
        return None
    best_step = state["best_step"]
    if best_step is None:
        state["best_state"] = None
    elif best_step == state["step"]:
        state["best_state"] = {k: v.clone() for k, v in state["model"].items()}
    else:
        apart = path.with_name(f"best_{best_step}.pt")
        if not apart.exists():
            raise FileNotFoundError(f"{path}: its best weights (step {best_step}) should be in {apart}, which is "
                                    f"missing. Delete {path.parent} to train from the start")
        state["best_state"] = torch_load(apart)
    return state


def clear_resume(path: Path) -> None:
    """A finished run leaves no resume state behind: a later run with other settings must not pick it up."""
    path = Path(path)
    for f in [path, *path.parent.glob("best_*.pt")]:
        if f.exists():
            f.unlink()
