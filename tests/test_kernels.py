"""The compiled CPU kernels (speedrun.kernels): the same sums as PyTorch's ops (the same bits where the kernel claims
them: the residual add, the norm's rounding to the next product's dtype, the draw), masked keys unread, results that do
not depend on the thread count, clear errors on bad input, and the Llama's decode using them."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import speedrun.kernels as kernels
import speedrun.llama
import speedrun.model
from speedrun.engine import generate
from speedrun.kernels import (fused_add_rms_norm, fused_cdf_search, fused_decode_attention, fused_rms_norm,
                              fused_rotary_cache, fused_silu_mul, kernels_built)
from speedrun.model import KVCache, apply_rotary, batched_attention, one_query_attention, rotary
from test_engine import PROMPTS, tiny, tiny_llama
from test_packed import needs_onednn

torch.set_num_threads(1)
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # bf16: the products path rounds its scores and weights to bf16
ONE_ROUNDING = {torch.float32: 1e-6, torch.bfloat16: 2 ** -7}  # fp32 math rounded once to the dtype (bf16: 8 bits)


def test_the_kernels_build_here():
    assert kernels_built(), "speedrun.kernels could not build cpu_kernels.cpp: see the message above (a C++ compiler " \
                            "with OpenMP and ninja are needed; without them the decode runs PyTorch's ops, slower)"


def test_a_lock_a_killed_build_left_does_not_stall_the_next_build(tmp_path):
    """torch's builder waits while its baton file exists, and a build killed mid-way leaves it: a CI run waited on
    one until its time ran out. Under build_lock's flock the next build removes it, says so, and builds."""
    name = kernels.extension_name()
    (tmp_path / name).mkdir()
    (tmp_path / name / "lock").touch()  # what a process killed while it held torch's baton leaves
    run = subprocess.run([sys.executable, "-c", "import speedrun.kernels as k; print(k.kernels_built())"],
                         env={**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "True", run.stderr
    assert "which a killed build left" in run.stderr and not (tmp_path / name / "lock").exists()


def test_every_checkout_compiles_the_same_copy_of_the_sources():
    """The build compiles the copies in its own directory, not a checkout's files: a checkout elsewhere (the suite's
    copies of the repo) with the same sources finds it built instead of rebuilding it."""
    from torch.utils.cpp_extension import _get_build_directory

    assert kernels_built()
    build_dir = Path(_get_build_directory(kernels.extension_name(), verbose=False))
    ninja = (build_dir / "build.ninja").read_text()
    for f in kernels.SOURCES + [kernels.HEADER]:
        assert (build_dir / "src" / f.name).read_text() == f.read_text()
    assert f"compile {build_dir / 'src' / 'cpu_kernels.cpp'}" in ninja and str(kernels.SOURCES[0].parent) not in ninja


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D,G", [(64, 3), (64, 5), (128, 9), (32, 4)])
def test_decode_attention_gives_each_query_head_the_bits_it_gets_alone(dtype, D, G):
    """The kernel takes a key/value head's query heads together (groups of up to 4, 16 keys at a time); each head's
    output is the one it gets as the only query head of its key/value head."""
    q, k, v, valid = attention_inputs(4, 2, G, 37, D, dtype)
    together = one_query_attention(q, k, v, valid[:, None, None]).view(4, 2, G, D)
    for g in range(G):
        alone = one_query_attention(q.view(4, 2, G, 1, D)[:, :, g], k, v, valid[:, None, None])
        assert torch.equal(together[:, :, g], alone.view(4, 2, D)), f"query head {g} of {G}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D,shared", [(64, 9), (64, 40), (24, 9)])
def test_decode_attention_reads_a_prompts_columns_once_from_its_source_row(dtype, D, shared):
    """Rows 1 and 2 copy row 0's first `shared` columns, row 4 row 3's (a prompt's samples): told so, the kernel gives
    the bits it gives over the copies, with the copies' columns set to NaN (so it read the source rows')."""
    q, k, v, valid = attention_inputs(6, 2, 3, 40, D, dtype)
    source = torch.tensor([0, 0, 0, 3, 3, 5])
    k[:, :, :shared], v[:, :, :shared] = k[source, :, :shared], v[source, :, :shared]
    valid[:, :shared] = valid[source, :shared]
    want = one_query_attention(q, k, v, valid[:, None, None])
    copies = source != torch.arange(6)
    k[copies, :, :shared], v[copies, :, :shared] = float("nan"), float("nan")
    got = one_query_attention(q, k, v, valid[:, None, None], source, shared)
    assert torch.isfinite(want).all() and torch.equal(got, want)
    assert not torch.isfinite(one_query_attention(q, k, v, valid[:, None, None])[copies]).all()  # NaN where read


def test_a_caches_source_rows_hold_its_rows_prompt_columns_through_expand_and_keep_rows():
    config = tiny_llama("llama").config
    H, D = config.n_kv_head, config.head_dim
    cache = KVCache(config, 3, 8)
    for step, rows in ((5, 3), (1, 12)):  # a prompt of 5 tokens; expanded to 4 samples, one token of each's own
        for layer in range(config.depth):
            cache.update(layer, torch.randn(rows, H, step, D), torch.randn(rows, H, step, D))
        cache.advance(torch.ones(rows, step, dtype=torch.bool))
        cache = cache.expand(4, 8) if rows == 3 else cache
        assert cache.shared == 5 and cache.source.tolist() == [0] * 4 + [4] * 4 + [8] * 4
    for keep, want in (([1, 2, 5, 8, 11], [0, 0, 2, 3, 3]), ([1, 3, 4], [0, 1, 1])):  # a prompt's first copy gone
        cache.keep_rows(torch.tensor(keep))
        assert cache.source.tolist() == want
        for t in (cache.k, cache.v):
            assert torch.equal(t[:, cache.source, :, :5], t[:, :, :, :5])
            assert not torch.equal(t[:, cache.source, :, 5], t[:, :, :, 5])  # their own tokens differ


def test_a_sampled_decode_reading_one_copy_a_prompt_gives_the_bits_of_reading_its_own(monkeypatch):
    """Sampled rows that end at a stop token (the cache drops them: keep_rows moves each row's source), every
    decode step's attention told its rows' sources: the tokens and log-probs of the decode that reads each row's own."""
    assert kernels_built()
    model, told, keeps = tiny_llama("llama", vocab=12), [], []
    attention, keep_rows, expand = speedrun.model.fused_decode_attention, KVCache.keep_rows, KVCache.expand
    monkeypatch.setattr(speedrun.model, "fused_decode_attention",
                        lambda *a: (told.append(a[4] is not None and a[5] > 0), attention(*a))[1])
    # whether a compaction dropped the row a kept row read its prompt from (its source must move)
    monkeypatch.setattr(KVCache, "keep_rows", lambda self, rows: (
        keeps.append(self.source is not None and bool((~torch.isin(self.source[rows], rows)).any())),
        keep_rows(self, rows)))
    runs = []
    for reads in ("one copy", "own"):
        if reads == "own":
            monkeypatch.setattr(KVCache, "expand", lambda *a: setattr(new := expand(*a), "source", None) or new)
        with torch.no_grad():
            runs.append(generate(model, [[1, 2, 4, 5, 6, 7, 9], [9, 8], [5, 10, 11, 2]], num_samples=8,
                                 max_new_tokens=16, temperature=1.0, stop_id=3, pad_id=0,
                                 generator=torch.Generator().manual_seed(1)))
        assert all(told) if reads == "one copy" else not any(told)
        told.clear()
    shared, own = runs
    assert any(keeps) and shared.mask.sum() < shared.mask.numel()  # rows ended early, a source among them
    assert torch.equal(shared.tokens, own.tokens) and torch.equal(shared.logprobs, own.logprobs)


def test_kernels_give_the_same_bits_on_one_thread_and_on_two():
    q, k, v, valid = attention_inputs(16, 3, 3, 70, 64, torch.bfloat16)
    x, gate, up = torch.randn(64, 1, 576), torch.randn(64, 1, 1536).bfloat16(), torch.randn(64, 1, 1536).bfloat16()
    w, r = torch.randn(576), torch.randn(64, 1, 576).bfloat16()
    qkv, cos, sin, k_cache, v_cache = rotary_inputs(64, 9, 3, 64, 40, torch.bfloat16)
    probs, u = torch.randn(64, 4099).mul(4).softmax(-1), torch.rand(64)
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        outs.append((one_query_attention(q, k, v, valid[:, None, None]), fused_rms_norm(x, w, 1e-5),
                     fused_silu_mul(gate, up), *fused_add_rms_norm(x, r, w, 1e-5, torch.bfloat16),
                     fused_rotary_cache(*qkv, cos, sin, k_cache, v_cache, 7), k_cache[:, :, 7].clone(),
                     fused_cdf_search(probs, u)))
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_gives_the_bits_of_the_add_and_the_norm_it_replaces(dtype):
    x, w = torch.randn(9, 1, 576).to(dtype), torch.randn(576)
    for r in (torch.randn(9, 1, 576).bfloat16(), torch.randn(9, 1, 576)):  # autocast's bf16 branch, an fp32 one
        if dtype == torch.bfloat16 and r.dtype == torch.float32:
            continue
        total, normed = fused_add_rms_norm(x, r, w, 1e-5)
        assert total.dtype == dtype and torch.equal(total, x + r)
        assert torch.equal(normed, fused_rms_norm(x + r, w, 1e-5))
        _, into_bf16 = fused_add_rms_norm(x, r, w, 1e-5, torch.bfloat16)  # as autocast would cast it for the product
        assert torch.equal(into_bf16, fused_rms_norm(x + r, w, 1e-5).bfloat16())
    assert torch.equal(fused_rms_norm(x, w, 1e-5, torch.bfloat16), fused_rms_norm(x, w, 1e-5).bfloat16())


def rotary_inputs(B: int, H: int, Hkv: int, D: int, W: int, dtype: torch.dtype, seed: int = 0):
    """((q, k, v): a decode step's projections as views of one packed product [B, 1, (H + 2 Hkv) D]), cos, sin [B,
    1, 1, D / 2] at each row's own position, and a layer's caches [B, Hkv, W, D] holding NaN (unwritten)."""
    g = torch.Generator().manual_seed(seed)
    packed = torch.randn(B, 1, (H + 2 * Hkv) * D, generator=g).to(dtype)
    cos, sin = (t.to(dtype) for t in rotary(torch.randint(0, 300, (B, 1), generator=g), D))
    caches = [torch.full((B, Hkv, W, D), float("nan"), dtype=dtype) for _ in range(2)]
    return packed.split([H * D, Hkv * D, Hkv * D], -1), cos, sin, *caches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_cache_rotates_as_apply_rotary_and_writes_one_column(dtype):
    B, H, Hkv, D, W, pos = 5, 6, 2, 32, 11, 4
    (q, k, v), cos, sin, k_cache, v_cache = rotary_inputs(B, H, Hkv, D, W, dtype)
    got = fused_rotary_cache(q, k, v, cos, sin, k_cache, v_cache, pos)
    heads = [t.reshape(B, 1, n, D).transpose(1, 2).float() for t, n in ((q, H), (k, Hkv), (v, Hkv))]
    want_q, want_k = (apply_rotary(t, cos.float(), sin.float()) for t in heads[:2])
    assert got.dtype == dtype and got.shape == (B, H, D)
    tol = dict(atol=ONE_ROUNDING[dtype], rtol=ONE_ROUNDING[dtype])
    torch.testing.assert_close(got.float(), want_q[:, :, 0], **tol)
    torch.testing.assert_close(k_cache[:, :, pos].float(), want_k[:, :, 0], **tol)
    assert torch.equal(v_cache[:, :, pos].float(), heads[2][:, :, 0])  # the values copied as they are
    others = [c for c in range(W) if c != pos]
    assert k_cache[:, :, others].isnan().all() and v_cache[:, :, others].isnan().all()  # no other column touched
    one_table = fused_rotary_cache(q, k, v, cos[:1], sin[:1], k_cache, v_cache, pos)  # one position for every row
    torch.testing.assert_close(one_table.float(), apply_rotary(heads[0], cos[:1].float(), sin[:1].float())[:, :, 0],
                               **tol)


def test_silu_mul_gives_the_same_bits_in_its_16_lane_loop_and_its_tail():
    """Where silu's exp(-gate) has gate x log2(e) a rounding from a half-integer, the 16-lane exp and the scalar one
    round the same way (an exp16 that rounded x log2(e) before rounding it to an integer parted from the tail at 10 of
    these 1687 values)."""
    half = (torch.arange(-120, 121, dtype=torch.float64) + 0.5) * torch.log(torch.tensor(2.0, dtype=torch.float64))
    x = half.float()
    for _ in range(3):  # and the floats next to them
        x = torch.cat([x, torch.nextafter(x, torch.tensor(float("inf"))),
                       torch.nextafter(x, torch.tensor(-float("inf")))]).unique()
    gate = (-x)[:, None].expand(-1, 17).contiguous()  # lanes 0-15 in the 16-lane loop, lane 16 in the tail
    y = fused_silu_mul(gate, torch.ones_like(gate))
    assert torch.equal(y[:, 0].view(torch.int32), y[:, 16].view(torch.int32))


def test_silu_mul_reads_the_views_of_a_packed_product():
    gate, up = torch.randn(8, 1, 3 * 48).bfloat16().mul(5).split([48, 96], -1)  # rows at a stride of 144
    up = up[..., :48]
    assert torch.equal(fused_silu_mul(gate, up), fused_silu_mul(gate.contiguous(), up.contiguous()))


@pytest.mark.parametrize("N,V", [(64, 49152), (13, 4099), (9, 37), (3, 5)])
def test_cdf_search_draws_the_index_searchsorted_over_cumsum_draws(N, V):
    g = torch.Generator().manual_seed(V)
    for scale, masked in ((1.0, False), (12.0, False), (3.0, True)):  # flat, peaked, and with masked tokens
        logprobs = (torch.randn(N, V, generator=g) * scale).log_softmax(-1)
        if masked:
            logprobs[:, ::3] = float("-inf")
        probs, u = logprobs.exp(), torch.rand(N, generator=g)
        u[:2] = torch.tensor([0.0, 1 - 2 ** -24])  # the ends of [0, 1)
        cdf = probs.cumsum(-1)  # the engine's draw before the kernel (speedrun.decode._draw)
        want = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True).squeeze(-1).clamp_(max=V - 1)
        assert torch.equal(fused_cdf_search(probs, u), want)


def test_the_sampled_draws_are_the_bits_of_the_torch_path(monkeypatch):
    model = tiny(vocab=300)
    with torch.no_grad():
        fused = generate(model, PROMPTS, num_samples=4, max_new_tokens=12, generator=torch.Generator().manual_seed(3))
        monkeypatch.setattr(kernels, "_kernels", lambda *t: None)
        plain = generate(model, PROMPTS, num_samples=4, max_new_tokens=12, generator=torch.Generator().manual_seed(3))
    assert torch.equal(fused.tokens, plain.tokens) and torch.equal(fused.logprobs, plain.logprobs)


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
        ops.decode_attention(q.view(2, 1, 2, 16), k, v, valid[:, :5], 0.25, None, 0)
    with pytest.raises(RuntimeError, match="decode_attention: source row 2 of row 1 outside"):
        ops.decode_attention(q.view(2, 1, 2, 16), k, v, valid, 0.25, torch.tensor([0, 2]), 3)
    with pytest.raises(RuntimeError, match="decode_attention: shared columns 9 outside"):
        ops.decode_attention(q.view(2, 1, 2, 16), k, v, valid, 0.25, torch.tensor([0, 0]), 9)
    with pytest.raises(RuntimeError, match="decode_attention: source .B. int64"):
        ops.decode_attention(q.view(2, 1, 2, 16), k, v, valid, 0.25, torch.tensor([0, 0], dtype=torch.int32), 3)
    with pytest.raises(RuntimeError, match="rms_norm: an fp32 weight as wide"):
        ops.rms_norm(q, torch.ones(15), 1e-5)
    with pytest.raises(RuntimeError, match="silu_mul: gate and up"):
        ops.silu_mul(q, q[:1])
    with pytest.raises(RuntimeError, match="add_rms_norm: the residual branch"):
        ops.add_rms_norm(q, q[:1], torch.ones(16), 1e-5)
    (qp, kp, vp), cos, sin, k_cache, v_cache = rotary_inputs(2, 2, 1, 16, 4, torch.float32)
    with pytest.raises(RuntimeError, match="rotary_cache: column 4 outside the caches' 4"):
        ops.rotary_cache(qp, kp, vp, cos.reshape(2, 8), sin.reshape(2, 8), k_cache, v_cache, 4)
    with pytest.raises(RuntimeError, match="rotary_cache: CPU tensors of one dtype"):
        ops.rotary_cache(qp, kp, vp, cos.reshape(2, 8), sin.reshape(2, 8), k_cache.bfloat16(), v_cache, 0)
    with pytest.raises(RuntimeError, match="llama_blocks: x .B, 1, C., caches"):
        ops.llama_blocks(q, [], k[None], v[None], valid, cos, sin, 0, None, 0, 2, 1e-5, 0.25, torch.float32)
    with pytest.raises(RuntimeError, match="cdf_search: contiguous fp32"):
        ops.cdf_search(torch.rand(2, 5).double(), torch.rand(2).double())


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_llama_decodes_through_the_kernels_with_the_same_tokens(family, monkeypatch):
    model = tiny_llama(family)
    ran, real = [], kernels._kernels

    def counted(*tensors):  # the kernels' calls that ran (not PyTorch's fallback)
        ops = real(*tensors)
        ran.extend([1] if ops is not None else [])
        return ops

    products = []  # the first block's query products: one a forward on either path (the fallback reuses them)
    model.blocks[0].attn.q.register_forward_hook(lambda *_: products.append(1))
    monkeypatch.setattr(kernels, "_kernels", counted)
    with torch.no_grad():
        fused = generate(model, PROMPTS, num_samples=2, max_new_tokens=8, temperature=0.0)
        used, fused_products = len(ran), len(products)
        monkeypatch.setattr(kernels, "_kernels", lambda *t: None)  # PyTorch's ops for the same decode
        plain = generate(model, PROMPTS, num_samples=2, max_new_tokens=8, temperature=0.0)
    assert used >= 7 * 2 * 4  # every decode step: each block's two norms, its attention and its SwiGLU (and where no
    # head norm sits between the projection and the rotary, the rotary and the cache write)
    assert torch.equal(fused.tokens, plain.tokens)
    assert fused_products == len(products) - fused_products == 1 + 7  # the prefill and 7 decode steps


@needs_onednn
def test_a_bf16_llama_decode_in_one_call_a_step_gives_the_bits_of_its_blocks_called_one_by_one(monkeypatch):
    """A sampled bf16 decode (packed products under autocast) whose rows end at a stop token (compaction moves their
    sources): llama_blocks, the blocks in one call into C++, gives the tokens and log-probs of LlamaBlock's ops called
    from Python. Qwen2's biased products and Qwen3's head norms keep the blocks one by one."""
    assert kernels_built()
    real, calls = speedrun.llama.fused_llama_blocks, []
    monkeypatch.setattr(speedrun.llama, "fused_llama_blocks",
                        lambda *a: (y := real(*a), calls.append(y is not None))[0])

    def sample(model):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return generate(model, [[1, 2, 4, 5, 6, 7, 9], [9, 8], [5, 10, 11, 2]], num_samples=8, max_new_tokens=16,
                            temperature=1.0, stop_id=3, pad_id=0, generator=torch.Generator().manual_seed(1))
    model = tiny_llama("llama", vocab=12)
    fused = sample(model)
    assert len(calls) >= 4 and all(calls)  # every decode step until the rows ended
    monkeypatch.setattr(speedrun.llama.Llama, "fused_decode", lambda *a: None)
    one_by_one = sample(model)
    assert fused.mask.sum() < fused.mask.numel()  # rows ended early
    assert torch.equal(fused.tokens, one_by_one.tokens) and torch.equal(fused.logprobs, one_by_one.logprobs)
    monkeypatch.undo()
    calls.clear()
    monkeypatch.setattr(speedrun.llama, "fused_llama_blocks", lambda *a: (calls.append(1), real(*a))[1])
    for family in ("qwen2", "qwen3"):
        sample(tiny_llama(family, vocab=12))
    assert not calls
