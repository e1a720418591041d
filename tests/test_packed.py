"""Packed bf16 linears (speedrun.packed): bit for bit what autocast computes, inside generate() too, and gone after."""
import pytest
import torch
import torch.nn as nn

import speedrun.engine as engine
from speedrun.packed import available, packed_linears, sampling_dtype
from test_engine import MODELS, PROMPTS, gen

torch.set_num_threads(1)
needs_onednn = pytest.mark.skipif(not available(), reason="this torch build or CPU has no oneDNN bf16 products")
AMP = dict(device_type="cpu", dtype=torch.bfloat16)


@needs_onednn
@pytest.mark.parametrize("kind", MODELS)
def test_packed_forward_is_autocasts_bit_for_bit(kind):
    model = MODELS[kind]()
    ids = torch.tensor([PROMPTS[0], PROMPTS[0][::-1]])
    with torch.no_grad(), torch.autocast(**AMP):
        want = model.logits(model.hidden(ids))
        with packed_linears(model, torch.bfloat16, rows=2):
            got = model.logits(model.hidden(ids))
            assert all("forward" in m.__dict__ for m in model.modules() if isinstance(m, nn.Linear))
            fusing = [m for m in model.modules() if getattr(m, "FUSE", None)]
            assert all(name in m.__dict__ for m in fusing for name in m.FUSE) and bool(fusing) == (kind != "gpt")
    assert torch.equal(got, want)  # a Llama's fused products too
    assert not any("forward" in m.__dict__ or set(getattr(m, "FUSE", {})) & set(m.__dict__)
                   for m in model.modules())  # the model's own layers again
    model.logits(model.hidden(ids)).sum().backward()  # and they train
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@needs_onednn
@pytest.mark.parametrize("kind", ["gpt", "qwen2"])
def test_generate_under_bf16_autocast_packs_and_samples_the_same(kind, monkeypatch):
    model = MODELS[kind]()
    kw = dict(num_samples=3, max_new_tokens=9, temperature=0.8, stop_id=11)
    with torch.no_grad(), torch.autocast(**AMP):
        assert sampling_dtype(torch.device("cpu")) == torch.bfloat16
        packed = engine.generate(model, PROMPTS, generator=gen(2), **kw)
        monkeypatch.setattr(engine, "sampling_dtype", lambda device: None)
        plain = engine.generate(model, PROMPTS, generator=gen(2), **kw)
    for field in ("tokens", "mask", "logprobs"):
        assert torch.equal(getattr(packed, field), getattr(plain, field))


def test_nothing_is_packed_outside_bf16_autocast():
    model = MODELS["gpt"]()
    assert sampling_dtype(torch.device("cpu")) is None
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        assert sampling_dtype(torch.device("cpu")) is None
    with packed_linears(model, None, rows=4):
        assert not any("forward" in m.__dict__ for m in model.modules())
