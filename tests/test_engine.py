import math

import pytest
import torch

import itertools

from speedrun.decode import process_logits
from speedrun.engine import Samples, generate, real_width, sequence_logprobs
from speedrun.shapes import length_groups
from speedrun.llama import Llama, LlamaConfig
from speedrun.model import GPT, GPTConfig, KVCache

torch.set_num_threads(1)


def tiny(vocab: int = 64, scale: float = 0.3, seed: int = 0) -> GPT:
    """Tiny GPT with every weight random (the real init is near-uniform and would make greedy ties)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=vocab, depth=2, n_embd=64, head_dim=16, seq_len=64))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, scale)
    return model.eval()


def tiny_llama(family: str, vocab: int = 64, scale: float = 0.3, seed: int = 0) -> Llama:
    """Tiny Llama-family model (grouped-query: 4 query heads on 2 key/value heads), every weight random; qwen2: biased
    query/key/value projections, qwen3: per-head query/key norms."""
    torch.manual_seed(seed)
    model = Llama(LlamaConfig(vocab_size=vocab, depth=2, n_embd=64, n_head=4, n_kv_head=2, ffn_hidden=96,
                              qkv_bias=family == "qwen2", qk_norm=family == "qwen3", tied=False))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, scale)
    return model.eval()


MODELS = {"gpt": tiny, "llama": lambda: tiny_llama("llama"), "qwen2": lambda: tiny_llama("qwen2"),
          "qwen3": lambda: tiny_llama("qwen3")}
PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8], [5, 17, 33, 2]]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_process_logits_hand_example():
    probs = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    logits = probs.log()
    inf = float("-inf")

    def p(**kw):
        return process_logits(logits, **kw).exp()

    torch.testing.assert_close(p(temperature=1.0), probs)
    torch.testing.assert_close(p(temperature=2.0), probs.sqrt() / probs.sqrt().sum())
    torch.testing.assert_close(p(temperature=1.0, top_k=3), torch.tensor([0.5, 0.2, 0.15, 0, 0]) / 0.85)
    # nucleus = smallest set with mass >= top_p: 0.5 + 0.2 reaches 0.7 exactly, 0.75 needs the third token
    torch.testing.assert_close(p(temperature=1.0, top_p=0.7), torch.tensor([0.5, 0.2, 0, 0, 0]) / 0.7)
    torch.testing.assert_close(p(temperature=1.0, top_p=0.75), torch.tensor([0.5, 0.2, 0.15, 0, 0]) / 0.85)
    torch.testing.assert_close(p(temperature=1.0, top_p=0.1), torch.tensor([1.0, 0, 0, 0, 0]))
    # top-p acts on the top-k-renormalised distribution: 0.5/0.85 + 0.2/0.85 = 0.82 >= 0.8
    torch.testing.assert_close(p(temperature=1.0, top_k=3, top_p=0.8), torch.tensor([0.5, 0.2, 0, 0, 0]) / 0.7)
    # order of the vocabulary does not matter
    perm = torch.tensor([3, 0, 4, 2, 1])
    torch.testing.assert_close(process_logits(logits[perm], 1.0, top_p=0.75).exp(),
                               (torch.tensor([0.5, 0.2, 0.15, 0, 0]) / 0.85)[perm])
    assert process_logits(logits, 0.0).tolist() == [0.0, inf, inf, inf, inf]
    kept = process_logits(logits, 1.0, top_k=1, keep=torch.tensor(3)).exp()
    torch.testing.assert_close(kept, torch.tensor([0.5, 0, 0, 0.1, 0]) / 0.6)
    with pytest.raises(ValueError):
        process_logits(logits, 1.0, top_p=0.0)


def naive_greedy(model: GPT, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("kind", MODELS)
def test_greedy_equals_full_recompute_with_mixed_lengths(kind):
    model = MODELS[kind]()  # the Llamas decode through one_query_attention, the GPT through SDPA
    s = generate(model, PROMPTS, num_samples=2, max_new_tokens=10, temperature=0.0)
    assert s.tokens.shape == (6, 10) and s.prompt_index.tolist() == [0, 0, 1, 1, 2, 2]
    for i, prompt in enumerate(PROMPTS):
        ref = naive_greedy(model, prompt, 10)
        assert s.tokens[2 * i].tolist() == ref and s.tokens[2 * i + 1].tolist() == ref
    assert (s.mask == 1).all() and (s.logprobs == 0).all()  # greedy: log-prob 0 under the one-hot


def test_same_seed_same_samples():
    model = tiny()
    kw = dict(num_samples=4, max_new_tokens=12, temperature=0.9, top_p=0.95, stop_id=7)
    a, b = generate(model, PROMPTS, generator=gen(3), **kw), generate(model, PROMPTS, generator=gen(3), **kw)
    c = generate(model, PROMPTS, generator=gen(4), **kw)
    for field in ("tokens", "mask", "logprobs", "prompt_index"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert not torch.equal(a.tokens, c.tokens)


def test_samples_of_a_prompt_draw_their_first_token_independently():
    model = tiny(vocab=64, scale=0.1)  # small weights: a flat, high-entropy first-token distribution
    s = generate(model, [[5, 6, 7]], num_samples=16, max_new_tokens=3, temperature=1.5, generator=gen(0))
    assert len(set(s.tokens[:, 0].tolist())) > 1
    # structural: replication happens before the first draw, so G samples of one prompt are exactly
    # G single samples of G copies of it (same generator state -> same draws)
    t = generate(model, [[5, 6, 7]] * 16, num_samples=1, max_new_tokens=3, temperature=1.5, generator=gen(0))
    assert torch.equal(s.tokens, t.tokens)
    torch.testing.assert_close(s.logprobs, t.logprobs)


def test_first_token_frequencies_match_the_model_distribution():
    model = tiny(vocab=8, scale=0.5, seed=1)
    n = 4000
    s = generate(model, [[1, 2, 3]], num_samples=n, max_new_tokens=1, temperature=1.0, generator=gen(0))
    probs = model(torch.tensor([[1, 2, 3]]))[0, -1].softmax(-1)
    freq = torch.bincount(s.tokens[:, 0], minlength=8).float() / n
    se = (probs * (1 - probs) / n).sqrt()
    assert ((freq - probs).abs() <= 5 * se + 1e-3).all(), (freq, probs)
    assert probs.max() < 0.9  # the check would be vacuous on a near-deterministic model


@pytest.mark.parametrize("kind,top_k,top_p", [("gpt", 0, 1.0), ("gpt", 0, 0.8), ("gpt", 10, 0.9), ("llama", 0, 0.8),
                                               ("qwen2", 10, 0.9), ("qwen3", 0, 1.0)])
def test_sequence_logprobs_match_sampling(kind, top_k, top_p):
    model = MODELS[kind]()
    kw = dict(temperature=0.7, top_k=top_k, top_p=top_p)
    s = generate(model, PROMPTS, num_samples=3, max_new_tokens=9, stop_id=11, generator=gen(1), **kw)
    lp = sequence_logprobs(model, PROMPTS, s.tokens, mask=s.mask, **kw)
    torch.testing.assert_close(lp, s.logprobs, atol=1e-4, rtol=1e-4)
    # an explicit prompt_index gives the same; gradients flow
    same = sequence_logprobs(model, PROMPTS, s.tokens, prompt_index=s.prompt_index, mask=s.mask, **kw)
    torch.testing.assert_close(same, lp)
    (lp * s.mask).sum().backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0


def test_stop_token_and_mask(monkeypatch):
    compactions = []
    keep_rows = KVCache.keep_rows
    monkeypatch.setattr(KVCache, "keep_rows", lambda self, rows: (compactions.append(len(rows)), keep_rows(self, rows)))
    model = tiny(vocab=16, scale=0.2)
    stop = 5
    prompts = [[1, 2, 4, 5, 6], [9, 8], [15]]
    s = generate(model, prompts, num_samples=8, max_new_tokens=20, temperature=1.0, stop_id=stop, pad_id=0,
                 generator=gen(2))
    lengths = s.mask.sum(1).long()
    stopped = 0
    for row, n in zip(range(len(lengths)), lengths.tolist()):
        assert s.mask[row, :n].eq(1).all() and s.mask[row, n:].eq(0).all()  # mask is a prefix
        assert (s.tokens[row, n:] == 0).all() and (s.logprobs[row, n:] == 0).all()
        assert (s.tokens[row, :n - 1] != stop).all()
        if n < 20:
            assert s.tokens[row, n - 1] == stop  # the stop token itself is kept, with mask 1
            stopped += 1
    assert 0 < stopped < len(lengths)  # both kinds occurred
    assert compactions == [12, 6]  # finished rows were dropped from the cache mid-decode
    assert (s.logprobs[s.mask.bool()] < 0).all()
    # rows compacted out of the cache did not disturb the survivors: full recompute agrees
    lp = sequence_logprobs(model, prompts, s.tokens, mask=s.mask, temperature=1.0)
    torch.testing.assert_close(lp, s.logprobs, atol=1e-4, rtol=1e-4)


def test_loop_ends_when_every_row_stopped():
    model = tiny()
    first = naive_greedy(model, PROMPTS[0], 1)[0]
    calls = []
    hook = model.lm_head.register_forward_hook(lambda *_: calls.append(1))
    s = generate(model, [PROMPTS[0]], num_samples=3, max_new_tokens=50, temperature=0.0, stop_id=first)
    hook.remove()
    assert len(calls) == 1  # the prefill only: no decode step after every row hit stop_id
    assert s.mask[:, 0].eq(1).all() and s.mask[:, 1:].eq(0).all() and (s.tokens[:, 0] == first).all()


def test_edge_cases():
    model = tiny()
    s = generate(model, PROMPTS, num_samples=2, max_new_tokens=0)
    assert isinstance(s, Samples) and s.tokens.shape == (6, 0)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(model, [[1], []], num_samples=1, max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt 0 has token ids outside"):
        generate(model, [[1, 64]], num_samples=1, max_new_tokens=2)
    with pytest.raises(ValueError, match="pass prompt_index"):
        sequence_logprobs(model, PROMPTS, torch.zeros(4, 2, dtype=torch.long))
    # equal-length prompts may come as one LongTensor
    s = generate(model, [[1, 2, 3], [4, 5, 6]], num_samples=2, max_new_tokens=4, generator=gen(0))
    torch.testing.assert_close(sequence_logprobs(model, torch.tensor([[1, 2, 3], [4, 5, 6]]), s.tokens), s.logprobs,
                               atol=1e-4, rtol=1e-4)
    # a completion the current top-k would truncate keeps a finite log-prob (no -inf in a GRPO ratio)
    lp = sequence_logprobs(model, [[1, 2]], torch.tensor([[int(model(torch.tensor([[1, 2]]))[0, -1].argmin())]]),
                           temperature=1.0, top_k=1)
    assert math.isfinite(lp.item())


def test_length_groups_is_the_cheapest_cut():
    """Contiguous groups of the rows sorted by length, minimising padded tokens + group_cost per group: checked
    against every way of cutting the distinct lengths."""
    lengths = [5, 0, 48, 7, 7, 13, 48, 6, 30, 12]
    for cost in (0, 8, 32, 1000):
        groups = length_groups(lengths, cost)
        assert sorted(i for g in groups for i in g) == [i for i, n in enumerate(lengths) if n]  # row 1 (empty) left out
        assert all(lengths[a] <= lengths[b] for g in groups for a, b in zip(g, g[1:]))
        got = sum(len(g) * max(lengths[i] for i in g) + cost for g in groups)
        distinct = sorted({n for n in lengths if n})
        best = float("inf")
        for k in range(len(distinct)):
            for cuts in itertools.combinations(range(1, len(distinct)), k):
                edges = [0, *cuts, len(distinct)]
                best = min(best, sum(sum(1 for n in lengths if lo <= n <= hi) * hi + cost for lo, hi in
                                     ((distinct[a], distinct[b - 1]) for a, b in zip(edges, edges[1:]))))
        assert got == best
    nonempty = sorted((i for i, n in enumerate(lengths) if n), key=lambda i: (lengths[i], i))
    assert length_groups(lengths, 10**6) == [nonempty]
    assert length_groups([0, 0]) == [] and real_width(torch.tensor([[1, 0, 1, 0], [0, 0, 0, 0]])).tolist() == [3, 0]


def test_masked_logprobs_run_only_real_tokens_and_match_the_full_forward():
    """With a mask, rows run in length groups and only masked-in logits are computed: same log-probs and the same
    gradient as the full padded forward."""
    model = tiny(vocab=16, scale=0.2)
    prompts = [[1, 2, 4, 5, 6], [9, 8], [15]]
    s = generate(model, prompts, num_samples=8, max_new_tokens=20, stop_id=5, generator=gen(2))
    assert len(length_groups((real_width(s.mask) - 1).tolist())) > 1  # several forwards of different widths
    grouped = sequence_logprobs(model, prompts, s.tokens, mask=s.mask)
    (grouped * s.mask).sum().backward()
    g_grouped = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    full = sequence_logprobs(model, prompts, s.tokens) * s.mask
    (full * s.mask).sum().backward()
    torch.testing.assert_close(grouped, full, atol=1e-5, rtol=1e-5)
    for a, p in zip(g_grouped, model.parameters()):
        torch.testing.assert_close(a, p.grad, atol=1e-5, rtol=1e-4)


def test_grouped_logprob_gradient_is_bitwise_repeatable_on_two_threads():
    """The prompt cache is shared by its G rows; on >1 CPU threads the backward of x[rows] with repeated rows adds
    with atomics (float noise run to run), so the engine selects rows with index_select, whose backward adds in a
    fixed order. Sizes are above the CPU kernels' parallel grain (32,768 elements)."""
    model = tiny(vocab=64, scale=0.2)
    prompts = [[(7 * j + i) % 60 + 1 for j in range(30 - i)] for i in range(8)]  # lengths 30 ... 23
    s = generate(model, prompts, num_samples=16, max_new_tokens=24, stop_id=5, generator=gen(3))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        grads = []
        for _ in range(10):  # the old x[rows] failed this in 2 of 3 runs at 6 repeats
            model.zero_grad()
            sequence_logprobs(model, prompts, s.tokens, mask=s.mask).sum().backward()
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(grads[0], g) for g in grads[1:])


@pytest.mark.parametrize("decode", ["static", "compiled"])
def test_captured_decode_matches_the_dynamic_one(decode, monkeypatch):
    """The static-shape step (eager, or under torch.compile) samples the same tokens with the same log-probs as
    the dynamic decode from the same per-row uniforms (a generator's stream would differ once the dynamic decode
    drops finished rows); static and compiled keep finished rows in their slots (one captured step per batch); a
    compiled rerun is bitwise identical."""
    compactions = []
    keep_rows = KVCache.keep_rows
    monkeypatch.setattr(KVCache, "keep_rows", lambda self, rows: (compactions.append(len(rows)), keep_rows(self, rows)))
    model = tiny(vocab=16, scale=0.2)
    kw = dict(num_samples=8, max_new_tokens=20, temperature=0.9, top_k=12, top_p=0.95, stop_id=5, pad_id=0)
    prompts = [[1, 2, 4, 5, 6], [9, 8], [15]]
    kw["uniforms"] = torch.rand(24, 20, generator=gen(2))
    dynamic = generate(model, prompts, **kw)
    n_dynamic = len(compactions)
    captured = generate(model, prompts, decode=decode, **kw)
    assert n_dynamic > 0 and len(compactions) == n_dynamic
    assert torch.equal(captured.tokens, dynamic.tokens) and torch.equal(captured.mask, dynamic.mask)
    torch.testing.assert_close(captured.logprobs, dynamic.logprobs, atol=1e-5, rtol=1e-5)
    again = generate(model, prompts, decode=decode, **kw)
    assert torch.equal(again.tokens, captured.tokens) and torch.equal(again.logprobs, captured.logprobs)
    with pytest.raises(ValueError, match="decode must be one of"):
        generate(model, prompts, decode="graph", **kw)
