"""Bounded shapes (compute.width_step): the ladder pads, masks and changes nothing but float rounding, and a GRPO run
presents a few dozen attention shapes, all met at the start when it warms up."""
import pytest
import torch

from conftest import grpo_config
from speedrun.engine import generate, sequence_logprobs
from speedrun.model import GPT, GPTConfig
from speedrun.reward.preference import RewardModel
from speedrun.rl.rewards import score_samples
from speedrun.rl.trainer import grpo_train
from speedrun.shapes import ONE_FORWARD, ladder, ladder_sizes, length_groups, resolve_width_step, round_up
from speedrun.shapes import count_shapes, set_forward_compile, using_width_step

torch.set_num_threads(1)


def test_ladder_and_round_up():
    assert [ladder(n) for n in (1, 2, 3, 5, 7, 9, 13, 17, 33, 64, 65)] == [1, 2, 3, 6, 8, 12, 16, 24, 48, 64, 96]
    assert all(n <= ladder(n) < 1.5 * n + 1 for n in range(1, 5000))  # never more than a half larger
    assert ladder_sizes(64) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64] and len(ladder_sizes(4096)) == 24
    assert [round_up(n, 16) for n in (1, 16, 17)] == [16, 16, 32] and round_up(7, 1) == 7
    assert resolve_width_step(0, "cuda") == 64 and resolve_width_step(0, "cpu") == 1
    assert resolve_width_step(16, "cpu") == 16


def test_ladder_groups_cover_every_row_once_on_ladder_sizes():
    lengths = [5, 0, 48, 7, 7, 13, 48, 6, 30, 12, 1, 17, 33]
    with using_width_step(16):
        groups = length_groups(lengths)
    assert sorted(i for g in groups for i in g) == [i for i, n in enumerate(lengths) if n]
    assert all(len(g) in ladder_sizes(64) for g in groups)
    assert all(lengths[a] <= lengths[b] for g in groups for a, b in zip(g, g[1:]))


def test_one_forward_per_batch_where_a_forward_costs_launches():
    """On CUDA (shapes.use_shapes) a small forward's cost is its kernel launches: a batch on the row ladder runs as
    one forward; on CPU rows of similar length run together, each group at its own width."""
    lengths = [5, 48, 7, 13, 30, 1, 17, 33]
    with using_width_step(64, forward_cost=ONE_FORWARD):
        assert length_groups(lengths) == [sorted(range(8), key=lambda i: lengths[i])]
    with using_width_step(16):
        assert len(length_groups(lengths)) == 3


def tiny(seed: int = 0, vocab: int = 32) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=vocab, depth=2, n_embd=32, head_dim=16, seq_len=64))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8], [5, 17, 30, 2], list(range(3, 23))]


@pytest.mark.parametrize("decode", ["dynamic", "static"])
def test_bounded_shapes_sample_score_and_train_the_same(decode):
    """Same uniforms: the same tokens; log-probs, rewards and gradients equal up to float rounding."""
    model, rm = tiny(0), RewardModel.from_gpt(tiny(1)).eval()
    torch.nn.init.normal_(rm.head.weight, std=0.5)
    u = torch.rand(len(PROMPTS) * 6, 24, generator=torch.Generator().manual_seed(0))
    out = {}
    for step, cost in ((1, None), (16, None), (64, None), ("cuda", ONE_FORWARD)):  # cuda: one joint forward per batch
        with using_width_step(64 if step == "cuda" else step, forward_cost=cost):
            with torch.no_grad():
                s = generate(model.eval(), PROMPTS, 6, 24, stop_id=4, pad_id=0, uniforms=u, decode=decode)
                r = score_samples(rm, PROMPTS, s, 0, standardise=False)
            model.zero_grad()
            lp = sequence_logprobs(model, PROMPTS, s.tokens, mask=s.mask)
            lp.sum().backward()
            out[step] = s, r, lp.detach(), [p.grad.clone() for p in model.parameters()]
    s1, r1, lp1, g1 = out[1]
    assert 0 < int((s1.mask.sum(1) < 24).sum()) < len(s1.mask)  # some rows stopped early, some ran to the end
    for step in (16, 64, "cuda"):
        s, r, lp, g = out[step]
        assert torch.equal(s.tokens, s1.tokens) and torch.equal(s.mask, s1.mask)
        torch.testing.assert_close(s.logprobs, s1.logprobs, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lp, lp1, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lp, s.logprobs, atol=1e-4, rtol=1e-4)  # the loss sees what sampled
        torch.testing.assert_close(r, r1, atol=1e-5, rtol=1e-5)
        for a, b in zip(g, g1):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_the_joint_forward_runs_compiled():
    """The joint scoring forward compiled (shapes.forward_compile; reduce-overhead on a GPU) gives the eager numbers."""
    model = tiny(0)
    u = torch.rand(len(PROMPTS) * 3, 12, generator=torch.Generator().manual_seed(0))
    with using_width_step(16, forward_cost=ONE_FORWARD), torch.no_grad():
        s = generate(model.eval(), PROMPTS, 3, 12, stop_id=4, pad_id=0, uniforms=u)
    out, frames = [], torch._dynamo.utils.counters["frames"]
    for mode in ("", "default"):
        set_forward_compile(mode)
        try:
            with using_width_step(16, forward_cost=ONE_FORWARD), count_shapes() as shapes:
                compiled_before = frames["ok"]
                for step in range(3):  # GRPO steps: the counter's mark changes; nothing recompiles
                    shapes.mark(step)
                    model.zero_grad()
                    lp = sequence_logprobs(model, PROMPTS, s.tokens, mask=s.mask)
                    lp.sum().backward()
        finally:
            set_forward_compile("")
        out.append((lp.detach(), model.lm_head.weight.grad.clone(), dict(shapes.counts),
                    frames["ok"] - compiled_before))
    assert out[0][3] == 0 and out[1][3] == 1  # one compile for three steps' forwards
    assert out[1][2] == out[0][2] and sum(out[1][2].values()) == 3  # the compiled forwards counted as the eager ones
    torch.testing.assert_close(out[1][0], out[0][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1][1], out[0][1], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="forward compile mode"):
        set_forward_compile("fast")


def micro_grpo(decode: str, warm_up: bool, steps: int = 12):
    """A default-recipe GRPO run (params.yaml grpo.train: 8 prompts x 8 samples, 48 new tokens, the stop token on)
    at micro size; prompts of 11-32 tokens, the default run's range; a random RM."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=24, depth=1, head_dim=16, n_embd=32, seq_len=256)
    policy, ref, trunk = GPT(config), GPT(config), GPT(config)
    ref.load_state_dict(policy.state_dict())
    rm = RewardModel.from_gpt(trunk).eval()
    torch.nn.init.normal_(rm.head.weight, std=0.5)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 24, (int(torch.randint(11, 33, (1,), generator=g)),), generator=g).tolist()
               for _ in range(64)]
    cfg = grpo_config("grpo.train", steps=steps, decode=decode, seed=0, warm_up=warm_up)
    return grpo_train(policy, ref, prompts, lambda step, gen: torch.randperm(64, generator=gen)[:cfg.prompts_per_step],
                      lambda b, s: score_samples(rm, b, s, 0), cfg, "cpu", stop_id=2, pad_id=0).log


def test_grpo_presents_a_bounded_set_of_shapes():
    with using_width_step(64, forward_cost=ONE_FORWARD):  # a CUDA run's settings: the captured decode, warm-up
        cuda = micro_grpo("static", warm_up=True)
    assert cuda[-1]["attn_shapes"] <= 32 and all(r["attn_shapes_new"] == 0 for r in cuda)  # all met in the warm-up
    with using_width_step(16):  # the CPU ladder (-S compute.width_step=16; the CPU default is exact), dynamic decode
        cpu = micro_grpo("dynamic", warm_up=False)
    assert cpu[-1]["attn_shapes"] <= 64
    exact = micro_grpo("dynamic", warm_up=False)
    assert exact[-1]["attn_shapes"] > 150  # the instrument sees today's unbounded shapes
    assert [r["reward_mean"] for r in cpu] == [r["reward_mean"] for r in cuda] == [r["reward_mean"] for r in exact]
