"""evaluate() on synthetic samples with a known answer; report.md and figures written byte-identically."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from speedrun.common import stable_seed
from speedrun.eval import diversity as dv
from speedrun.eval.compare import FAIL, PASS, UNSURE, evaluate
from speedrun.eval.flat import flat_metrics
from speedrun.eval.report import write_report

VOCAB = [f"w{i}" for i in range(2000)]
SMALL = ["the", "value", "is", "a", "function", "returns", "of", "and"]
ZIPF = np.array([1 / (k + 1) for k in range(len(SMALL))]) / sum(1 / (k + 1) for k in range(len(SMALL)))
N_BOOT = 200


def _text(kind: str, rng: np.random.Generator) -> str:
    if kind == "diverse":
        return " ".join(rng.choice(VOCAB, 30)) + "."
    # collapsed: a few words with Zipf frequencies and the same stock phrase, same 30-word length
    return " ".join(rng.choice(SMALL, 24, p=ZIPF)) + " \u2014 not just fast but also simple."


def make_samples(kinds: dict[str, tuple[str, float]], n_prompts: int = 10, seeds=(0, 1), k: int = 4) -> pd.DataFrame:
    rows = []
    for model, (kind, reward) in kinds.items():
        rng = np.random.default_rng(stable_seed("test_report", model))
        for p in range(n_prompts):
            for s in seeds:
                for j in range(k):
                    rows.append(dict(model=model, prompt_id=f"p{p:02d}", seed=s, sample_idx=j, text=_text(kind, rng),
                                     reward=float(reward + 0.1 * rng.standard_normal()),
                                     prompt=f"What does `f{p}` do?"))
    return pd.DataFrame(rows)


RUNS = {"density": ["grpo_density_s1", "grpo_density_s2", "grpo_density_s3"],
        "baseline": ["grpo_baseline_s1", "grpo_baseline_s2", "grpo_baseline_s3"]}
PRIMARY = ["ead_1", "distinct_2", "self_bleu"]


@pytest.fixture(scope="module")
def samples() -> pd.DataFrame:
    kinds = {"sft": ("diverse", 0.0)}
    kinds |= {r: ("diverse", 0.5 + 0.02 * i) for i, r in enumerate(RUNS["density"])}
    kinds |= {r: ("collapsed", 1.0 + 0.02 * i) for i, r in enumerate(RUNS["baseline"])}
    df = make_samples(kinds, n_prompts=8)
    return df.assign(ref_logprob=-2.0 - 0.1 * df["model"].str.contains("baseline"),
                     prompt_gain=0.02 + 0.01 * df["model"].str.contains("density"))


@pytest.fixture(scope="module")
def result(samples) -> dict:
    return evaluate(samples, RUNS, primary=PRIMARY, n_boot=N_BOOT)


DIVERSITY = ["distinct_1", "distinct_2", "distinct_3", "ead_1", "ead_2", "ead_3", "word_gini",
             "self_bleu", "within_distinct_1", "within_distinct_2", "within_distinct_3", "within_self_bleu",
             "em_dash_rate", "not_just_but"]


def test_verdicts_follow_good_direction(samples, result):
    assert result["models"] == ["sft"] + RUNS["density"] + RUNS["baseline"]
    c = result["comparisons"][0]
    assert (c["a"], c["b"], c["seed_variance"]) == ("density", "baseline", True)
    for name in DIVERSITY:  # density is the diverse one: better on every diversity metric, whatever its sign
        assert c["delta"][name]["verdict"] == PASS, (name, c["delta"][name])
        assert c["delta"][name]["role"] == ("primary" if name in PRIMARY else "secondary")
    for name in PRIMARY:
        assert c["delta"][name]["p_holm"] <= 0.05 and c["delta"][name]["p_holm"] >= c["delta"][name]["p"]
        # the robustness check: runs fully separated -> the smallest p a permutation of these runs can give
        assert c["delta"][name]["p_perm"] == pytest.approx(c["delta"][name]["p_perm_min"])
    assert c["delta"]["reward"]["verdict"] == FAIL and c["noninferiority"]["verdict"] == "inferior"  # lost 0.5
    assert c["delta"]["ref_loglik"]["value"] == pytest.approx(0.1) and c["delta"]["ref_loglik"]["verdict"] == PASS
    for name in ("len_words", "len_chars", "len_sentences"):
        assert c["delta"][name]["verdict"] is None and c["delta"][name]["role"] == "control"
    for name, d in c["delta"].items():
        assert d["ci_low"] <= d["value"] <= d["ci_high"], name
        mean = lambda v: np.mean([result["values"][r][name] for r in RUNS[v]])  # noqa: E731
        assert d["value"] == pytest.approx(mean("density") - mean("baseline"))
    # the same data with the pair swapped: every verdict flips
    swapped = evaluate(samples, RUNS, [("baseline", "density")], primary=PRIMARY, n_boot=N_BOOT)["comparisons"][0]
    for name in DIVERSITY:
        assert swapped["delta"][name]["verdict"] == FAIL, name
    assert swapped["delta"]["reward"]["verdict"] == PASS and swapped["noninferiority"]["verdict"] == "non-inferior"


def test_permutation_column_says_how_its_p_was_computed(result):
    from speedrun.eval.report import _comparison_table
    c = result["comparisons"][0]
    assert "| permutation p (smallest possible 0.1) |" in _comparison_table(result, c)[0]
    sampled = {**c, "delta": {n: ({**d, "p_perm": 2e-5, "p_perm_min": 1e-5, "p_perm_method": "monte carlo"}
                                  if d.get("p_perm_min") is not None else d) for n, d in c["delta"].items()}}
    lines = _comparison_table(result, sampled)
    assert "| permutation p (Monte Carlo; smallest possible 1e-05) |" in lines[0] and "| 2e-05 |" in lines[2]


def test_a_a_comparison_gives_no_verdict_either_way(samples):
    """The same runs under both names: Δ is 0, its interval straddles 0 (the runs' spread counts twice), p is 1:
    never ✅ or ❌."""
    res = evaluate(samples, {"a": RUNS["density"], "b": RUNS["density"]}, primary=PRIMARY, n_boot=50)
    c = res["comparisons"][0]
    for name, d in c["delta"].items():
        assert d["value"] == 0.0 and d["ci_low"] <= 0.0 <= d["ci_high"] and d["p"] == 1.0, name
        assert d["p_perm"] == 1.0, name
        assert d["verdict"] in (None, UNSURE), name
    assert c["noninferiority"]["verdict"] == "non-inferior"


def test_one_run_per_variant_gives_no_verdict(samples):
    res = evaluate(samples, {"density": RUNS["density"][:1], "baseline": RUNS["baseline"][:1]}, primary=PRIMARY,
                   n_boot=50)
    c = res["comparisons"][0]
    assert not c["seed_variance"] and c["noninferiority"]["verdict"] is None
    assert all(d["verdict"] is None for d in c["delta"].values())
    from speedrun.eval.report import verdict_line
    assert verdict_line(res, c).startswith("**No verdict**")
    # against the fixed reference: the variant (one run) has no verdict either, the run its prompt-level one
    assert res["vs_reference"]["baseline"]["reward"]["verdict"] is None
    assert res["runs_vs_reference"]["grpo_baseline_s1"]["reward"]["verdict"] == PASS


def test_values_are_the_metrics_of_the_whole_pool(samples, result):
    v_ead = result["setup"]["ead_vocab_size"]
    for model, df in samples.groupby("model"):
        texts, got = df["text"].tolist(), result["values"][model]
        assert got["em_dash_rate"] == pytest.approx(dv.em_dash_rate(texts))
        assert got["word_gini"] == pytest.approx(dv.word_gini(texts))
        assert got["word_entropy"] == pytest.approx(dv.word_entropy(texts))
        toks = [dv.words(t) for t in texts]
        assert got["rep_4"] == pytest.approx(100 * np.mean([dv.rep_n(t, 4) for t in toks]))
        assert got["top_opening"] == pytest.approx(100 * dv.top_opening_share(toks))
        assert got["shared_4grams"] == pytest.approx(100 * dv.shared_ngram_share(toks, df["prompt_id"].tolist()))
        for n in (1, 2, 3):
            assert got[f"distinct_{n}"] == pytest.approx(dv.distinct_n(texts, n))
            assert got[f"ead_{n}"] == pytest.approx(dv.ead_n(texts, n, v_ead[n - 1]))
        assert got["not_just_but"] == pytest.approx(100 * dv.not_just_but_count(texts) / len(texts))
        assert got["reward"] == pytest.approx(df["reward"].mean())
        assert got["ref_loglik"] == pytest.approx(df["ref_logprob"].mean())
        assert got["prompt_gain"] == pytest.approx(df["prompt_gain"].mean())
        assert got["len_words"] == pytest.approx(np.mean([len(dv.words(t)) for t in texts]))
        cells = [g["text"].tolist() for _, g in df.groupby(["prompt_id", "seed"])]
        assert got["within_self_bleu"] == pytest.approx(np.mean([dv.self_bleu(c) for c in cells]))
        assert got["within_distinct_2"] == pytest.approx(np.mean([dv.distinct_n(c, 2) for c in cells]))
    # self-BLEU's pool: at most half of the 64 responses, and no more than the fewest distinct ones of any draw
    assert 2 <= result["setup"]["self_bleu_k"] <= 32


def test_length_matched_metrics_read_only_the_first_words(samples):
    vocab = [5000, 20000, 40000]
    res = evaluate(samples, RUNS, primary=PRIMARY, n_boot=20, ead_vocab_size=vocab, match_words=5)
    for model, df in samples.groupby("model"):
        first = [" ".join(dv.words(t)[:5]) for t in df["text"]]
        got = res["values"][model]
        assert got["distinct_2_first"] == pytest.approx(dv.distinct_n(first, 2))
        assert got["ead_1_first"] == pytest.approx(dv.ead_n(first, 1, vocab[0]))
        assert got["short_share"] == pytest.approx(100 * np.mean([len(dv.words(t)) < 5 for t in df["text"]]))
    # longer answers with the same opening: the full-length metrics move, the length-matched ones do not
    padded = samples.copy()
    longer = padded["model"] == "grpo_density_s1"
    padded.loc[longer, "text"] = padded.loc[longer, "text"] + " and then some further words about it"
    res_padded = evaluate(padded, RUNS, primary=PRIMARY, n_boot=20, ead_vocab_size=vocab, match_words=5)
    before, after = res["values"]["grpo_density_s1"], res_padded["values"]["grpo_density_s1"]
    for name in ("ead_1_first", "distinct_2_first", "self_bleu_first"):
        assert after[name] == pytest.approx(before[name]), name
    assert after["ead_1"] != pytest.approx(before["ead_1"]) and after["len_words"] > before["len_words"]
    # half of one run's answers cut to three words: a share of its responses fall short of the window
    short = samples.copy()
    cut = (short["model"] == "grpo_density_s1") & (short["sample_idx"] % 2 == 0)
    short.loc[cut, "text"] = short.loc[cut, "text"].map(lambda t: " ".join(t.split()[:3]))
    got = evaluate(short, RUNS, primary=PRIMARY, n_boot=5, ead_vocab_size=vocab, match_words=5)["values"]
    assert before["short_share"] == 0 and got["grpo_density_s1"]["short_share"] == pytest.approx(50.0)
    off = evaluate(samples, RUNS, primary=PRIMARY, n_boot=5)["metrics"]  # 0 = off
    assert "ead_1_first" not in off and "short_share" not in off


def test_stock_phrases_are_found_on_one_half_of_the_reference_and_counted_on_the_other():
    from speedrun.common import stable_hash
    kinds = {m: ("diverse", 0.5) for m in ["sft"] + RUNS["density"] + RUNS["baseline"]}
    df = make_samples(kinds, n_prompts=12)
    rng = np.random.default_rng(0)
    rate = {"sft": 0.3, **{r: 0.0 for r in RUNS["density"]}, **{r: 0.9 for r in RUNS["baseline"]}}
    tic = df["model"].map(rate).to_numpy() > rng.random(len(df))
    df.loc[tic, "text"] = df.loc[tic, "text"] + " Done in the usual way."
    res = evaluate(df, RUNS, primary=PRIMARY, n_boot=50)
    assert {"in the usual", "the usual way", "done in the"} & set(res["setup"]["stock_phrases"])
    counted = df["prompt_id"].map(lambda p: int(stable_hash("phrase_half", p), 16) % 2 == 1)
    for model, g in df[counted].groupby("model"):  # only the half the phrases were not found on
        want = 100 * g["text"].str.contains("the usual way").mean()
        assert res["values"][model]["stock_phrases"] == pytest.approx(want), model
    assert res["comparisons"][0]["delta"]["stock_phrases"]["verdict"] == PASS  # density says it less: better


def test_arms_are_analysed_paired_only_where_enough_matched_runs_correlate():
    runs = {v: [f"grpo_{v}_s{i}" for i in range(1, 7)] for v in ("density", "baseline")}
    shared = [0.0, 2.0, -1.0, 3.0, 1.0, -2.0]  # training seed i's effect, in both arms
    kinds = {"sft": ("diverse", 0.0)} | {r: ("diverse", 0.3 + e) for r, e in zip(runs["density"], shared)}
    kinds |= {r: ("diverse", e) for r, e in zip(runs["baseline"], shared)}
    df = make_samples(kinds, n_prompts=6)
    six = evaluate(df, runs, primary=PRIMARY, n_boot=50)["comparisons"][0]["delta"]["reward"]
    assert six["pair_r"] > 0.99 and six["paired"] and six["ci_low"] > 0  # the shared effect cancels
    three = {v: r[:3] for v, r in runs.items()}
    d = evaluate(df, three, primary=PRIMARY, n_boot=50)["comparisons"][0]["delta"]["reward"]
    assert d["pair_r"] > 0.99 and not d["paired"] and d["ci_low"] < 0  # too few pairs to rely on the coupling


def test_self_bleu_pool_fits_every_draw():
    """Few prompts, two sampling seeds: some draws hold far fewer distinct responses than half the pool; K is
    capped so that every draw scores exactly K (self-BLEU grows with the number of references)."""
    df = make_samples({"a": ("diverse", 0.0), "b": ("diverse", 0.0)}, n_prompts=3, seeds=(0, 1), k=4)
    res = evaluate(df, {"a": ["a"], "b": ["b"]}, reference=None, n_boot=200)
    assert res["setup"]["self_bleu_k"] < 12  # 24 responses: 12 would be half


def test_deterministic_order_free_and_flat_metrics_numeric(samples, result):
    shuffled = samples.sample(frac=1.0, random_state=3).reset_index(drop=True)
    again = evaluate(shuffled, RUNS, primary=PRIMARY, n_boot=N_BOOT)
    assert json.dumps(again, sort_keys=True) == json.dumps(result, sort_keys=True)
    flat = flat_metrics(result)
    assert set(flat) == {"sft", *RUNS["density"], *RUNS["baseline"], "density_vs_baseline", "density_vs_sft",
                         "baseline_vs_sft"}
    vs = result["vs_reference"]["density"]["reward"]  # each variant against SFT, interval with its runs' spread
    mean = np.mean([result["values"][r]["reward"] for r in RUNS["density"]])
    assert vs["value"] == pytest.approx(mean - result["values"]["sft"]["reward"])
    assert vs["ci_low"] <= vs["value"] <= vs["ci_high"] and flat["density_vs_sft"]["reward"] == vs["value"]
    assert result["runs_vs_reference"]["grpo_density_s2"]["reward"]["verdict"] == PASS

    def numbers(d):
        for v in d.values():
            if isinstance(v, dict):
                yield from numbers(v)
            else:
                yield v
    for value in numbers(flat):
        assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    c = flat["density_vs_baseline"]
    assert c["verdict"]["distinct_2"] == 1 and c["verdict"]["reward"] == -1 and c["reward_noninferior"] == 0
    assert "len_words" not in c["verdict"] and c["delta"]["ead_1"] > 0


def test_bad_input_names_the_row(samples):
    bad = samples.copy()
    bad.loc[5, "reward"] = float("nan")
    with pytest.raises(ValueError, match="row"):
        evaluate(bad, RUNS, n_boot=10)
    bad = samples.copy()
    bad.loc[7, "text"] = None
    with pytest.raises(ValueError, match="row"):
        evaluate(bad, RUNS, n_boot=10)
    with pytest.raises(ValueError, match="missing columns"):
        evaluate(samples.drop(columns=["seed"]), RUNS, n_boot=10)
    with pytest.raises(ValueError, match="duplicate"):
        evaluate(pd.concat([samples, samples.iloc[:1]], ignore_index=True), RUNS, n_boot=10)
    with pytest.raises(ValueError, match="paired"):
        evaluate(samples.drop(index=samples.index[samples["model"] == "sft"][:1]), RUNS, n_boot=10)
    one = samples[(samples["sample_idx"] == 0) | (samples["prompt_id"] != "p03")]
    with pytest.raises(ValueError, match="at least 2 samples"):
        evaluate(one, RUNS, n_boot=10)
    with pytest.raises(ValueError, match="not found"):
        evaluate(samples[samples["model"] != "grpo_density_s2"], RUNS, n_boot=10)
    with pytest.raises(ValueError, match="not in"):
        evaluate(samples, RUNS, [("density", "other")], n_boot=10)
    with pytest.raises(ValueError, match="primary"):
        evaluate(samples, RUNS, primary=["len_words"], n_boot=10)


def _write(result, samples, root):
    logs = {r: pd.DataFrame({"step": np.arange(30), "reward_mean": np.linspace(0, 1 + i, 30) ** 0.5,
                             "kl": np.linspace(0, 0.1, 30)}) for i, r in enumerate(RUNS["density"] + RUNS["baseline"])}
    weights = {"baseline": {f"mod{i}": float(i + 1) for i in range(25)},
               "density": {f"mod{i}": float(np.sqrt(i + 1)) for i in range(25)}}
    setup = {"models": {"sft": "outs/sft/model.pt"}, "sampler": "temperature 1.0, top-k 50", "max_new_tokens": 64}
    return write_report(result, samples, logs, weights, root / "reports" / "report.md", root / "reports" / "figures",
                        setup, extra_sections=["## Adversarial track\n\nappended later"])


def test_report_and_figures_byte_identical(samples, result, tmp_path):
    md = _write(result, samples, tmp_path / "a")
    md2 = _write(json.loads(json.dumps(result)), samples, tmp_path / "b")  # also after a JSON round trip
    assert md == md2 == (tmp_path / "a" / "reports" / "report.md").read_text(encoding="utf-8")
    figures = ["metrics.png", "forest_density_vs_baseline.png", "scatter.png", "reward_curves.png",
               "sampling_weights.png"]
    for name in figures:
        assert f"](figures/{name})" in md  # relative to report.md
        a = (tmp_path / "a" / "reports" / "figures" / name).read_bytes()
        assert a[:8] == b"\x89PNG\r\n\x1a\n" and b"Software" not in a
        assert a == (tmp_path / "b" / "reports" / "figures" / name).read_bytes(), name
    assert PASS in md and FAIL in md and "reward inferior at margin 0.2" in md
    # the margin: what density may give up of baseline's reward gain over sft (keep 80% of it)
    ni, values = result["comparisons"][0]["noninferiority"], result["values"]
    gain = np.mean([values[r]["reward"] for r in RUNS["baseline"]]) - values["sft"]["reward"]
    assert ni["gain_b"] == pytest.approx(gain) and ni["margin"] == pytest.approx(0.2 * gain) and gain > 0.9
    assert md.startswith("# Diversity evaluation") and "**density vs baseline** (3 vs 3 GRPO training seeds): more " \
        "diverse on EAD-1, distinct-2, self-BLEU-4" in md
    assert "| grpo_baseline_s2 | baseline |" in md and "Holm" in md
    assert "Δ prompt gain on reference answers (nats/token) − sft" in md  # did GRPO change how much it reads?
    assert md.rstrip().endswith("appended later")
    assert "What does `f" in md  # sample responses side by side, with the prompt text


def test_report_without_logs_or_weights(samples, result, tmp_path):
    small = {**result, "metrics": ["distinct_2", "reward"], "primary": ["distinct_2"]}  # few panels: fast
    md = write_report(small, samples, {}, {}, tmp_path / "report.md", tmp_path / "fig", {"models": "x"})
    assert "no GRPO logs given" in md and "no sampling weights given" in md
    assert sorted(p.name for p in (tmp_path / "fig").iterdir()) == ["forest_density_vs_baseline.png", "metrics.png",
                                                                    "scatter.png"]
    with pytest.raises(ValueError, match="reward_mean"):
        write_report(small, samples, {"grpo_density_s1": pd.DataFrame({"step": [0]})}, {}, tmp_path / "r.md",
                     tmp_path / "fig", {})


@pytest.mark.parametrize("acc,std,flag", [(0.5, 0.0, "constant"), (0.53, 0.4, "near chance"), (0.9, 1.0, None)])
def test_rm_summary_flags_a_constant_or_chance_reward_model(tmp_path, acc, std, flag):
    from stages.eval_diversity import rm_summary
    (tmp_path / "meta.json").write_text(json.dumps(
        {"reward_mean": 0.0, "reward_std": std, "val": {"val_acc": acc, "baseline_acc": 0.8}}))
    line = rm_summary(tmp_path)
    assert f"{acc:.3f}" in line
    for word in ("constant", "near chance"):
        assert (word in line) == (word == flag)


def test_rm_summary_lists_the_accuracy_of_every_kind(tmp_path):
    from stages.eval_diversity import rm_summary
    kinds = {"all": {"acc": 0.7, "baseline_acc": 0.8, "pairs": 30}, "hard": {"acc": 0.5, "baseline_acc": 0.7,
                                                                            "pairs": 10},
             "sft_sample": {"acc": 0.8, "baseline_acc": 0.85, "pairs": 20}}
    (tmp_path / "meta.json").write_text(json.dumps(
        {"reward_mean": 0.0, "reward_std": 1.0, "val": {"val_acc": 0.7, "baseline_acc": 0.8, "by_kind": kinds}}))
    line = rm_summary(tmp_path)
    assert "hard 0.500 (baseline 0.700, 10 pairs)" in line and "sft_sample 0.800 (baseline 0.850, 20 pairs)" in line


def test_any_number_of_variants_and_comparisons(samples, tmp_path):
    """Variants are data: a third variant is evaluated, compared as params name it, and reported."""
    third = samples[samples["model"].isin(RUNS["density"])].assign(
        model=lambda d: d["model"].str.replace("density", "other"))
    runs = RUNS | {"other": [r.replace("density", "other") for r in RUNS["density"]]}
    res = evaluate(pd.concat([samples, third], ignore_index=True), runs,
                   [("density", "baseline"), ("other", "baseline")], primary=PRIMARY, n_boot=50)
    assert [(c["a"], c["b"]) for c in res["comparisons"]] == [("density", "baseline"), ("other", "baseline")]
    assert set(res["vs_reference"]) == {"density", "baseline", "other"}
    assert "other_vs_baseline" in flat_metrics(res)
    small = {**res, "metrics": ["distinct_2", "reward"], "primary": ["distinct_2"]}
    md = write_report(small, samples, {}, {}, tmp_path / "report.md", tmp_path / "fig", {})
    assert "**other vs baseline** (3 vs 3 GRPO training seeds)" in md and "## other \u2212 baseline" in md
    assert (tmp_path / "fig" / "forest_other_vs_baseline.png").is_file()


def test_forest_leaves_out_the_standardised_reward(result):
    """A % of a mean near zero means nothing: the RM reward (standardised units) stays in the table, off the forest."""
    from speedrun.eval.figures import forest_rows
    rows = forest_rows(result, result["comparisons"][0])
    labels = [r[0] for r in rows]
    assert "mean RM reward" not in labels and "EAD-1 *" in labels and "words per response" in labels


def test_heldout_wording_follows_the_split_used():
    from speedrun.eval.report import heldout_wording
    embedded = heldout_wording({"embedded"}, "embedded", 3)
    assert embedded.startswith("by top-level module") and "stable hash" not in embedded
    assert "SFT and the RM pick checkpoints on the corpus's val modules; 3 eval prompts left out" in embedded
    hub = heldout_wording({"se", "hh"}, "hf", 0)
    assert hub.startswith("hub prompts (hh, se) by a stable hash") and "module" not in hub
    assert "SFT conversations (sft.source: hf) are another dataset" in hub and "the SFT dataset's val split" in hub
