"""The task track: items with many right answers in clusters of uneven size (data/task.py), the checker, the text
density embedding on the real task prompts, and the frontier check (eval/task_track.py, eval/task_report.py)."""
import numpy as np
import pandas as pd
import pytest
import torch

from speedrun.data import task
from speedrun.eval.task_report import manipulation, tv
from speedrun.eval.task_compare import compare_arms
from speedrun.eval.envelope import dominated, envelope_at, pchip
from speedrun.eval.task_report import collapse_verdict
from speedrun.eval.task_track import (blind_baseline, column_mean, entropy_bits, frontier_gaps, gap_draws, item_draws,
                                      per_item, summary)
from speedrun.rl.controls import shuffle_within_groups
from speedrun.embeddings import word_embeddings
from speedrun.rl.density import group_shares, neighbour_purity, prompt_weights


@pytest.fixture(scope="module")
def items():
    return task.items(0.1, 0.25, 70)


def test_items_have_many_right_answers_in_uneven_clusters_split_by_hash(items):
    assert all(len(i.answers) >= task.MIN_ANSWERS for i in items)
    train = task.cluster_sizes(items, "train")
    assert max(train.values()) >= 10 * min(train.values())  # crowding built in
    assert all(n > 0 for n in task.cluster_sizes(items, "eval").values())  # every cluster in eval
    assert len({i.item_id for i in items}) == len(items)
    assert [i.split for i in items] == [i.split for i in task.items(0.1, 0.25, 70)]  # stable
    n13 = next(i for i in items if (i.cluster, i.lo, i.hi) == ("numbers", "12", "19"))
    assert n13.answers == ("13", "14", "15", "16", "17", "18")
    may = next(i for i in items if (i.cluster, i.lo, i.hi) == ("months", "March", "August"))
    assert may.answers == ("April", "May", "June", "July")
    assert all(int(a) % 2 == 0 for i in items if i.cluster == "evens" for a in i.answers)


def test_a_wider_number_range_adds_items_and_keeps_the_old_ones(items):
    wide = task.items(0.1, 0.25, 215)
    numbers = [i for i in wide if i.cluster == "numbers"]
    assert len(numbers) == 6 * 215 - 33 and len([i for i in items if i.cluster == "numbers"]) == 6 * 70 - 33
    assert max(int(a) for i in numbers for a in i.answers) == 214
    old = {i.item_id: i for i in items}
    kept = [i for i in wide if i.item_id in old]
    assert kept == list(old.values())  # every item keeps its id, answers and split: the range only adds
    assert sum(i.split == "eval" for i in wide) > 2 * sum(i.split == "eval" for i in items)


def test_a_split_without_a_cluster_is_refused():
    with pytest.raises(ValueError, match="no eval item"):
        task.items(0.1, 0.001, 70)


def test_checker_reads_the_first_backticked_value(items):
    item = next(i for i in items if (i.cluster, i.lo, i.hi) == ("letters", "d", "j"))
    assert task.check(item, "I pick `g`.") == "g" and task.check(item, "How about `G`?") == "g"
    assert task.check(item, "`k` works, or `g`") is None  # the first value counts
    assert task.check(item, "g") is None and task.check(item, "``") is None
    assert task.phrasing("I pick `g`.") == task.phrasing("I pick `e`.") == "I pick `_`."


def test_sft_conversations_and_pairs_never_hold_an_eval_item(items):
    eval_q = {i.prompt() for i in items if i.split == "eval"} | {i.question(t) for i in items if i.split == "eval"
                                                                  for t in range(len(task.TEMPLATES[i.cluster]))}
    convs = task.conversations(items, "train", 2, 0)
    assert len(convs) == 2 * sum(i.split == "train" for i in items)
    assert not {c[0]["content"] for c in convs} & eval_q
    by_q = {i.question(t): i for i in items for t in range(len(task.TEMPLATES[i.cluster]))}
    assert all(task.check(by_q[c[0]["content"]], c[1]["content"]) for c in convs)  # every answer right
    pairs = task.pairs(items, 2, 0)
    assert {p["split"] for p in pairs} == {"train", "val"}
    for p in pairs[:200]:
        item = by_q[p["prompt"][0]["content"]]
        assert task.check(item, p["chosen"]) and not task.check(item, p["rejected"])


def test_load_items_round_trips_and_names_a_bad_row(items, tmp_path):
    path = tmp_path / "items.parquet"
    task.items_frame(items).to_parquet(path)
    assert task.load_items(path) == items
    df = task.items_frame(items)
    df.loc[3, "answers"] = ["1"]
    df.to_parquet(path)
    with pytest.raises(ValueError, match=r"items.parquet row 3 .*1 answers"):
        task.load_items(path)


def test_text_embedding_puts_clusters_together_and_passes_the_manipulation_bar(items):
    """On the real task prompt set (the train items' fixed questions): the words embedding's neighbours mostly share
    a cluster, and the committed density knobs move the cluster mix >= 0.3 TV from uniform."""
    from speedrun import params

    d = params.load().task.density
    train = [i for i in items if i.split == "train"]
    texts, groups = [i.prompt() for i in train], [i.cluster for i in train]
    emb = word_embeddings(texts)
    assert neighbour_purity(emb, groups, d.k) > 0.8
    shuffled = list(np.random.default_rng(0).permutation(groups))
    assert neighbour_purity(emb, shuffled, d.k) < 0.6  # negative control: labels that mean nothing
    w = prompt_weights(emb, d.k, d.alpha, d.max_ratio)
    uniform = group_shares(torch.full((len(texts),), 1 / len(texts), dtype=torch.float64), groups)
    shares = group_shares(w, groups)
    assert tv(shares, uniform) >= 0.3 and shares["numbers"] < uniform["numbers"]  # the crowd is drawn less


def test_shuffle_within_groups_keeps_each_groups_values():
    r = torch.tensor([1., 0., 0., 1., 1., 1., 0., 0.])
    s = shuffle_within_groups(r, 4, torch.Generator().manual_seed(0))
    assert [sorted(g) for g in s.view(2, 4).tolist()] == [sorted(g) for g in r.view(2, 4).tolist()]
    assert not torch.equal(s, r)


def answers_frame(model: str, item_answers: dict[str, list[str | None]], cluster: str = "numbers") -> pd.DataFrame:
    rows = [{"model": model, "temperature": 1.0, "item_id": i, "cluster": cluster, "sample_idx": j,
             "text": f"`{a}`" if a else "no", "answer": a}
            for i, ans in item_answers.items() for j, a in enumerate(ans)]
    return pd.DataFrame(rows)


def planted(model: str, n_items: int, p_right: float, spread: int, seed: int, letters_from: int | None = None
            ) -> pd.DataFrame:
    """8 answers per item: right with probability p_right, then one of `spread` values; items from letters_from on
    are in the letters cluster (None: all numbers)."""
    r, vals = np.random.default_rng(seed), [str(v) for v in range(6)]
    return pd.concat([answers_frame(model, {f"i{k:03d}": [vals[r.integers(spread)] if r.random() < p_right else None
                                                          for _ in range(8)]},
                                    "letters" if letters_from is not None and k >= letters_from else "numbers")
                      for k in range(n_items)], ignore_index=True)


def test_per_item_metrics_pass_coverage_and_entropy():
    df = answers_frame("m", {"a": ["1", "1", "2", None], "b": [None] * 4})
    t = per_item(df, (1, 4))
    assert t.loc["a", "pass@1"] == 0.75 and t.loc["a", "pass@4"] == 1.0 and t.loc["a", "coverage"] == 2
    assert t.loc["b", "pass@1"] == 0 and t.loc["b", "coverage"] == 0
    assert entropy_bits(["1", "2"]) == pytest.approx(1.0) and entropy_bits(["1", "1"]) == 0.0
    s = summary(df, (1,))
    assert s["all"]["coverage"] == 1.0 and s["all"]["top_phrasing_share"] == 0.625 and s["top_phrasing"] == "no"


def test_frontier_check_puts_arms_below_and_not_along_the_envelope():
    """Positive control: an arm right as often as SFT at T=1 but always with the same answer lies below the envelope.
    Negative control: an arm that is the SFT model at another temperature lies on it. Neither is called collapsed
    without a shuffled-reward arm."""
    sft = {0.5: planted("sft", 60, 0.8, 3, 1), 1.0: planted("sft", 60, 0.5, 6, 2)}
    collapsed = [planted(f"c{s}", 60, 0.5, 1, 10 + s) for s in range(3)]
    along = [planted(f"a{s}", 60, 0.5, 6, 20 + s) for s in range(3)]
    g = frontier_gaps(sft, {"collapsed": collapsed, "along": along}, 200, 0, (1, 8))
    assert g["collapsed"]["below"] and g["collapsed"]["gap"] < -1 and not g["collapsed"]["collapsed"]
    assert not g["along"]["below"] and g["along"]["ci_low"] < 0 < g["along"]["ci_high"]
    assert "No shuffled-reward arm" in collapse_verdict(g)


def test_envelope_drops_dominated_temperatures_and_bends_with_the_curve():
    """A hot temperature worse on both axes than T=1 is off the envelope: an arm below its pass@1 is read against
    T=1's coverage, not the chord down to it. Between points the curve is a monotone cubic in temperature (scipy's
    PCHIP values), which lies above the chord of a concave curve; above the top pass@1 the reading is flagged."""
    pts = np.array([[0.25, 0.50, 1.8], [0.5, 0.46, 2.8], [1.0, 0.40, 3.3], [1.5, 0.26, 2.7]])
    assert dominated(pts).tolist() == [False, False, False, True]
    value, outside = envelope_at(pts, np.array([0.30, 0.55]))
    assert value[0] == pytest.approx(3.3, abs=1e-9) and outside.tolist() == [False, True] and value[1] == 1.8
    chord = np.interp(0.43, [0.40, 0.46], [3.3, 2.8])
    assert envelope_at(pts, np.array([0.43]))[0][0] > chord
    extended, flag = envelope_at(pts, np.array([0.54]), extend=True)
    assert flag[0] and extended[0] == pytest.approx(1.8 + (1.8 - 2.8) / (0.50 - 0.46) * 0.04)
    # the coldest temperature dominated (less pass@1 and less coverage than the next): the line leans on the next two
    # envelope points, so it falls past the curve's end instead of rising along the dominated one
    cold = np.array([[0.1, 0.44, 1.0], [0.25, 0.50, 1.8], [0.5, 0.46, 2.8]])
    assert dominated(cold).tolist() == [True, False, False]
    assert envelope_at(cold, np.array([0.54]), extend=True)[0][0] == pytest.approx(1.8 - 25.0 * 0.04)
    assert envelope_at(cold[:2], np.array([0.54]), extend=True)[0][0] == pytest.approx(1.8)  # one left: flat
    from scipy.interpolate import PchipInterpolator
    x, y = np.array([0.1, 0.3, 0.7, 1.0, 1.6]), np.array([0.5, 1.9, 3.2, 3.3, 2.1])
    xs = np.linspace(0.1, 1.6, 41)
    assert np.allclose(pchip(x, y, xs), PchipInterpolator(x, y)(xs))


def test_collapse_by_the_reward_is_called_only_beyond_the_shuffled_control():
    """Planted: the shuffled control's own interval includes 0 (its seeds disagree) and an arm lies below the envelope
    by about as much as the control's mean: the difference's interval includes 0, so it is not called, though the
    control "stays on" the envelope. An arm that always gives one answer is far beyond the control: called."""
    sft = {0.5: planted("sft", 60, 0.8, 3, 1), 1.0: planted("sft", 60, 0.5, 6, 2)}
    control = [planted(f"s{s}", 60, 0.5, sp, 30 + s) for s, sp in enumerate((6, 2, 6, 2))]
    drift = [planted(f"d{s}", 60, 0.5, sp, 40 + s) for s, sp in enumerate((4, 3, 4, 3))]
    narrow = [planted(f"n{s}", 60, 0.5, 1, 50 + s) for s in range(4)]
    g = frontier_gaps(sft, {"shuffled": control, "drift": drift, "narrow": narrow}, 300, 0, (1, 8))
    assert g["shuffled"]["ci_low"] < 0 < g["shuffled"]["ci_high"]  # the control's own interval includes 0
    assert g["drift"]["below"]  # the arm's own gap excludes 0 ...
    d = g["drift"]["minus_control"]
    assert d["ci_low"] < 0 < d["ci_high"] and not g["drift"]["collapsed"]  # ... but not its difference: no call
    assert g["narrow"]["collapsed"] and g["narrow"]["minus_control"]["ci_high"] < 0
    called = collapse_verdict(g).split("**Collapsed by the reward**")[1]
    assert "narrow" in called and "drift" not in called


def test_blind_baseline_tells_a_model_that_reads_the_bounds_from_one_that_does_not(items):
    """Planted answers on real items: a model that answers inside each item's own bounds reads its prompt; one that
    gives the cluster's usual values whatever the bounds scores about its blind baseline and does not."""
    held = [i for i in items if i.cluster in ("numbers", "months")]
    rng = np.random.default_rng(0)
    reads, blind = [], []
    for i in held:
        for j in range(8):
            reads.append({"item_id": i.item_id, "cluster": i.cluster, "text": f"`{i.answers[j % len(i.answers)]}`"})
            usual = ("January", "June") if i.cluster == "months" else ("12", "30")
            blind.append({"item_id": i.item_id, "cluster": i.cluster, "text": f"`{usual[int(rng.integers(2))]}`"})
    r, b = blind_baseline(pd.DataFrame(reads), held), blind_baseline(pd.DataFrame(blind), held)
    assert r["numbers"]["pass@1"] == 1.0 and r["numbers"]["reads_prompt"] and r["months"]["reads_prompt"]
    assert r["numbers"]["blind"] < 0.2
    assert not b["numbers"]["reads_prompt"] and not b["months"]["reads_prompt"]
    assert abs(b["numbers"]["pass@1"] - b["numbers"]["blind"]) < 0.05


def test_gap_draws_read_each_draw_as_the_tables_column_means():
    """The bootstrap reads columns out of pandas once: each draw's gap is still coverage minus the envelope at pass@1,
    from the per-item tables' means over that draw's rows."""
    sft = {t: per_item(planted("sft", 30, p, k, s), (1,)) for t, p, k, s in ((0.5, 0.8, 3, 1), (1.0, 0.5, 6, 2))}
    runs = [per_item(planted(f"r{s}", 30, 0.6, 2, 5 + s), (1,)) for s in range(2)]
    draws = item_draws(30, 5, 0, "test")
    got = gap_draws(sft, runs, draws)
    for d, rows in enumerate(draws):
        front = np.array([(t, column_mean(x, rows, "pass@1"), column_mean(x, rows, "coverage"))
                          for t, x in sft.items()])
        want = [column_mean(t, rows, "coverage") - envelope_at(front, column_mean(t, rows, "pass@1"))[0][0]
                for t in runs]
        assert got[d] == pytest.approx(want, abs=1e-12)


def test_manipulation_check_needs_moved_weights_and_draws_beyond_seed_spread():
    def run(w: dict, d: dict) -> dict:
        return {"cluster_share_weights": w, "cluster_share_draws": d, "text_neighbour_purity": 0.9}

    u = {"numbers": 0.7, "months": 0.3}
    dens = {"numbers": 0.3, "months": 0.7}
    variants = {"checker": {"sampling": "uniform", "reward": "checker"},
                "density": {"sampling": "density", "reward": "checker"}}
    ok = manipulation({"checker": [run(u, u), run(u, {"numbers": 0.68, "months": 0.32})],
                       "density": [run(dens, dens), run(dens, {"numbers": 0.32, "months": 0.68})]}, variants)
    assert ok["density"]["passed"] and ok["density"]["weights_tv"] == pytest.approx(0.4)
    weak = manipulation({"checker": [run(u, u), run(u, u)],
                         "density": [run(u, {"numbers": 0.6, "months": 0.4}), run(u, u)]}, variants)
    assert not weak["density"]["passed"]


def test_the_rm_arm_refuses_a_reward_model_that_never_saw_the_task(tmp_path):
    from speedrun.model import GPT, GPTConfig
    from speedrun.reward.preference import RewardModel
    from speedrun.train.checkpoint import save_model
    from stages.task_grpo import load_task_rm

    rm = RewardModel.from_gpt(GPT(GPTConfig(vocab_size=64, depth=1, n_embd=32, head_dim=16, seq_len=32)))
    with torch.no_grad():
        rm.head.weight.fill_(0.1)  # a trained head: not the constant-reward refusal
    for kinds in (["sft_sample"], ["sft_sample", "task"]):
        save_model(tmp_path / "_".join(kinds), rm.state_dict(), rm.config, {"tokenizer": "t", "reward_mean": 0.0,
                                                                   "reward_std": 1.0, "max_len": 32,
                                                                   "train_kinds": kinds})
    with pytest.raises(SystemExit, match="not on the task pairs: add task to task.rm.train_kinds"):
        load_task_rm(tmp_path / "sft_sample", "cpu")
    assert load_task_rm(tmp_path / "sft_sample_task", "cpu").max_len == 32


def test_arm_comparison_calls_a_coverage_difference_and_not_a_null():
    """Positive control: an arm that keeps every right answer beats one that always gives the same one, at the same
    pass@1 (Δ gap > 0, called, pass@1 non-inferior). Negative control: two arms drawn alike are not called."""
    def draw(p_right: float, spread: int, seed: int) -> pd.DataFrame:
        return planted(f"m{seed}", 60, p_right, spread, seed, letters_from=40)

    sft = {0.5: draw(0.8, 3, 1), 1.0: draw(0.5, 6, 2)}
    arms = {"spread": [draw(0.6, 6, 10 + s) for s in range(4)], "same": [draw(0.6, 1, 20 + s) for s in range(4)],
            "alike": [draw(0.6, 1, 30 + s) for s in range(4)]}
    out = compare_arms(sft, arms, ["spread:same", "alike:same"], 200, 0, (1, 8), margin_share=0.5, mde_share=0.3)
    pos, neg = out["spread:same"], out["alike:same"]
    assert pos["gap"]["value"] > 1 and pos["gap"]["called"] and pos["gap"]["ci_low"] > 0
    assert not neg["gap"]["called"] and neg["gap"]["ci_low"] < 0 < neg["gap"]["ci_high"]
    assert set(pos["clusters"]) == {"letters", "numbers"} and pos["clusters"]["letters"]["value"] > 0
    assert pos["gap"]["collapse"] > 0 and pos["gap"]["mde"] > 0 and pos["gap"]["seeds_needed"] is not None
    assert pos["pass@1"]["gain"] == pytest.approx(0.6 - 0.5, abs=0.1) and pos["pass@1"]["verdict"] == "non-inferior"
    assert pos["same_temperature"]["value"] > 1 and "matched" not in pos  # no run curves: no equal-pass@1 reading
    assert pos["range"]["readings"].keys() == {"gap", "same_temperature"}
    assert pos["range"]["low"] == min(pos["gap"]["value"], pos["same_temperature"]["value"])


def test_matched_reading_compares_arms_at_equal_pass1_on_their_own_curves():
    """Each run sampled at three temperatures. Negative control: an arm that is the control's model run cooler (its
    curve is the control's, shifted) keeps as many right answers at equal pass@1: not called, though it sits at a
    higher pass@1. Positive control: an arm that always gives one right answer at every temperature: called."""
    def draw(p_right: float, spread: int, seed: int) -> pd.DataFrame:
        return planted(f"m{seed}", 80, p_right, spread, seed)

    curve = [(0.8, 3), (0.7, 4), (0.6, 6), (0.5, 6)]  # (pass@1, distinct right answers) from cool to hot
    ts = (0.75, 1.0, 1.25)

    def runs(offset: int, base: int, narrow: bool = False) -> list[dict]:
        return [{t: draw(curve[offset + j][0], 1 if narrow else curve[offset + j][1], base + 10 * s + j)
                 for j, t in enumerate(ts)} for s in range(5)]

    curves = {"uniform": runs(1, 100), "cooler": runs(0, 200), "narrow": runs(1, 300, narrow=True)}
    arms = {a: [c[1.0] for c in cs] for a, cs in curves.items()}
    sft = {0.5: draw(0.8, 3, 1), 1.0: draw(0.6, 6, 2)}
    out = compare_arms(sft, arms, ["cooler:uniform", "narrow:uniform"], 200, 0, (1, 8), 0.5, 0.3, curves, 1.0,
                       "matched")
    neg, pos = out["cooler:uniform"], out["narrow:uniform"]
    assert neg["primary"] == "matched" and "p_holm" not in neg["gap"]
    assert neg["pass@1"]["value"] > 0.05  # the arms differ in pass@1 at the GRPO temperature ...
    assert not neg["matched"]["called"] and neg["matched"]["ci_low"] < 0 < neg["matched"]["ci_high"]  # ... not here
    assert pos["matched"]["called"] and pos["matched"]["value"] < -1.5 and pos["matched"]["extended_share"] < 0.5
    # read at the treatment's pass@1 instead: the cooler arm's own (higher) pass@1, where the control must be cooled
    at_a = compare_arms(sft, arms, ["cooler:uniform", "narrow:uniform"], 200, 0, (1, 8), 0.5, 0.3, curves, 1.0,
                        "matched", matched_at="treatment")
    assert at_a["cooler:uniform"]["matched"]["at"] == "treatment" and neg["matched"]["at"] == "control"
    assert not at_a["cooler:uniform"]["matched"]["called"] and at_a["narrow:uniform"]["matched"]["called"]
    assert at_a["cooler:uniform"]["matched"]["value"] != neg["matched"]["value"]  # another reading point
    assert at_a["cooler:uniform"]["pass@1"] == neg["pass@1"]  # the margin is still the control's gain
    assert neg["matched_other"]["at"] == "treatment" and neg["matched_other"]["value"] == at_a["cooler:uniform"][
        "matched"]["value"]  # both reading points are in every result, one of them the primary
    assert set(neg["range"]["readings"]) == {"gap", "same_temperature", "matched", "matched_other"}
    with pytest.raises(ValueError, match="run_temperatures"):
        compare_arms(sft, arms, ["narrow:uniform"], 20, 0, (1, 8), 0.5, 0.3, primary="matched")


def test_gsm8k_items_from_a_hub_mirror_are_checked_and_held_out_by_split(tmp_path):
    """task.source gsm8k: the hub's test split is the eval split, its train split train / val by hash; a reference
    solution loses its calculator notes and ends in its answer in backticks, which the checker reads (commas and $
    as GSM8K writes them); bad rows are counted by reason; pairs and SFT conversations hold no eval item."""
    import json

    import mirrors
    from conftest import run_module, sets
    written = mirrors.write_gsm8k(tmp_path / "gsm8k")
    out = tmp_path / "task"
    run_module("stages.task_data", *sets("task.source=gsm8k", f"task.hf_path={tmp_path / 'gsm8k'}",
                                         "task.hf_clusters=3", "task.val_frac=0.2"),
               "--items", str(out / "items.parquet"), "--pairs", str(out / "pairs.parquet"),
               "--stats", str(out / "stats.json"))
    stats = json.loads((out / "stats.json").read_text())
    assert stats["source"] == "gsm8k" and stats["skipped"] == {
        "duplicate_question": 1, "empty_question": 1, "final_answer_not_a_number": 1, "missing_question_or_answer": 1,
        "no_final_answer": 1}
    items = task.load_items(out / "items.parquet")
    good = {r["question"]: want for split in ("main/train", "main/test") for r, want in written[split]
            if isinstance(r["question"], str) and want.replace(".", "").isdigit()}
    assert len(items) == len(good) == 26 and {i.text: i.answers[0] for i in items} == good
    assert {i.split for i in items if "(test)" in i.text} == {"eval"}
    assert {i.split for i in items if "(train)" in i.text} == {"train", "val"}
    assert len({i.cluster for i in items}) == 3 and all(i.prompt() == i.text for i in items)
    eggs = next(i for i in items if "eggs" in i.text and i.split == "eval")
    assert eggs.solution == "1,000*7=7000 eggs.\nThe answer is `7000`." and eggs.answers == ("7000",)
    assert task.check(eggs, "Seven thousand: `7,000`.") == "7000" and task.check(eggs, "`$7000`") == "7000"
    assert task.check(eggs, "`7001`") is None and task.check(eggs, "7000") is None
    pairs = pd.read_parquet(out / "pairs.parquet")
    eval_ids = {i.item_id for i in items if i.split == "eval"}
    assert not set(pairs["prompt_id"]) & eval_ids and len(pairs) == 4 * sum(i.split != "eval" for i in items)
    assert all(task.check(next(i for i in items if i.item_id == r["prompt_id"]), r["rejected"]) is None
               and r["chosen"] != r["rejected"] for r in pairs.to_dict("records"))
    convs = task.conversations(items, "train", 8, 0)
    assert len(convs) == sum(i.split == "train" for i in items)  # one per item: its question and solution
    assert all(c[1]["content"].endswith("`.") and "<<" not in c[1]["content"] for c in convs)


def test_the_committed_task_report_is_its_metrics_rendered():
    """reports/task.md recomputes from reports/metrics/task.json, and shows what a referee reads first: the envelope
    (dominated temperatures marked), collapse called only against the shuffled arm, each arm's own curve, the
    prompt-blind baseline, every reading of each comparison with its range, and the manipulation check."""
    import json
    from pathlib import Path

    from speedrun.eval.task_report import report
    root = Path(__file__).resolve().parents[1]
    r = json.loads((root / "reports/metrics/task.json").read_text())
    text = report(r)
    assert text == (root / "reports/task.md").read_text()
    for part in ("(off the envelope)", "| collapsed by the reward |", "## Each arm's own curve",
                 "## Does the model read its prompt?", "| range |", "## Manipulation check"):
        assert part in text, part
    assert set(r["blind"]["trained"]) == set(r["clusters"])
