"""A tiny random Llama (or Qwen2, Qwen3) written as transformers and llama.cpp write one: a Hugging Face folder (its
own byte-level BPE and a ChatML template) and the same checkpoint as a GGUF file (a Llama's query/key rows permuted as
llama.cpp's converter permutes them). tests/test_pretrained.py checks the loaders on it; the end-to-end test runs
the task track from it."""
import json
from pathlib import Path

import gguf
import numpy as np
import tokenizers
import torch
import transformers

from speedrun.pretrained import GGUF_BLOCK, GGUF_TOP

ROOT = Path(__file__).resolve().parents[1]
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
          "You are a tiny test model<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def corpus_texts() -> list[str]:
    """Paragraphs of the repository's own prose (English, code, numbers, markdown tables), without those that spell a
    special token: the lab never turns plain text into one, where the references' encoders do."""
    texts = []
    for f in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        texts += [t for t in f.read_text().split("\n\n") if t.strip() and not any(s in t for s in SPECIALS)]
    return texts + ["Hello world 12345  x", "  12 \n\n  a1b2 ", "naïve café 東京 €5", "\x00\x01 bytes \x7f"]


def reference_pre_tokenizer():
    """SmolLM2's split (llama.cpp's "smollm"; its hub tokenizer.json): digits one by one, then GPT-2's byte-level."""
    pt = tokenizers.pre_tokenizers
    return pt.Sequence([pt.Digits(individual_digits=True), pt.ByteLevel(add_prefix_space=False, use_regex=True)])


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: each head's rows reordered so its interleaved rotary pairs are adjacent."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM", {}),
            "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),  # biased query, key and value projections
            "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24})}  # head norms; heads 24 wide, not 64 / 4


def write_hf(folder: Path, tied: bool, seed: int = 0, family: str = "llama", vocab: int = 420, width: int = 64,
             ffn: int = 96, depth: int = 2, heads: int = 4, kv_heads: int = 2,
             context: int = 128) -> tuple[Path, object]:
    """A tiny random Llama, Qwen2 or Qwen3 (grouped-query attention, its own byte-level BPE of `vocab` words) saved as
    transformers saves one; the sizes default to the tests' model (bench/decode_smollm2.py's --base tiny is larger)."""
    tk = tokenizers.Tokenizer(tokenizers.models.BPE())
    tk.pre_tokenizer = reference_pre_tokenizer()
    tk.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, show_progress=False,
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(corpus_texts()[::2], trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tk.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|im_start|>", "chat_template": CHATML}))
    config_cls, model_cls, extra = FAMILIES[family]
    cfg = getattr(transformers, config_cls)(vocab_size=tk.get_vocab_size(), hidden_size=width, intermediate_size=ffn,
                                            num_hidden_layers=depth, num_attention_heads=heads,
                                            num_key_value_heads=kv_heads, rope_theta=500.0, rms_norm_eps=1e-5,
                                            tie_word_embeddings=tied, max_position_embeddings=context, **extra)
    torch.manual_seed(seed)
    ref = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():  # norms away from 1 and biases away from 0, so a misplaced one shows
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn_like(p))
    ref.save_pretrained(folder, safe_serialization=True)
    return folder, ref


def write_gguf(path: Path, folder: Path, types: dict[str, object] | None = None) -> Path:
    """The same checkpoint in llama.cpp's layout: GGML names, permuted query/key rows, the vocabulary and merges
    in the metadata; `types` quantizes tensors whose GGUF name contains a key."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "config.json").read_text())
    spec = json.loads((folder / "tokenizer.json").read_text())
    hf_to_gguf = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                  "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                  "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                  "mlp.down_proj": "ffn_down", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    assert set(hf_to_gguf.values()) == set(GGUF_BLOCK)
    arch = cfg["model_type"]
    w = gguf.GGUFWriter(str(path), arch)
    if cfg.get("head_dim") and cfg["head_dim"] * cfg["num_attention_heads"] != cfg["hidden_size"]:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    vocab = {**spec["model"]["vocab"], **{t["content"]: t["id"] for t in spec["added_tokens"]}}
    tokens = sorted(vocab, key=vocab.get)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]])
    w.add_bos_token_id(vocab["<|im_start|>"])
    w.add_chat_template(CHATML)
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    assert {v.split(".")[0] for v in top.values()} == set(GGUF_TOP)
    for name, t in load_file(folder / "model.safetensors").items():
        a = t.float().numpy()
        if name in top:
            out = top[name]
        else:
            stem, kind = name.removeprefix("model.layers.").rsplit(".", 1)
            layer, part = stem.split(".", 1)
            out = f"blk.{layer}.{hf_to_gguf[part]}.{kind}"
            if arch == "llama" and part == "self_attn.q_proj":  # only the Llama converter permutes
                a = permute(a, cfg["num_attention_heads"])
            elif arch == "llama" and part == "self_attn.k_proj":
                a = permute(a, cfg["num_key_value_heads"])
        qtype = next((q for key, q in (types or {}).items() if key in out), None)
        if qtype is None or a.ndim == 1:
            w.add_tensor(out, np.ascontiguousarray(a))
        else:
            w.add_tensor(out, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
