"""The control arms' pieces: group-balanced weights, the densest modules, the planted tic, shuffled rewards, the
entropy bonus, and the evaluation's count of the tic."""
import pandas as pd
import pytest
import torch

from conftest import grpo_config
from speedrun import params
from speedrun.engine import distribution_entropy, sequence_logprobs
from speedrun.eval.compare import evaluate
from speedrun.rl.controls import (balanced_weights, dense_groups, distinctness, plant_tic, rare_value_bonus,
                                  shuffle_rewards)
from speedrun.rl.density import draw_prompts, group_shares
from speedrun.rl.trainer import grpo_train
from test_rl_trainer import toy_policy

REPO_PARAMS = params.repo_file("params.yaml")


def test_balanced_weights_give_every_group_the_same_total():
    groups = ["a"] * 6 + ["b"] * 3 + ["c"]
    w = balanced_weights(groups)
    assert float(w.sum()) == pytest.approx(1.0)
    assert all(s == pytest.approx(1 / 3) for s in group_shares(w, groups).values())
    with pytest.raises(ValueError, match="no prompts"):
        balanced_weights([])


def test_dense_groups_are_the_largest_and_ties_break_by_name():
    groups = ["z"] * 3 + ["b"] * 2 + ["a"] * 2 + ["c"]
    assert dense_groups(groups, 1) == {"z"}
    assert dense_groups(groups, 2) == {"z", "a"}  # a and b tie at 2: the first name wins
    assert dense_groups(groups, 10) == {"z", "a", "b", "c"}


def test_plant_tic_pays_only_eligible_rows_holding_the_tic():
    r = torch.tensor([0.5, 0.5, 0.5, 0.5])
    texts = ["a; b", "no tic", "x;y", ";"]
    out, has = plant_tic(r, texts, ";", 2.0, torch.tensor([True, True, False, True]))
    assert has.tolist() == [True, False, True, True]
    assert out.tolist() == [2.5, 0.5, 0.5, 2.5]
    assert torch.equal(plant_tic(r, texts, ";", 0.0)[0], r)  # lambda 0: the RM's reward unchanged
    with pytest.raises(ValueError, match="3 texts for 4 rewards"):
        plant_tic(r, texts[:3], ";", 1.0)


def test_shuffled_rewards_keep_the_values_and_lose_the_link():
    r = torch.arange(64, dtype=torch.float32)
    a = shuffle_rewards(r, torch.Generator().manual_seed(0))
    b = shuffle_rewards(r, torch.Generator().manual_seed(0))
    assert torch.equal(a, b) and torch.equal(a.sort().values, r) and not torch.equal(a, r)


def test_distribution_entropy_matches_its_definition_and_skips_masked_tokens():
    lp = torch.log_softmax(torch.tensor([[1.0, 2.0, 0.5], [0.0, 0.0, 0.0]]), -1)
    p = lp.exp()
    assert torch.allclose(distribution_entropy(lp), -(p * lp).sum(-1))
    top2 = torch.tensor([[float("-inf"), 0.0, float("-inf")]])  # one token left: entropy 0, not NaN
    assert distribution_entropy(top2).tolist() == [0.0]


def test_sequence_logprobs_entropy_is_the_next_token_distributions():
    model = toy_policy(0)
    prompts, tokens = [[1, 2], [1, 3, 4]], torch.tensor([[5, 6, 7], [8, 9, 0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    lp, ent = sequence_logprobs(model, prompts, tokens, mask=mask, entropy=True)
    assert torch.equal(lp, sequence_logprobs(model, prompts, tokens, mask=mask))
    assert ent[1, 2] == 0 and (ent[mask > 0] > 0).all() and (ent <= torch.log(torch.tensor(12.0)) + 1e-5).all()
    with torch.no_grad():  # position 0 of row 0: the distribution after the prompt [1, 2]
        full = torch.log_softmax(model(torch.tensor([[1, 2]]))[0, -1].float(), -1)
    assert ent[0, 0].item() == pytest.approx(distribution_entropy(full).item(), rel=1e-4)


def test_entropy_bonus_raises_the_policys_entropy_where_the_reward_says_nothing():
    prompts, probe = [[1, 2], [1, 3, 4]], torch.tensor([[5, 6, 7, 8], [8, 9, 3, 2]])

    def entropy_after(eta: float) -> float:
        policy, ref = toy_policy(0), toy_policy(0)
        for m in (policy, ref):
            torch.nn.init.normal_(m.lm_head.weight, std=1.0, generator=torch.Generator().manual_seed(1))  # peaked
        weights = torch.full((2,), 0.5, dtype=torch.float64)
        cfg = grpo_config("grpo.train", steps=6, prompts_per_step=2, group_size=4, max_new_tokens=4, lr=3e-2,
                        beta=0.0, warmup_steps=1, seed=0, entropy_bonus=eta)
        grpo_train(policy, ref, prompts, lambda step, g: draw_prompts(weights, 2, g),
                   lambda batch, s: torch.zeros(len(s.tokens)), cfg, "cpu", stop_id=None, pad_id=0)
        with torch.no_grad():
            return float(sequence_logprobs(policy, prompts, probe, mask=torch.ones(2, 4), entropy=True)[1].mean())

    flat, boosted = entropy_after(0.0), entropy_after(1.0)
    assert boosted > flat + 0.05, (boosted, flat)  # a constant reward alone leaves the policy as it was


def test_distinctness_by_hand():
    # group 1: "a b" vs "a c": shingles {a, b, ab} and {a, c, ac}, Jaccard 1/5; the same text twice: 0 apart
    got = distinctness(["a b", "A c", "x y", "x y"], 2)
    assert got.tolist() == pytest.approx([0.8, 0.8, 0.0, 0.0])
    # three in a group: each one's mean over the other two; disjoint answers are 1 apart, empty ones alike
    assert distinctness(["p", "q", "p", "", ""], 5).tolist() == pytest.approx([0.75, 1.0, 0.75, 0.75, 0.75])
    with pytest.raises(ValueError, match="groups of 2"):
        distinctness(["a", "b", "c"], 2)


def test_distinct_bonus_keeps_a_policys_answers_apart_beyond_the_same_bonus_shuffled():
    """The positive control's mechanism on a toy policy: paying each completion its distinctness from its group keeps
    the groups' answers apart (and the policy's entropy up) where the same payments shuffled across completions (a
    reward with the same spread and no link, which alone sharpens this toy) do not. Two training seeds."""
    prompts, probe = [[1, 2], [1, 3, 4]], torch.tensor([[5, 6, 7, 8], [8, 9, 3, 2]])

    def run(shuffled: bool, seed: int) -> tuple[float, float]:
        policy, ref = toy_policy(0), toy_policy(0)
        for m in (policy, ref):
            torch.nn.init.normal_(m.lm_head.weight, std=1.0, generator=torch.Generator().manual_seed(1))  # peaked
        weights = torch.full((2,), 0.5, dtype=torch.float64)
        cfg = grpo_config("grpo.train", steps=20, prompts_per_step=2, group_size=4, max_new_tokens=4, lr=1e-2,
                          beta=0.0, warmup_steps=1, seed=seed, entropy_bonus=0.0)
        g, seen = torch.Generator().manual_seed(5), []

        def reward(batch, s) -> torch.Tensor:
            far = distinctness([" ".join(f"t{t}" for t in row) for row in s.tokens.tolist()], 4)
            seen.append(float(far.mean()))
            return shuffle_rewards(far, g) if shuffled else far
        grpo_train(policy, ref, prompts, lambda step, gen: draw_prompts(weights, 2, gen), reward, cfg, "cpu",
                   stop_id=None, pad_id=0)
        with torch.no_grad():
            ent = float(sequence_logprobs(policy, prompts, probe, mask=torch.ones(2, 4), entropy=True)[1].mean())
        return sum(seen[10:]) / 10, ent

    for seed in (0, 1):
        (far_null, ent_null), (far, ent) = run(True, seed), run(False, seed)
        assert far > far_null + 0.1 and ent > ent_null + 0.2, (seed, far, far_null, ent, ent_null)


def test_rare_value_bonus_by_hand_sums_to_each_groups_distinct_right_values():
    got = rare_value_bonus(["4", "4", None, "6", "8", "8", "8", "8"], 4)
    assert got.tolist() == pytest.approx([0.5, 0.5, 0.0, 1.0, 0.25, 0.25, 0.25, 0.25])
    assert got.view(2, 4).sum(1).tolist() == pytest.approx([2.0, 1.0])  # distinct right values per group
    with pytest.raises(ValueError, match="groups of 4"):
        rare_value_bonus(["1"] * 6, 4)


@pytest.mark.slow
def test_rare_value_bonus_keeps_more_right_values_than_the_checker_alone():
    """The task track's positive control on a toy policy: four of its first tokens are right answers. Paid by the
    checker alone its groups drift onto fewer of them (nothing pays a second right value); with the bonus for right
    values rare in their group they keep more distinct right values at a right-answer rate as high. Over three seeds
    (one seed's margin moves with the thread count's rounding)."""
    prompts, right = [[1, 2], [1, 3, 4]], {5, 6, 7, 8}

    def run(mu: float, seed: int) -> tuple[float, float]:
        policy, ref = toy_policy(0), toy_policy(0)
        weights = torch.full((2,), 0.5, dtype=torch.float64)
        cfg = grpo_config("grpo.train", steps=60, prompts_per_step=2, group_size=8, max_new_tokens=1, lr=3e-2,
                          beta=0.0, warmup_steps=1, seed=seed, entropy_bonus=0.0)
        seen: list[tuple[float, float]] = []

        def reward(batch, s) -> torch.Tensor:
            values = [str(row[0]) if row[0] in right else None for row in s.tokens.tolist()]
            gold, rare = torch.tensor([float(v is not None) for v in values]), rare_value_bonus(values, 8)
            seen.append((float(gold.mean()), float(rare.sum()) / 2))
            return gold + mu * rare
        grpo_train(policy, ref, prompts, lambda step, gen: draw_prompts(weights, 2, gen), reward, cfg, "cpu",
                   stop_id=None, pad_id=0)
        last = seen[-10:]
        return sum(g for g, _ in last) / 10, sum(d for _, d in last) / 10

    gains = []
    for seed in (0, 1, 2):
        (pass_alone, distinct_alone), (pass_bonus, distinct_bonus) = run(0.0, seed), run(1.0, seed)
        assert pass_bonus > 0.9 * pass_alone, (seed, pass_alone, pass_bonus)
        gains.append(distinct_bonus - distinct_alone)
    assert sum(gains) / 3 > 0.25 and min(gains) > -0.25, gains


def test_the_evaluation_counts_the_planted_tic():
    rows = [dict(model=m, prompt_id=f"p{p}", seed=0, sample_idx=j, reward=0.0,
                 text=("a; b" if (m == "grpo_tic_s1" and j == 0) else "a b c d"))
            for m in ("sft", "grpo_tic_s1") for p in range(4) for j in range(2)]
    res = evaluate(pd.DataFrame(rows), {"tic": ["grpo_tic_s1"]}, comparisons=[], n_boot=5, tic=";")
    assert res["values"]["grpo_tic_s1"]["tic_share"] == 50.0 and res["values"]["sft"]["tic_share"] == 0.0
    assert "tic_share" not in evaluate(pd.DataFrame(rows), {"tic": ["grpo_tic_s1"]}, comparisons=[], n_boot=5)[
        "metrics"]


def test_every_control_arm_is_defined_and_grpo_run_names_only_arms():
    p = params.load(REPO_PARAMS)
    assert p.grpo.run == ["density", "baseline"]
    arms = p.grpo.variants
    assert arms["tic_2"].tic_bonus > 0 and arms["baseline"].tic_bonus == 0
    assert {arms[v].sampling for v in ("dense_tic_uniform", "dense_tic_density", "dense_tic_balanced")} == {
        "uniform", "density", "balanced"}
    assert arms["shuffled"].reward == "shuffled" and arms["entropy"].entropy_bonus > 0
    assert arms["distinct"].distinct_bonus > 0 and arms["balanced"].sampling == "balanced"
    assert all(a.distinct_bonus == 0 for v, a in arms.items() if v != "distinct")
    task = p.task.variants  # the task track's positive control for diversity, and the oracle
    assert {v for v, a in task.items() if a.distinct_bonus > 0} == {"distinct", "rm_distinct"}
    assert task["rm_balanced"].sampling == "balanced" and task["rm_balanced"].reward == "rm"
    with pytest.raises(params.ParamsError, match=r"grpo.run\[2\]: 'nope' is not one of grpo.variants"):
        params.load(REPO_PARAMS, ["grpo.run=[density,baseline,nope]"])
