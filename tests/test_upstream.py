"""An effect pooled over upstream seeds (speedrun.eval.upstream): the upstream model is the unit of the interval."""
import json

import numpy as np
import pytest

from speedrun.common import write_json
from speedrun.eval.upstream import cluster_interval, markdown, pool, two_way_interval
from speedrun.families import task_rows


def test_the_interval_over_upstream_seeds_is_students_t_on_their_estimates():
    r = cluster_interval([-1.0, -0.8, -1.2])
    assert r["value"] == -1.0 and r["se"] == pytest.approx(0.2 / 3 ** 0.5, abs=1e-5)
    assert r["ci_high"] == pytest.approx(-1.0 + 4.3027 * 0.11547, abs=2e-3)  # t(0.975, 2) = 4.30, not 1.96
    t = 1.0 / 0.11547
    assert r["p"] == pytest.approx(1 - t / (2 + t * t) ** 0.5, abs=1e-4)  # Student's t with 2 df, in closed form
    assert r["mde"] == pytest.approx((4.3027 + 1.0607) * 0.11547, 1e-3)
    disagree = cluster_interval([-1.0, 0.2, -0.4])  # upstream models that disagree: no call from their mean
    assert disagree["ci_low"] < 0 < disagree["ci_high"] and disagree["p"] > 0.05
    with pytest.raises(ValueError, match="at least 2"):
        cluster_interval([-1.0])


def _sub(tmp_path, seed: int, rm_delta: float, checker_delta: float) -> None:
    reading = lambda v: {"value": v}  # noqa: E731
    comps = {f"{a}:shuffled": {"treatment": a, "control": "shuffled", "primary": "gap",
                               **{k: reading(v + i * 0.01) for i, k in enumerate(("gap", "same_temperature",
                                                                                   "matched", "matched_other"))},
                               "pass@1": reading(0.1)}
             for a, v in (("rm", rm_delta), ("checker", checker_delta))}
    gaps = {"shuffled": {"gap": -0.5}, "rm": {"gap": -0.5 + rm_delta, "minus_control": {"gap": rm_delta}},
            "checker": {"gap": -0.5 + checker_delta, "minus_control": {"gap": checker_delta}}}
    training = {a: {"reward_start": [0.1], "reward_end": [0.9]} for a in gaps}
    write_json(tmp_path / f"sft_{seed}/metrics/task.json", {"comparisons": comps, "frontier_gap": gaps,
                                                            "training": training})


def test_pooling_calls_a_consistent_loss_and_not_one_the_upstream_models_disagree_on(tmp_path):
    """Planted sub-runs: the rm arm loses about 1 answer beyond the control under every SFT model (called); the
    checker's delta changes sign between them (not called, though its mean is below 0)."""
    for seed, rm, checker in ((1337, -1.0, -0.6), (2, -0.9, 0.3), (3, -1.1, -0.2)):
        _sub(tmp_path, seed, rm, checker)
    p = pool(tmp_path)
    rm, checker = p["comparisons"]["rm:shuffled"], p["comparisons"]["checker:shuffled"]
    assert p["upstream"] == ["sft_1337", "sft_2", "sft_3"]
    assert rm["gap"]["called"] and rm["gap"]["ci_high"] < 0 and rm["gap"]["collapse"] == 0.5
    assert not checker["gap"]["called"] and checker["gap"]["value"] < 0
    assert rm["range"]["low"] == pytest.approx(-1.0) and rm["range"]["high"] == pytest.approx(-0.97)
    assert p["arms"]["rm"]["minus_control"]["value"] == pytest.approx(-1.0)
    assert "**called**" in markdown(p) and "matched" not in p["arms"]
    write_json(tmp_path / "metrics/task.json", p)  # what the families index reads
    (tmp_path / "task-collapse-upstream").symlink_to(tmp_path)
    rows = task_rows(tmp_path, [{"experiment": "task-collapse-upstream", "comparison": "rm:shuffled"}])
    assert "**called**" in rows[-1] and json.loads((tmp_path / "metrics/task.json").read_text())["upstream"]


def test_pooling_needs_two_upstream_seeds(tmp_path):
    _sub(tmp_path, 1337, -1.0, 0.0)
    with pytest.raises(SystemExit, match="need at least 2 upstream seeds"):
        pool(tmp_path)


def test_two_way_interval_counts_the_items_every_upstream_model_shares() -> None:
    rng = np.random.default_rng(0)
    upstream = rng.normal(0, 1, size=(20, 1)) + rng.normal(0, 0.01, size=(20, 113))  # models differ, items do not
    alone = two_way_interval(upstream, n_boot=500)
    assert 0.85 < alone["widening"] < 1.1 and alone["value"] == pytest.approx(upstream.mean(), abs=1e-4)
    shared = upstream + rng.normal(0, 3, size=(1, 113))  # the same hard and easy items in every model
    both = two_way_interval(shared, n_boot=500)
    assert both["widening"] > 1.3 and both["ci_high"] - both["ci_low"] > alone["ci_high"] - alone["ci_low"]
    with pytest.raises(ValueError, match="upstream >= 2, item >= 2"):
        two_way_interval(np.zeros((1, 113)))
