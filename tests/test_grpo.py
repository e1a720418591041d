"""GRPO math against hand-computed values: advantages, the clipped token loss, the k3 KL gradient."""
import math

import pytest
import torch

from speedrun.rl.grpo import group_advantages, token_loss, zero_std_fraction

torch.set_num_threads(1)
D = torch.float64

# two prompts x three samples: groups [0, 1, 2] (mean 1, std 1) and [1, 1, 4] (mean 2, std sqrt(3))
REWARDS = torch.tensor([0.0, 1.0, 2.0, 1.0, 1.0, 4.0], dtype=D)
CENTERED = [-1.0, 0.0, 1.0, -1.0, -1.0, 2.0]


def test_advantages_group_scale():
    a = group_advantages(REWARDS, 3)  # eps = 1e-4
    expected = [-0.9999000099990001, 0.0, 0.9999000099990001,
                -0.5773169377806823, -0.5773169377806823, 1.1546338755613645]
    assert torch.allclose(a, torch.tensor(expected, dtype=D), atol=1e-12)
    assert a.shape == (6,) and a.dtype == D


def test_advantages_batch_scale():
    # all six rewards: mean 1.5, squared deviations sum 9.5, Bessel std sqrt(9.5/5) = 1.378404875209022
    a = group_advantages(REWARDS, 3, scale="batch")
    s = 1.378404875209022 + 1e-4
    assert torch.allclose(a, torch.tensor([c / s for c in CENTERED], dtype=D), atol=1e-12)
    assert math.isclose(a[-1].item(), 1.4508472446981668, rel_tol=1e-12)


def test_advantages_none_scale_and_zero_std_group():
    assert group_advantages(REWARDS, 3, scale="none").tolist() == CENTERED
    a = group_advantages(torch.tensor([2.0, 2.0, 0.0, 1.0]), 2, eps=1e-4)
    assert a[:2].tolist() == [0.0, 0.0]  # equal rewards: no signal, no division by zero
    assert torch.isfinite(a).all()
    # int rewards are promoted to float
    assert group_advantages(torch.tensor([0, 1, 1, 1]), 2, scale="none").tolist() == [-0.5, 0.5, 0.0, 0.0]


def test_advantages_validation():
    with pytest.raises(ValueError, match="multiple of group_size"):
        group_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 3), 3)
    with pytest.raises(ValueError, match="group_size >= 2"):
        group_advantages(torch.zeros(4), 1)
    with pytest.raises(ValueError, match="scale"):
        group_advantages(torch.zeros(4), 2, scale="std")
    with pytest.raises(ValueError, match="index 3"):
        group_advantages(torch.tensor([0.0, 1.0, 2.0, float("nan")]), 2)


def test_zero_std_fraction():
    assert zero_std_fraction(torch.tensor([1.0, 1.0, 0.0, 1.0, 3.0, 3.0]), 2) == pytest.approx(2 / 3)
    assert zero_std_fraction(REWARDS, 3) == 0.0


def _batch():
    """Two sequences x two tokens. Seq 0 (A=+1): ratio 1.5 (clipped at 1.2) and ratio 1.0.
    Seq 1 (A=-2): ratio 0.9 (inside the clip range) and a padded token with logp = -inf."""
    old = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], dtype=D)
    logp = torch.tensor([[-1.0 + 0.4054651081081644, -2.0],
                         [-0.5 - 0.10536051565782628, float("-inf")]], dtype=D, requires_grad=True)
    # ref - logp = 0, ln 2, -0.5 on the real tokens
    ref = torch.tensor([[-1.0 + 0.4054651081081644, -2.0 + 0.6931471805599453],
                        [-0.5 - 0.10536051565782628 - 0.5, -7.0]], dtype=D)
    adv = torch.tensor([1.0, -2.0], dtype=D)
    mask = torch.tensor([[True, True], [True, False]])
    return logp, old, ref, adv, mask


def test_token_loss_hand_computed():
    logp, old, ref, adv, mask = _batch()
    loss, stats = token_loss(logp, old, ref, adv, mask, clip_eps=0.2, beta=0.1)
    # pg: -min(1.5, 1.2)*1 = -1.2 ; -1*1 = -1 ; -min(0.9*-2, 0.9*-2) = 1.8  -> mean -0.4/3
    # k3: 0 ; 2 - ln2 - 1 = 0.30685281944005 ; e^-0.5 + 0.5 - 1 = 0.10653065971263  -> mean 0.13779449305090
    assert stats["pg_loss"] == pytest.approx(-0.4 / 3, abs=1e-12)
    assert stats["kl"] == pytest.approx(0.13779449305089606, abs=1e-12)
    assert loss.item() == pytest.approx(-0.11955388402824373, abs=1e-12)
    assert stats["loss"] == pytest.approx(loss.item())
    assert stats["clip_frac"] == pytest.approx(1 / 3)
    assert stats["ratio_outside_frac"] == pytest.approx(1 / 3)
    assert stats["ratio_mean"] == pytest.approx((1.5 + 1.0 + 0.9) / 3, abs=1e-12)
    assert stats["logp_mean"] == pytest.approx(-1.066631802516554, abs=1e-12)
    assert stats["n_tokens"] == 3.0
    assert all(isinstance(v, float) for v in stats.values())

    loss.backward()
    g = logp.grad
    assert torch.isfinite(g).all(), "the -inf on the padded token must not leak NaN into the gradient"
    # d/dlogp per token, /3 tokens: pg: 0 (clipped) ; -A*rho = -1 ; -A*rho = 1.8   kl: beta*(1 - e^(ref-logp))
    expected = torch.tensor([[0.0 + 0.1 * (1 - 1.0), -1.0 + 0.1 * (1 - 2.0)],
                             [1.8 + 0.1 * (1 - math.exp(-0.5)), 0.0]], dtype=D) / 3
    assert torch.allclose(g, expected, atol=1e-12)


def test_clip_matters_off_policy():
    # a later inner step (mu > 1): logp has moved away from old_logp; with A > 0 and rho = 1.5 the clip
    # (eps 0.2) stops the gradient, without it (eps 10) the token pushes with -A * rho
    old = torch.tensor([[-1.0]], dtype=D)
    adv = torch.tensor([2.0], dtype=D)
    mask = torch.ones(1, 1, dtype=torch.bool)
    grads, losses = [], []
    for eps in (0.2, 10.0):
        logp = torch.tensor([[-1.0 + math.log(1.5)]], dtype=D, requires_grad=True)
        loss, stats = token_loss(logp, old, logp.detach(), adv, mask, clip_eps=eps, beta=0.0)
        loss.backward()
        grads.append(logp.grad.item())
        losses.append(loss.item())
    assert grads[0] == 0.0 and grads[1] == pytest.approx(-3.0)
    assert losses[0] == pytest.approx(-2.4) and losses[1] == pytest.approx(-3.0)
    # negative advantage with rho < 1 - eps: clipped as well; ratio outside but A < 0 with rho > 1: not clipped
    logp = torch.tensor([[-1.0 + math.log(0.5)], [-1.0 + math.log(1.5)]], dtype=D, requires_grad=True)
    loss, stats = token_loss(logp, old.expand(2, 1), logp.detach(), torch.tensor([-1.0, -1.0], dtype=D),
                             torch.ones(2, 1, dtype=torch.bool), clip_eps=0.2, beta=0.0)
    loss.backward()
    assert stats["clip_frac"] == 0.5 and stats["ratio_outside_frac"] == 1.0
    assert logp.grad[0, 0].item() == 0.0 and logp.grad[1, 0].item() == pytest.approx(1.5 / 2)


def test_on_policy_gradient_is_minus_advantage():
    logp = torch.tensor([[-0.3, -1.2, -2.0]], dtype=D, requires_grad=True)
    loss, stats = token_loss(logp, logp.detach(), logp.detach(), torch.tensor([0.5], dtype=D),
                             torch.ones(1, 3, dtype=torch.bool), clip_eps=0.2, beta=0.04)
    loss.backward()
    assert torch.allclose(logp.grad, torch.full((1, 3), -0.5 / 3, dtype=D))
    assert stats["kl"] == 0.0 and stats["clip_frac"] == 0.0 and stats["ratio_mean"] == 1.0


def test_kl_gradient():
    mask = torch.ones(1, 2, dtype=torch.bool)
    zero_adv = torch.zeros(1, dtype=D)
    ref = torch.tensor([[-1.0, -2.0]], dtype=D)
    # policy != reference: the k3 term pulls logp toward ref (its gradient is 1 - e^(ref - logp))
    logp = torch.tensor([[-1.5, -1.0]], dtype=D, requires_grad=True)
    loss, stats = token_loss(logp, logp.detach(), ref, zero_adv, mask, clip_eps=0.2, beta=1.0)
    loss.backward()
    expected = torch.tensor([[1 - math.exp(0.5), 1 - math.exp(-1.0)]], dtype=D) / 2
    assert torch.allclose(logp.grad, expected, atol=1e-12)
    assert (logp.grad != 0).all() and stats["kl"] > 0
    assert logp.grad[0, 0] < 0 < logp.grad[0, 1]  # descent raises logp below ref, lowers it above ref
    # policy == reference: KL 0 and zero gradient
    logp = ref.clone().requires_grad_(True)
    loss, stats = token_loss(logp, logp.detach(), ref, zero_adv, mask, clip_eps=0.2, beta=1.0)
    loss.backward()
    assert stats["kl"] == 0.0 and torch.all(logp.grad == 0)


def test_old_and_ref_are_constants():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.9]], requires_grad=True)
    ref = torch.tensor([[-0.9, -2.2]], requires_grad=True)
    loss, _ = token_loss(logp, old, ref, torch.tensor([1.0]), torch.ones(1, 2), clip_eps=0.2, beta=0.1)
    loss.backward()
    assert old.grad is None and ref.grad is None and logp.grad is not None


def test_token_loss_validation():
    logp = torch.zeros(2, 3)
    ok = dict(old_logp=logp, ref_logp=logp, advantages=torch.zeros(2), mask=torch.ones(2, 3), clip_eps=0.2, beta=0.1)
    with pytest.raises(ValueError, match="advantages"):
        token_loss(logp, **{**ok, "advantages": torch.zeros(3)})
    with pytest.raises(ValueError, match="ref_logp shape"):
        token_loss(logp, **{**ok, "ref_logp": torch.zeros(2, 4)})
    with pytest.raises(ValueError, match="no completion tokens"):
        token_loss(logp, **{**ok, "mask": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        token_loss(torch.zeros(6), **{**ok, "old_logp": torch.zeros(6), "ref_logp": torch.zeros(6),
                                      "mask": torch.ones(6)})
