import json
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

from speedrun.common import torch_load, torch_save
from speedrun.model import GPT, GPTConfig, KVCache

torch.set_num_threads(1)
V = 97


def tiny(seed: int = 0, **kw) -> GPT:
    """A tiny GPT with every weight random: the real init zeroes the out-projections, which would make
    attention invisible in the outputs and these tests vacuous."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=V, depth=2, n_embd=64, head_dim=16, seq_len=32, **kw))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.eval()


def test_config_roundtrip():
    cfg = GPTConfig(vocab_size=4096, depth=4)
    assert cfg.n_embd == 256 and cfg.n_head == 4
    again = GPTConfig(**json.loads(json.dumps(asdict(cfg))))
    assert again == cfg
    with pytest.raises(ValueError):
        GPTConfig(vocab_size=10, n_embd=100, head_dim=64)


def test_shapes_and_loss():
    model = tiny()
    idx = torch.randint(0, V, (3, 12))
    logits = model(idx)
    assert logits.shape == (3, 12, V) and logits.dtype == torch.float32
    assert logits.abs().max() <= model.config.softcap
    assert model.hidden(idx).shape == (3, 12, 64)
    targets = torch.randint(0, V, (3, 12))
    targets[0, :5] = -1
    targets[2, 7] = -1
    loss = model(idx, targets)
    keep = targets != -1
    manual = -F.log_softmax(logits, -1).gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)[keep].mean()
    torch.testing.assert_close(loss, manual)
    per_token = model(idx, targets, reduction="none")
    assert per_token.shape == (3, 12) and (per_token[~keep] == 0).all()
    torch.testing.assert_close(per_token.sum() / keep.sum(), manual)
    torch.testing.assert_close(model(idx, targets, reduction="sum"), manual * keep.sum())
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    # logits are computed only where a target is kept: the gradient is the one of the full masked loss
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logits = model(idx)
    (-F.log_softmax(logits, -1).gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)[keep].mean()).backward()
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad)
    full = torch.randint(0, V, (3, 12))  # nothing ignored: the plain path
    torch.testing.assert_close(model(idx, full), F.cross_entropy(model(idx).flatten(0, 1), full.flatten()))


def test_hidden_then_logits_equals_forward():
    model = tiny()
    idx = torch.randint(0, V, (2, 9))
    torch.testing.assert_close(model.logits(model.hidden(idx)), model(idx))


def test_kv_cache_incremental_equals_full_forward():
    model = tiny()
    idx = torch.randint(0, V, (3, 11))
    full = model(idx)
    cache = KVCache(model.config, 3, 11)
    parts = [model(idx[:, :4], kv_cache=cache), model(idx[:, 4:7], kv_cache=cache)]  # prefill, then a chunk
    parts += [model(idx[:, t:t + 1], kv_cache=cache) for t in range(7, 11)]  # then one token at a time
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="overflow"):
        model(idx[:, :1], kv_cache=cache)


def test_left_padding_equals_unpadded():
    model = tiny()
    rows = [torch.randint(0, V, (n,)) for n in (9, 4, 1)]
    ids = torch.zeros(3, 9, dtype=torch.long)
    key_mask = torch.zeros(3, 9, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, 9 - len(r):], key_mask[i, 9 - len(r):] = r, True
    padded = model(ids, key_mask=key_mask)
    assert torch.isfinite(padded).all()  # pad queries attend to themselves: no NaN rows
    for i, r in enumerate(rows):
        torch.testing.assert_close(padded[i, 9 - len(r):], model(r[None])[0], atol=1e-4, rtol=1e-4)
    # the same through a cache: padded prefill, then decode steps
    cache = KVCache(model.config, 3, 11)
    model(ids, key_mask=key_mask, kv_cache=cache)
    nxt = torch.randint(0, V, (3, 2))
    steps = torch.cat([model(nxt[:, t:t + 1], kv_cache=cache) for t in range(2)], 1)
    for i, r in enumerate(rows):
        ref = model(torch.cat([r, nxt[i]])[None])[0, -2:]
        torch.testing.assert_close(steps[i], ref, atol=1e-4, rtol=1e-4)


def test_bf16_autocast_runs():
    model = tiny()
    idx = torch.randint(0, V, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(idx)
        cache = KVCache(model.config, 2, 9)
        model(idx, kv_cache=cache)
        step = model(idx[:, :1], kv_cache=cache)
    assert cache.k.dtype == torch.bfloat16 and logits.dtype == torch.float32
    assert torch.isfinite(logits).all() and torch.isfinite(step).all()
    assert (logits - model(idx)).abs().max() < 0.5  # bf16 rounding only


def test_deterministic_init_and_checkpoint_roundtrip(tmp_path):
    cfg = GPTConfig(vocab_size=V, depth=2)
    torch.manual_seed(1)
    a = GPT(cfg)
    torch.manual_seed(1)
    b = GPT(cfg)
    torch.manual_seed(2)
    c = GPT(cfg)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert not torch.equal(a.wte.weight, c.wte.weight)
    # zero out-projections: every block starts as the identity
    assert all((blk.attn.c_proj.weight == 0).all() and (blk.mlp.c_proj.weight == 0).all() for blk in a.blocks)
    torch_save(tmp_path / "model.pt", a.state_dict())
    d = GPT(GPTConfig(**asdict(cfg)))
    d.load_state_dict(torch_load(tmp_path / "model.pt"))
    idx = torch.randint(0, V, (1, 5))
    assert torch.equal(a(idx), d(idx))


def test_estimate_flops():
    model = GPT(GPTConfig(vocab_size=4096, depth=4, seq_len=256))
    c = model.config
    non_embedding = model.num_params() - 4096 * 256
    assert model.num_params() == 4096 * 256 * 2 + 4 * 12 * 256 * 256  # wte + lm_head + 12 C^2 per layer
    assert model.estimate_flops() == 6 * non_embedding + 12 * c.depth * c.n_head * c.head_dim * c.seq_len
    assert 6 * non_embedding < model.estimate_flops() < 6 * model.num_params()
