"""Diversity at an equal reward: a run is read against the SFT model's temperature envelope at its own reward."""
import random

import pandas as pd
import pytest

from speedrun.common import UserError
from speedrun.eval.compare import METRIC_BY_NAME, evaluate
from speedrun.eval.flat import flat_metrics
from speedrun.eval.equal_reward import equal_reward_section

TEMPS = {"sft@T0.4": 0.4, "sft@T0.7": 0.7, "sft@T1": 1.0, "sft@T1.3": 1.3}


def responses(model: str, temperature: float, same: bool = False, n_prompts: int = 12, k: int = 4) -> list[dict]:
    """A sampler whose colder draws pick from fewer words and earn more reward: sharpening by construction. same:
    every response to a prompt is the prompt's first one (a collapsed model) at that temperature's reward."""
    rng = random.Random(f"{temperature}")  # the same draws whichever model is built from this temperature
    rows = []
    for p in range(n_prompts):
        vocab = [f"p{p}w{i}" for i in range(int(60 * temperature))]
        texts = [" ".join(rng.choice(vocab) for _ in range(10)) for _ in range(k)]
        for j in range(k):
            rows.append(dict(model=model, prompt_id=f"q{p}", seed=0, sample_idx=j, text=texts[0 if same else j],
                             reward=1.0 - temperature + 0.01 * rng.random()))
    return rows


@pytest.fixture(scope="module")
def setup():
    control = pd.DataFrame([r for m, t in TEMPS.items() for r in responses(m, t)])
    runs = {"sharp_s1": (0.7, False), "sharp_s2": (0.7, False), "stuck_s1": (1.0, True), "stuck_s2": (1.0, True)}
    samples = pd.DataFrame(responses("sft", 1.0) + [r for m, (t, same) in runs.items() for r in responses(m, t, same)])
    variants = {"stuck": ["stuck_s1", "stuck_s2"], "sharp": ["sharp_s1", "sharp_s2"]}
    res = evaluate(samples, variants, [("stuck", "sharp")], reference="sft", primary=["distinct_1"], n_boot=200,
                   control=control, temperatures=TEMPS)
    return samples, control, variants, res


def test_sharpening_reads_on_the_envelope_and_collapse_below_it(setup):
    """Negative control: a run that is the SFT model sampled colder lies on the envelope (gap 0 on every metric the
    temperatures order). Positive control: a run at the reward of T = 1 that says one thing per prompt lies below,
    its interval under 0, and so does its difference from the sharpened arm (matched reward)."""
    er = setup[3]["equal_reward"]
    assert er["temperatures"] == [0.4, 0.7, 1.0, 1.3]
    for n in ("distinct_1", "distinct_2", "within_distinct_1", "within_self_bleu", "word_entropy"):
        assert er["variants"]["sharp"][n]["value"] == pytest.approx(0.0, abs=1e-9), n
        stuck = er["variants"]["stuck"][n]
        assert stuck["value"] < 0 and stuck["ci_high"] < 0, n
        assert er["comparisons"]["stuck - sharp"][n]["ci_high"] < 0, n
    assert not any(r["outside"]["point"] for r in er["runs"].values())
    assert "reward" not in er["metrics"] and "len_words" not in er["metrics"]


def test_the_gap_is_the_value_less_the_envelope_at_the_runs_reward(setup):
    """By hand: the stuck run drew T = 1's rewards, so the envelope at its reward is the most diverse temperature at
    that reward or higher, T = 1 itself (the colder ones earn more and say less): gap = its value less T = 1's."""
    res = setup[3]
    er, values = res["equal_reward"], res["values"]
    t1 = evaluate(setup[1][setup[1]["model"] == "sft@T1"], {}, [], reference=None, n_boot=1)["values"]["sft@T1"]
    assert values["stuck_s1"]["reward"] == pytest.approx(t1["reward"])
    for n, sign in (("distinct_1", 1), ("within_self_bleu", -1)):  # a lower-is-better metric read with its sign turned
        want = sign * (values["stuck_s1"][n] - t1[n])
        assert er["runs"]["stuck_s1"]["gap"][n] == pytest.approx(want, abs=1e-9) and want < 0


def test_report_section_and_dvc_metrics(setup):
    res = setup[3]
    md = equal_reward_section(res["equal_reward"], ["distinct_1", "word_entropy"], METRIC_BY_NAME)
    assert "| distinct-1 |" in md and "stuck - sharp" in md and "- stuck: interval below 0 on 2 of these 2" in md
    flat = flat_metrics(res)
    assert flat["stuck_vs_sharp_at_equal_reward"]["distinct_1_ci_high"] < 0
    assert set(flat["sharp_at_equal_reward"]) == {"distinct_1", "distinct_1_ci_low", "distinct_1_ci_high"}


def test_a_control_on_other_rows_is_refused(setup):
    samples, control, variants, _ = setup
    with pytest.raises(UserError, match="rows differ"):
        evaluate(samples, variants, [("stuck", "sharp")], n_boot=5, control=control[control["prompt_id"] != "q0"],
                 temperatures=TEMPS)
    with pytest.raises(UserError, match="missing"):
        evaluate(samples, variants, [("stuck", "sharp")], n_boot=5, control=control,
                 temperatures=TEMPS | {"sft@T2": 2.0})
