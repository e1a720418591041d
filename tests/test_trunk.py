"""A frozen trunk (speedrun.trunk): the log-probs through the shared activations are the full forward's, a GRPO run
with task.train.frozen_blocks takes the same steps as one whose policy was frozen by hand (the activations shared,
not recomputed), and the frozen weights do not move."""
import dataclasses

import pytest
import torch

from conftest import grpo_config
from speedrun.engine import generate, sequence_logprobs
from speedrun.llama import Llama, LlamaConfig
from speedrun.model import GPT, GPTConfig
from speedrun.reward.preference import RewardModel
from speedrun.rl.density import draw_prompts
from speedrun.rl.rewards import score_samples
from speedrun.rl.trainer import grpo_train
from speedrun.trunk import freeze_trunk, frozen_linears_in, frozen_trunk, require_shared_trunk

torch.set_num_threads(1)
PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8], [5, 17, 33, 2]]


def random_model(kind: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if kind == "gpt":
        model = GPT(GPTConfig(vocab_size=64, depth=3, n_embd=64, head_dim=16, seq_len=64))
    else:
        model = Llama(LlamaConfig(vocab_size=64, depth=3, n_embd=64, n_head=4, n_kv_head=2, ffn_hidden=96,
                                  rope_theta=100000.0, seq_len=64))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.eval()


@pytest.mark.parametrize("kind", ["gpt", "llama"])
@pytest.mark.parametrize("blocks", [1, 2])
def test_log_probs_through_the_trunk_are_the_full_forwards(kind, blocks):
    model = random_model(kind)
    torch.manual_seed(1)
    s = generate(model, PROMPTS, 4, 9, stop_id=3, pad_id=0, temperature=1.0)
    assert (s.mask.sum(1) < s.mask.size(1)).any()  # some rows stop early: the trunk trims and pads around them
    trunk = frozen_trunk(model, PROMPTS, s.tokens, s.mask, blocks, pad_id=0)
    kw = dict(mask=s.mask, pad_id=0, temperature=0.8, entropy=True)
    full, full_ent = sequence_logprobs(model, PROMPTS, s.tokens, **kw)
    shared, shared_ent = sequence_logprobs(model, PROMPTS, s.tokens, trunk=trunk, **kw)
    assert torch.allclose(shared, full, atol=1e-5) and torch.allclose(shared_ent, full_ent, atol=1e-5)
    assert not trunk.states.requires_grad and (shared[s.mask == 0] == 0).all()


@pytest.mark.parametrize("kind", ["gpt", "llama"])
@pytest.mark.parametrize("pool,end_id", [("last", None), ("mean", None), ("last", 3)])
def test_a_reward_model_on_the_trunks_blocks_scores_through_it_as_through_its_own(kind, pool, end_id):
    policy = random_model(kind)
    rm = RewardModel.from_gpt(policy, pool)
    rm.end_id = end_id  # rm.read_end false: the stop token is left out on the trunk's path as on the RM's own
    with torch.no_grad():  # its own last block and head, as train_rm's train_last_blocks leaves them
        for p in [*rm.trunk.blocks[2].parameters(), rm.head.weight]:
            p.normal_(0.0, 0.3)
    torch.manual_seed(2)
    s = generate(policy, PROMPTS, 4, 9, stop_id=3, pad_id=0, temperature=1.0)
    assert (s.mask.sum(1) < s.mask.size(1)).any()  # rows of several lengths: the last real token differs per row
    own = score_samples(rm, PROMPTS, s, 0, standardise=False)
    s.trunk = frozen_trunk(policy, PROMPTS, s.tokens, s.mask, 2, pad_id=0, every_token=True)
    assert s.trunk.shares(rm.trunk) and s.trunk.tokens.size(1) == int(s.mask.sum(1).max())
    calls = []
    rm.trunk.blocks[0].register_forward_hook(lambda *a: calls.append(1))
    torch.testing.assert_close(score_samples(rm, PROMPTS, s, 0, standardise=False), own, atol=1e-5, rtol=1e-5)
    assert not calls  # the RM's frozen blocks did not run
    other = RewardModel.from_gpt(random_model(kind, seed=1), pool)  # other first blocks: scored by its own
    assert not s.trunk.shares(other.trunk)
    s.trunk = None
    want = score_samples(other, PROMPTS, s, 0, standardise=False)
    s.trunk = frozen_trunk(policy, PROMPTS, s.tokens, s.mask, 2, pad_id=0, every_token=True)
    assert torch.equal(score_samples(other, PROMPTS, s, 0, standardise=False), want)


def test_freeze_trunk_freezes_the_embedding_and_bottom_blocks_and_refuses_all_of_them():
    model = random_model("llama")
    freeze_trunk(model, 2, "task.train.frozen_blocks")
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {n for n, _ in model.named_parameters() if n.startswith(("blocks.2.", "norm_f."))}  # tied head
    gpt = random_model("gpt")
    freeze_trunk(gpt, 1)
    assert gpt.lm_head.weight.requires_grad and not gpt.wte.weight.requires_grad  # an untied head trains
    for bad in (3, 4):
        with pytest.raises(ValueError, match=f"task.sft.frozen_blocks={bad}: the model has 3 blocks"):
            freeze_trunk(random_model("gpt"), bad, "task.sft.frozen_blocks")
    policy, same, other = random_model("gpt"), random_model("gpt"), random_model("gpt", seed=1)
    freeze_trunk(policy, 1)
    with torch.no_grad():
        policy.blocks[2].mlp.c_fc.weight.add_(1.0)  # a trained block may differ from the reference
    require_shared_trunk(policy, same, 1)
    with pytest.raises(ValueError, match="frozen wte.weight differs"):
        require_shared_trunk(policy, other, 1)
    with torch.no_grad():
        same.blocks[1].mlp.c_fc.weight.add_(1.0)  # a trunk block may not
    require_shared_trunk(policy, same, 1)  # block 1 is not in a one-block trunk
    freeze_trunk(policy, 2)
    with pytest.raises(ValueError, match="frozen blocks.1.mlp.c_fc.weight differs"):
        require_shared_trunk(policy, same, 2)


def grpo(frozen: int, by_hand: int = 0, steps: int = 3):
    policy, ref = random_model("llama"), random_model("llama")
    freeze_trunk(policy, by_hand)
    reward = lambda batch, s: ((s.tokens % 5 == 0).float() * s.mask).sum(1) / s.mask.sum(1)  # noqa: E731
    weights = torch.full((len(PROMPTS),), 1 / 3, dtype=torch.float64)
    cfg = dataclasses.replace(grpo_config("task.train", steps=steps, prompts_per_step=2, group_size=4,
                                          max_new_tokens=6, lr=1e-2, beta=0.1, inner_updates=2, warmup_steps=1),
                              frozen_blocks=frozen)
    result = grpo_train(policy, ref, PROMPTS, lambda step, g: draw_prompts(weights, 2, g), reward, cfg, "cpu",
                        stop_id=3, pad_id=0)
    return policy, result


def test_grpo_with_a_frozen_trunk_is_the_hand_frozen_run_and_leaves_the_trunk_alone():
    shared, a = grpo(frozen=2)
    recomputed, b = grpo(frozen=0, by_hand=2)  # the same trainable weights, the trunk recomputed per forward
    for key in ("reward_mean", "kl", "loss", "ratio_mean"):
        assert [r[key] for r in a.log] == pytest.approx([r[key] for r in b.log], rel=1e-4, abs=1e-6)
    start = random_model("llama").state_dict()
    after = shared.state_dict()
    for name, w in after.items():
        moved = not torch.equal(w, start[name])
        assert moved == name.startswith(("blocks.2.", "norm_f.")), name
        assert torch.allclose(w, recomputed.state_dict()[name], atol=1e-4), name
    assert a.log[-1]["kl"] > 0


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_frozen_linears_held_in_bf16_sample_what_autocast_samples(kind):
    """Under bf16 autocast (pinned: a numerics test), holding the frozen blocks' Linear weights in bf16 for the decode
    loop gives the same tokens and log-probs as autocast's own per-call casts; trainable weights stay fp32 inside, and
    every weight is its fp32 self again, bit for bit, after."""
    model = random_model(kind)
    freeze_trunk(model, 2)
    before = {n: w.detach().clone() for n, w in model.named_parameters()}
    uniforms = torch.rand(len(PROMPTS) * 3, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        plain = generate(model, PROMPTS, 3, 8, stop_id=3, pad_id=0, uniforms=uniforms)
        with frozen_linears_in(model, torch.bfloat16):
            held = generate(model, PROMPTS, 3, 8, stop_id=3, pad_id=0, uniforms=uniforms)
            dtypes = {n: w.dtype for n, w in model.named_parameters()}
    assert torch.equal(plain.tokens, held.tokens) and torch.equal(plain.logprobs, held.logprobs)
    assert dtypes["blocks.0.mlp.c_fc.weight" if kind == "gpt" else "blocks.0.mlp.gate.weight"] == torch.bfloat16
    assert {n for n, t in dtypes.items() if t == torch.bfloat16} == {
        n for n, w in model.named_parameters() if n.startswith(("blocks.0.", "blocks.1.")) and w.ndim == 2}
    assert all(torch.equal(w, before[n]) and w.dtype == torch.float32 for n, w in model.named_parameters())
    with frozen_linears_in(model, None):  # nothing held
        assert all(w.dtype == torch.float32 for w in model.parameters())
