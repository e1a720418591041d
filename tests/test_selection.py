"""The task arms peers ship, on planted rewards: the zero-spread filter, the pass-rate band, zero-success gating (their
rules and the trainer's refill), the pass@k advantage against Chen et al.'s formula, and clip-higher's upper clip."""
import itertools
import re
import math

import pytest
import torch

from conftest import grpo_config
from speedrun.rl.grpo import group_advantages, passk_advantages, token_loss
from speedrun.rl.run import PromptDraws
from speedrun.rl.selection import Gate, keep_band, keep_spread, pass_rates, selector
from speedrun.rl.trainer import grpo_train
from test_rl_trainer import toy_policy

G = 4
# four groups of four binary rewards: pass rates 0, 0.25, 0.5, 1
PLANTED = torch.tensor([0., 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1])


def test_the_filter_drops_exactly_the_zero_spread_groups():
    assert keep_spread(PLANTED, G).tolist() == [False, True, True, False]
    assert keep_spread(torch.tensor([0.3, 0.3, -1.2, 0.5]), 2).tolist() == [False, True]  # a real-valued reward


def test_the_band_keeps_only_groups_whose_pass_rate_lies_in_it():
    assert pass_rates(PLANTED, G, 0.5).tolist() == [0.0, 0.25, 0.5, 1.0]
    assert keep_band(PLANTED, G, [0.25, 0.75], 0.5).tolist() == [False, True, True, False]
    assert keep_band(PLANTED, G, [0.4, 0.6], 0.5).tolist() == [False, False, True, False]
    # the reward model's standardised score passes above 0
    assert keep_band(torch.tensor([-1., 0.2, -0.1, -3.]), G, [0.25, 0.75], 0.0).tolist() == [True]


def test_the_gate_draws_only_items_with_no_success_and_opens_when_too_few_remain():
    gate = Gate(4, 0.5)
    draws = PromptDraws(torch.full((4,), 0.25, dtype=torch.float64), 2, gate)
    idx = torch.tensor([0, 1, 2, 3])
    assert gate.observe(idx, PLANTED, G).all()  # every group of a gated draw trains
    assert gate.solved.tolist() == [False, True, True, True]  # item 0's group had no passing completion
    assert gate.weights(draws.weights, 1).tolist() == [1.0, 0.0, 0.0, 0.0]
    for step in range(5):  # one unsolved item, two prompts a step: the gate opens, and counts it
        assert len(draws(step, torch.Generator().manual_seed(step))) == 2
    assert gate.open_steps == 5


def test_the_selector_counts_what_it_sees_and_keeps():
    sel = selector("filter", G, [0.25, 0.75], 0.5, None)
    assert sel(torch.arange(4), PLANTED).tolist() == [False, True, True, False]
    assert sel.counts == {"seen": 4, "kept": 2}
    assert selector("uniform", G, [0.25, 0.75], 0.5, None) is None


def test_passk_advantage_is_the_papers_formula_on_a_hand_computed_group():
    # N = 8 completions, c = 2 right, k = 4: mean = 1 - C(6,4)/C(8,4) = 1 - 15/70 = 11/14, std = sqrt(11/14 * 3/14);
    # a right one: (1 - 11/14) / std; a wrong one: (1 - 11/14 - C(5,3)/C(7,3)) / std = (3/14 - 10/35) / std
    std = math.sqrt(11 / 14 * 3 / 14)
    right, wrong = (3 / 14) / std, (3 / 14 - 10 / 35) / std
    a = passk_advantages(torch.tensor([1., 0, 0, 1, 0, 0, 0, 0]), 8, 4, eps=0.0)
    assert a.tolist() == pytest.approx([right, wrong, wrong, right, wrong, wrong, wrong, wrong], abs=1e-6)
    assert right == pytest.approx(0.5222, abs=1e-4) and wrong == pytest.approx(-0.1741, abs=1e-4)
    assert float(a.sum()) == pytest.approx(0.0, abs=1e-6)  # centred: the k-subsets' mean
    # every completion right or every one wrong: no signal
    assert passk_advantages(torch.ones(8), 8, 4).abs().max() == 0


def test_passk_advantage_on_real_rewards_enumerates_the_k_subsets():
    x = torch.tensor([0.3, -1.2, 2.0, 0.7, 0.7, -0.4], dtype=torch.float64)
    subsets = list(itertools.combinations(range(6), 3))
    best = {s: float(x[list(s)].max()) for s in subsets}
    mean = sum(best.values()) / len(best)
    std = math.sqrt(sum((b - mean) ** 2 for b in best.values()) / len(best))
    want = [(sum(b for s, b in best.items() if j in s) / sum(j in s for s in subsets) - mean) / std for j in range(6)]
    assert passk_advantages(x, 6, 3, eps=0.0).tolist() == pytest.approx(want, abs=1e-9)
    # k = 1: GRPO's centred reward
    assert passk_advantages(x, 6, 1, scale="none").tolist() == pytest.approx(
        group_advantages(x, 6, scale="none").tolist(), abs=1e-9)
    with pytest.raises(ValueError, match="k must lie in"):
        passk_advantages(x, 6, 7)


def test_clip_higher_lets_a_positive_token_rise_further():
    logp = torch.tensor([[math.log(1.25)]], requires_grad=True)
    old, adv, mask = torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1)
    _, sym = token_loss(logp, old, logp.detach(), adv, mask, clip_eps=0.2, beta=0.0)
    loss, high = token_loss(logp, old, logp.detach(), adv, mask, clip_eps=0.2, beta=0.0, clip_high=0.28)
    assert sym["clip_frac"] == 1.0 and high["clip_frac"] == 0.0  # ratio 1.25: above 1.2, below 1.28
    loss.backward()
    assert logp.grad.item() < 0  # the gradient still raises it
    # the lower clip is clip_eps's either way
    _, low = token_loss(torch.tensor([[math.log(0.75)]]), old, old, -adv, mask, clip_eps=0.2, beta=0.0,
                        clip_high=0.28)
    assert low["clip_frac"] == 1.0


class Recorded(PromptDraws):
    """The draws, each with the items the gate had solved before it."""
    seen: list

    def __call__(self, step, g):
        before = self.gate.solved.clone() if self.gate is not None else None
        idx = super().__call__(step, g)
        self.seen = getattr(self, "seen", []) + [(before, idx)]
        return idx


def _run(sampling: str, steps: int = 3, rounds: int = 3, band=(0.25, 0.75)):
    policy, ref = toy_policy(0), toy_policy(0)
    prompts = [[1, 2], [1, 3, 4], [1, 6], [1, 7, 8, 9], [1, 10], [1, 11]]
    weights = torch.full((len(prompts),), 1 / 6, dtype=torch.float64)
    reward = lambda batch, s: (s.tokens[:, 0] == 5).float()  # noqa: E731  (p about 1/12: many groups all 0)
    gate = Gate(len(prompts), 0.5) if sampling == "gate" else None
    draws = Recorded(weights, 2, gate)
    sel = selector(sampling, 8, list(band), 0.5, gate)
    cfg = grpo_config("grpo.train", steps=steps, prompts_per_step=2, group_size=8, max_new_tokens=3, lr=3e-2,
                      beta=0.0, warmup_steps=1, seed=0, select_rounds=rounds)
    return grpo_train(policy, ref, prompts, draws, reward, cfg, "cpu", stop_id=None, pad_id=0, select=sel), sel, draws


def test_a_selection_arm_refills_its_batch_and_counts_every_rollout():
    plain, _, _ = _run("uniform")
    assert [r["rollouts"] for r in plain.log] == [16, 16, 16] and all(r["groups_trained"] == 2 for r in plain.log)
    filt, sel, _ = _run("filter")
    assert all(r["zero_std_frac"] == 0 for r in filt.log if r["groups_trained"])  # only groups with spread train
    assert sum(r["rollouts"] for r in filt.log) == 8 * sel.counts["seen"]
    # each step trains a full batch, or has spent every draw it may
    assert all(r["groups_trained"] == 2 or r["rollouts"] == 48 for r in filt.log)
    assert sum(r["groups_trained"] for r in filt.log) <= sel.counts["kept"]
    assert any(r["rollouts"] > 16 for r in filt.log)  # the toy policy's groups are often all wrong: refills happen
    # a band nothing can enter: every draw is spent each step, and nothing trains
    none, sel, _ = _run("band", band=(0.4, 0.41))
    assert [r["rollouts"] for r in none.log] == [48, 48, 48] and sel.counts["kept"] == 0
    assert all(r["groups_trained"] == 0 and r["grad_norm"] == 0 for r in none.log)


def test_a_filter_that_keeps_every_group_samples_what_the_plain_arm_samples():
    plain, _, _ = _run("uniform", steps=2)
    wide, sel, _ = _run("band", steps=2, band=(0.0, 1.0))  # every group in the band
    assert sel.counts == {"seen": 4, "kept": 4}
    assert [r["reward_mean"] for r in wide.log] == [r["reward_mean"] for r in plain.log]
    assert [r["loss"] for r in wide.log] == pytest.approx([r["loss"] for r in plain.log], abs=1e-6)


def test_gated_draws_leave_solved_items_alone():
    result, sel, draws = _run("gate", steps=6)
    assert sel.counts["seen"] == 12 and all(r["rollouts"] == 16 for r in result.log)
    gate = draws.gate
    assert gate.solved.any()
    for before, idx in draws.seen:  # no solved item is drawn again while enough are open
        if int((~before).sum()) >= 2:
            assert not before[idx].any()
    assert gate.open_steps == sum(int((~b).sum()) < 2 for b, _ in draws.seen)


@pytest.mark.parametrize("overrides, message", [
    (["task.run=[clip_higher, checker]"], "task.variants.clip_higher.clip_high: acts only with task.train.inner"),
    (["task.train.band=[0.8, 0.2]"], "task.train.band: [0.8, 0.2] must be [low, high]"),
    (["task.run=[passk, checker]", "task.train.pass_k=9"], "task.train.pass_k: 9 is above the group size 8"),
])
def test_an_arm_that_cannot_act_is_refused_at_load(overrides, message):
    from speedrun import params
    from conftest import REPO
    arm = overrides[0].split("[")[1].split(",")[0] if overrides[0].startswith("task.run") else "density"
    with pytest.raises(params.ParamsError, match=re.escape(message)):
        params.load(REPO / "params.yaml", overrides + [f"task.eval.comparisons=['{arm}:checker']"])
    params.load(REPO / "params.yaml", ["task.run=[clip_higher, checker]", "task.train.inner_updates=2",
                                       "task.eval.comparisons=['clip_higher:checker']"])
