"""The GRPO loop on a toy task: it samples, its ratio starts at exactly the sampling distribution,
and it raises a reward that only sampling can discover."""
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from speedrun.model import GPT, GPTConfig
from speedrun.rl.density import draw_prompts
from conftest import committed, grpo_config
from speedrun.rl.trainer import grpo_train
from speedrun.train.distributed import Dist

TARGET = 5


def toy_policy(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=12, depth=1, head_dim=16, n_embd=32, seq_len=32))
    torch.nn.init.normal_(model.lm_head.weight, std=0.02)  # some initial spread: samples differ
    return model


def run(steps: int, beta: float = 0.0, inner_updates: int = 1, seed: int = 0, stop_id: int | None = None,
        truncated: str = "keep", d: Dist | None = None, **extra):
    policy, ref = toy_policy(seed), toy_policy(seed)
    prompts = [[1, 2], [1, 3, 4], [1, 6], [1, 7, 8, 9]]
    weights = torch.full((len(prompts),), 0.25, dtype=torch.float64)
    reward = lambda batch, s: ((s.tokens == TARGET).float() * s.mask).sum(1) / s.mask.sum(1)  # noqa: E731
    cfg = grpo_config("grpo.train", steps=steps, prompts_per_step=2, group_size=8, max_new_tokens=6, lr=3e-2, beta=beta,
                    inner_updates=inner_updates, warmup_steps=1, seed=seed, truncated=truncated, **extra)
    return policy, ref, grpo_train(policy, ref, prompts, lambda step, g: draw_prompts(weights, 2, g), reward, cfg,
                                   "cpu", stop_id=stop_id, pad_id=0, d=d)


def test_grpo_raises_a_sampled_reward_and_starts_on_policy():
    policy, ref, result = run(25)
    log = result.log
    # mu = 1: the loss's log-probs equal the engine's sampling log-probs, so the ratio is 1
    assert all(abs(r["ratio_mean"] - 1) < 1e-4 and r["clip_frac"] == 0 for r in log)
    first = sum(r["reward_mean"] for r in log[:5]) / 5
    last = sum(r["reward_mean"] for r in log[-5:]) / 5
    assert last > first + 0.3, (first, last)
    assert log[-1]["kl"] > 0  # the policy moved away from the frozen reference
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), toy_policy(0).parameters()))


def test_grpo_is_deterministic_and_kl_anchor_holds_back():
    _, _, a = run(6, beta=0.0)
    p2, _, b = run(6, beta=0.0)
    assert [r["reward_mean"] for r in a.log] == [r["reward_mean"] for r in b.log]
    _, _, anchored = run(25, beta=5.0)
    _, _, free = run(25, beta=0.0)
    assert anchored.log[-1]["kl"] < free.log[-1]["kl"]


def test_inner_updates_make_the_ratio_move():
    _, _, result = run(4, inner_updates=3)
    assert any(r["ratio_mean"] != 1.0 for r in result.log)


def test_truncated_completions_are_logged_and_can_leave_the_loss():
    _, _, plain = run(3)
    assert all(r["truncated_frac"] == 0 for r in plain.log)  # no stop token: fixed-length rows, never truncated
    _, _, kept = run(3, stop_id=3)
    _, _, masked = run(3, stop_id=3, truncated="mask")
    fracs = [r["truncated_frac"] for r in kept.log]
    assert all(0 < f < 1 for f in fracs) and fracs[0] == masked.log[0]["truncated_frac"]  # same first samples
    # masking changes the update (fewer tokens in the loss), hence what the policy samples next
    assert kept.log[0]["loss"] != masked.log[0]["loss"]
    assert [r["reward_mean"] for r in kept.log] != [r["reward_mean"] for r in masked.log]


DDP_RUN = dict(steps=4, beta=0.1, inner_updates=2, stop_id=4, truncated="mask", entropy_bonus=0.01)


def _ddp_worker(rank: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    policy, _, result = run(**DDP_RUN, d=Dist(rank, 2, "cpu"))
    torch.save({"state": policy.state_dict(), "log": result.log, "tokens": result.completion_tokens},
               f"{out}.{rank}")
    dist.destroy_process_group()


def test_two_processes_train_as_one(tmp_path):
    """GRPO across 2 gloo ranks (each samples and scores one of the step's 2 prompts) takes the same steps as one
    process on the same global batch: the same completions and rewards, the same logged stats, the same weights,
    up to float rounding (the gradient is summed over ranks in another order)."""
    policy, _, one = run(**DDP_RUN)
    init = toy_policy(0).state_dict()
    mp.spawn(_ddp_worker, args=(str(tmp_path / "init"), str(tmp_path / "out")), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"out.{r}", weights_only=True) for r in range(2)]
    for r in ranks:
        assert r["tokens"] == one.completion_tokens
        for a, b in zip(r["log"], one.log):
            for k in ("reward_mean", "reward_std", "zero_std_frac", "completion_len", "truncated_frac"):
                assert a[k] == b[k], (k, a[k], b[k])
            for k in ("loss", "pg_loss", "kl", "clip_frac", "ratio_mean", "grad_norm", "entropy", "logp_mean"):
                assert abs(a[k] - b[k]) <= 1e-5 + 1e-4 * abs(b[k]), (k, a[k], b[k])
        # Adam divides each gradient by its own running RMS, so float-order noise in a near-zero gradient becomes a
        # visible weight difference: bound it by 1% of how far training moved the tensor (a rank's missing
        # gradient would differ by the order of the learning rate)
        for name, w in policy.state_dict().items():
            moved = (w - init[name]).abs().max().item()
            gap = (r["state"][name] - w).abs().max().item()
            assert gap <= 1e-2 * moved + 1e-6, (name, gap, moved)
    assert one.log[-1]["kl"] > 0 and any(row["truncated_frac"] > 0 for row in one.log)  # the checks had work


def test_grpo_refuses_a_config_its_stage_did_not_finish():
    """A run-time field left unset (None) stops the trainer by name: no placeholder passes for a setting."""
    cfg = committed("grpo.train", steps=1, prompts_per_step=2, group_size=2, max_new_tokens=2)
    weights = torch.full((2,), 0.5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"\['beta', 'entropy_bonus', 'seed', 'bf16', 'decode', 'warm_up'\]"):
        grpo_train(toy_policy(0), toy_policy(0), [[1, 2], [1, 3]], lambda step, g: draw_prompts(weights, 2, g),
                   lambda batch, s: torch.zeros(len(s.tokens)), cfg, "cpu", stop_id=None, pad_id=0)


def test_log_means_average_the_first_and_last_fifth():
    import pandas as pd
    from speedrun.rl.trainer import log_means
    log = pd.DataFrame({"reward_mean": [float(i) for i in range(10)], "kl": [0.123456] * 10})  # a fifth: 2 steps
    end = {"reward_end": ("reward_mean", 4), "kl_end": ("kl", 3)}
    means = log_means(log, {"reward_start": ("reward_mean", 4)}, end)
    assert means == {"reward_start": 0.5, "reward_end": 8.5, "kl_end": 0.123}
    one = log_means(log[:3], {"s": ("reward_mean", 4)}, {"e": ("reward_mean", 4)})  # under 5 steps: one step each end
    assert one == {"s": 0.0, "e": 2.0}
