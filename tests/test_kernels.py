"""The compiled CPU kernels (speedrun.kernels): the same sums as PyTorch's ops, masked keys unread, results that do not
depend on the thread count, clear errors on bad input, and the Llama's decode using them."""
import pytest
import torch
import torch.nn.functional as F

import speedrun.kernels as kernels
from speedrun.engine import generate
from speedrun.kernels import fused_decode_attention, fused_rms_norm, fused_silu_mul, kernels_built
from speedrun.model import batched_attention, one_query_attention
from test_engine import PROMPTS, tiny_llama

torch.set_num_threads(1)
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # bf16: the products path rounds its scores and weights to bf16


def test_the_kernels_build_here():
    assert kernels_built(), "speedrun.kernels could not build cpu_kernels.cpp: see the message above (a C++ compiler " \
                            "with OpenMP and ninja are needed; without them the decode runs PyTorch's ops, slower)"


def attention_inputs(B: int, Hkv: int, G: int, S: int, D: int, dtype: torch.dtype, seed: int = 0):
    """q [B, Hkv * G, 1, D], k, v [B, Hkv, S, D] and a decode's key mask: row b has b % 4 left pads, its last b % 3
    columns not yet written, and odd rows a masked column inside (an ended row's); every masked column holds NaN (a
    kernel that weighed one would return NaN)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*shape, generator=g).to(dtype) for shape in
               [(B, Hkv * G, 1, D), (B, Hkv, S, D), (B, Hkv, S, D)])
    cols = torch.arange(S)
    valid = (cols[None] >= (torch.arange(B) % 4)[:, None]) & (cols[None] < S - (torch.arange(B) % 3)[:, None])
    valid[1::2, S // 2] = False
    k, v = (t.masked_fill(~valid[:, None, :, None], float("nan")) for t in (k, v))
    return q, k, v, valid


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D,G,S", [(64, 3, 37), (128, 2, 16), (32, 4, 50), (16, 1, 5), (24, 3, 21)])
def test_decode_attention_matches_the_batched_products(dtype, D, G, S):
    q, k, v, valid = attention_inputs(5, 2, G, S, D, dtype)
    got = one_query_attention(q, k, v, valid[:, None, None])
    assert got.dtype == dtype and got.shape == q.shape and torch.isfinite(got).all()
    clean = [t.nan_to_num(0.0) for t in (k, v)]  # the products multiply every column: no NaN for them
    want = batched_attention(q.float(), *(t.float() for t in clean), valid[:, None, None])
    torch.testing.assert_close(got.float(), want, atol=TOL[dtype], rtol=TOL[dtype])


def test_kernels_give_the_same_bits_on_one_thread_and_on_two():
    q, k, v, valid = attention_inputs(16, 3, 3, 70, 64, torch.bfloat16)
    x, gate, up = torch.randn(64, 1, 576), torch.randn(64, 1, 1536).bfloat16(), torch.randn(64, 1, 1536).bfloat16()
    w = torch.randn(576)
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        outs.append((one_query_attention(q, k, v, valid[:, None, None]), fused_rms_norm(x, w, 1e-5),
                     fused_silu_mul(gate, up)))
    torch.set_num_threads(1)
    assert all(torch.equal(a, b) for a, b in zip(*outs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_and_silu_mul_match_torch(dtype):
    x, w = torch.randn(7, 3, 576).to(dtype), torch.randn(576)
    want = F.rms_norm(x.float(), (576,), w, 1e-5)
    torch.testing.assert_close(fused_rms_norm(x, w, 1e-5).float(), want, atol=TOL[dtype], rtol=TOL[dtype])
    gate, up = torch.randn(7, 3, 100).to(dtype) * 6, torch.randn(7, 3, 100).to(dtype)  # silu far into both tails
    want = F.silu(gate.float()) * up.float()
    got = fused_silu_mul(gate, up)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want, atol=TOL[dtype], rtol=TOL[dtype])
    gate[0, 0, 0] = float("nan")
    assert fused_silu_mul(gate, up)[0, 0, 0].isnan()  # a NaN stays a NaN (the bf16 rounding keeps it)


def test_the_kernels_stand_aside_where_they_do_not_apply():
    q, k, v, valid = attention_inputs(2, 1, 2, 8, 16, torch.float32)
    grouped = q.view(2, 1, 2, 16)
    assert fused_decode_attention(grouped.half(), k.half(), v.half(), valid) is None  # fp16: PyTorch's ops
    assert fused_decode_attention(grouped, k.bfloat16(), v, valid) is None  # mixed dtypes
    wanting = grouped.clone().requires_grad_()
    assert fused_decode_attention(wanting, k, v, valid) is None  # no backward
    with torch.no_grad():
        assert fused_decode_attention(wanting, k, v, valid) is not None
    w = torch.ones(16, requires_grad=True)
    assert fused_rms_norm(q, w, 1e-5) is None and fused_silu_mul(q, q.half()) is None


def test_bad_input_names_the_kernel_and_what_is_wrong():
    q, k, v, valid = attention_inputs(2, 1, 2, 8, 16, torch.float32)
    ops = torch.ops.speedrun_kernels
    with pytest.raises(RuntimeError, match="decode_attention: q, k, v and valid disagree"):
        ops.decode_attention(q.view(2, 1, 2, 16), k, v, valid[:, :5], 0.25)
    with pytest.raises(RuntimeError, match="rms_norm: an fp32 weight as wide"):
        ops.rms_norm(q, torch.ones(15), 1e-5)
    with pytest.raises(RuntimeError, match="silu_mul: gate and up"):
        ops.silu_mul(q, q[:1])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_llama_decodes_through_the_kernels_with_the_same_tokens(family, monkeypatch):
    model = tiny_llama(family)
    ran, real = [], kernels._kernels

    def counted(*tensors):  # the kernels' calls that ran (not PyTorch's fallback)
        ops = real(*tensors)
        ran.extend([1] if ops is not None else [])
        return ops

    monkeypatch.setattr(kernels, "_kernels", counted)
    with torch.no_grad():
        fused = generate(model, PROMPTS, num_samples=2, max_new_tokens=8, temperature=0.0)
        used = len(ran)
        monkeypatch.setattr(kernels, "_kernels", lambda *t: None)  # PyTorch's ops for the same decode
        plain = generate(model, PROMPTS, num_samples=2, max_new_tokens=8, temperature=0.0)
    assert used >= 7 * 2 * 3  # every decode step: each block's two norms, its attention and its SwiGLU
    assert torch.equal(fused.tokens, plain.tokens)
