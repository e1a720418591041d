"""evaluate() on synthetic samples with a known answer; report.md and figures written byte-identically."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from speedrun.common import stable_seed
from speedrun.eval import diversity as dv
from speedrun.eval.compare import FAIL, PASS, UNSURE, evaluate, flat_metrics
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
                                     reward=float(reward + 0.1 * rng.standard_normal()), prompt=f"What does `f{p}` do?"))
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def samples() -> pd.DataFrame:
    return make_samples({"sft": ("diverse", 0.0), "grpo_density": ("diverse", 0.5), "grpo_baseline": ("collapsed", 1.0)})


@pytest.fixture(scope="module")
def result(samples) -> dict:
    return evaluate(samples, n_boot=N_BOOT)


DIVERSITY = ["distinct_1", "distinct_2", "distinct_3", "ead_1", "ead_2", "ead_3", "vocab_ratio", "word_gini",
             "self_bleu", "within_distinct_1", "within_distinct_2", "within_distinct_3", "within_self_bleu",
             "em_dash_rate", "not_just_but"]


def test_verdicts_follow_good_direction(samples, result):
    assert result["models"] == ["sft", "grpo_baseline", "grpo_density"]
    for name in DIVERSITY:  # density is the diverse one: better on every diversity metric, whatever its sign
        assert result["delta"][name]["verdict"] == PASS, (name, result["delta"][name])
    assert result["delta"]["reward"]["verdict"] == FAIL  # but it lost reward
    for name in ("len_words", "len_chars", "len_sentences"):
        assert result["delta"][name]["verdict"] is None
    for name, d in result["delta"].items():  # pooled self-BLEU's interval may sit off its delta (compare.py)
        assert name == "self_bleu" or d["ci_low"] <= d["value"] <= d["ci_high"], name
    # the same data with the pair swapped: every verdict flips
    swapped = evaluate(samples, pair=("grpo_baseline", "grpo_density"), n_boot=N_BOOT)
    for name in DIVERSITY:
        assert swapped["delta"][name]["verdict"] == FAIL, name
    assert swapped["delta"]["reward"]["verdict"] == PASS


def test_identical_models_are_inconclusive():
    df = make_samples({"grpo_density": ("diverse", 0.0)})
    df = pd.concat([df, df.assign(model="grpo_baseline")], ignore_index=True)
    res = evaluate(df, n_boot=50)
    assert res["reference"] is None and res["models"] == ["grpo_baseline", "grpo_density"]
    for name, d in res["delta"].items():
        assert d["value"] == 0.0 and d["ci_low"] == 0.0 and d["ci_high"] == 0.0
        assert d["verdict"] == (None if name.startswith("len_") else UNSURE)


def test_values_are_the_metrics_of_the_whole_pool(samples, result):
    v_ead = result["setup"]["ead_vocab_size"]
    for model, df in samples.groupby("model"):
        texts, got = df["text"].tolist(), result["values"][model]
        assert got["em_dash_rate"] == pytest.approx(dv.em_dash_rate(texts))
        assert got["word_gini"] == pytest.approx(dv.word_gini(texts))
        assert got["vocab_ratio"] == pytest.approx(dv.vocab_ratio(texts))
        for n in (1, 2, 3):
            assert got[f"distinct_{n}"] == pytest.approx(dv.distinct_n(texts, n))
            assert got[f"ead_{n}"] == pytest.approx(dv.ead_n(texts, n, v_ead[n - 1]))
        assert got["not_just_but"] == pytest.approx(100 * dv.not_just_but_count(texts) / len(texts))
        assert got["reward"] == pytest.approx(df["reward"].mean())
        assert got["len_words"] == pytest.approx(np.mean([len(dv.words(t)) for t in texts]))
        cells = [g["text"].tolist() for _, g in df.groupby(["prompt_id", "seed"])]
        assert got["within_self_bleu"] == pytest.approx(np.mean([dv.self_bleu(c) for c in cells]))
        assert got["within_distinct_2"] == pytest.approx(np.mean([dv.distinct_n(c, 2) for c in cells]))
    assert result["setup"]["self_bleu_k"] == 40  # capped at half of the 80 responses per model


def test_deterministic_order_free_and_flat_metrics_numeric(samples, result):
    shuffled = samples.sample(frac=1.0, random_state=3).reset_index(drop=True)
    again = evaluate(shuffled, n_boot=N_BOOT)
    assert json.dumps(again, sort_keys=True) == json.dumps(result, sort_keys=True)
    flat = flat_metrics(result)
    assert set(flat) == {"sft", "grpo_baseline", "grpo_density", "delta", "delta_ci_low", "delta_ci_high", "verdict",
                         "grpo_baseline_vs_sft", "grpo_density_vs_sft"}
    vs = result["vs_reference"]["grpo_density"]["reward"]  # each run against SFT, on the same paired draws
    assert vs["value"] == pytest.approx(result["values"]["grpo_density"]["reward"] - result["values"]["sft"]["reward"])
    assert vs["ci_low"] <= vs["value"] <= vs["ci_high"] and flat["grpo_density_vs_sft"]["reward"] == vs["value"]
    for group in flat.values():
        for value in group.values():
            assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    assert flat["verdict"]["distinct_2"] == 1 and flat["verdict"]["reward"] == -1
    assert "len_words" not in flat["verdict"]


def test_bad_input_names_the_row(samples):
    bad = samples.copy()
    bad.loc[5, "reward"] = float("nan")
    with pytest.raises(ValueError, match="row"):
        evaluate(bad, n_boot=10)
    bad = samples.copy()
    bad.loc[7, "text"] = None
    with pytest.raises(ValueError, match="row"):
        evaluate(bad, n_boot=10)
    with pytest.raises(ValueError, match="missing columns"):
        evaluate(samples.drop(columns=["seed"]), n_boot=10)
    with pytest.raises(ValueError, match="duplicate"):
        evaluate(pd.concat([samples, samples.iloc[:1]], ignore_index=True), n_boot=10)
    with pytest.raises(ValueError, match="paired"):
        evaluate(samples.drop(index=samples.index[samples["model"] == "sft"][:1]), n_boot=10)
    one = samples[(samples["sample_idx"] == 0) | (samples["prompt_id"] != "p03")]
    with pytest.raises(ValueError, match="at least 2 samples"):
        evaluate(one, n_boot=10)
    with pytest.raises(ValueError, match="not found"):
        evaluate(samples[samples["model"] != "grpo_density"], n_boot=10)


def _write(result, samples, root):
    logs = {v: pd.DataFrame({"step": np.arange(30), "reward_mean": np.linspace(0, 1 + i, 30) ** 0.5,
                             "kl": np.linspace(0, 0.1, 30)}) for i, v in enumerate(["grpo_density", "grpo_baseline"])}
    weights = {"grpo_baseline": {f"mod{i}": float(i + 1) for i in range(25)},
               "grpo_density": {f"mod{i}": float(np.sqrt(i + 1)) for i in range(25)}}
    setup = {"models": {"sft": "outs/sft/model.pt"}, "sampler": "temperature 1.0, top-k 50", "max_new_tokens": 64}
    return write_report(result, samples, logs, weights, root / "reports" / "report.md", root / "reports" / "figures",
                        setup, extra_sections=["## Adversarial track\n\nappended later"])


def test_report_and_figures_byte_identical(samples, result, tmp_path):
    md = _write(result, samples, tmp_path / "a")
    md2 = _write(json.loads(json.dumps(result)), samples, tmp_path / "b")  # also after a JSON round trip
    assert md == md2 == (tmp_path / "a" / "reports" / "report.md").read_text(encoding="utf-8")
    figures = ["metrics.png", "delta.png", "reward_curves.png", "sampling_weights.png"]
    for name in figures:
        assert f"](figures/{name})" in md  # relative to report.md
        a = (tmp_path / "a" / "reports" / "figures" / name).read_bytes()
        assert a[:8] == b"\x89PNG\r\n\x1a\n" and b"Software" not in a
        assert a == (tmp_path / "b" / "reports" / "figures" / name).read_bytes(), name
    assert PASS in md and FAIL in md and "Reward lost" in md
    assert md.rstrip().endswith("appended later")
    assert "What does `f" in md  # sample responses side by side, with the prompt text


def test_report_without_logs_or_weights(samples, result, tmp_path):
    small = {**result, "metrics": ["distinct_2", "reward"]}  # two panels: the figures are not what is tested here
    md = write_report(small, samples, {}, {}, tmp_path / "report.md", tmp_path / "fig", {"models": "x"})
    assert "no GRPO logs given" in md and "no sampling weights given" in md
    assert sorted(p.name for p in (tmp_path / "fig").iterdir()) == ["delta.png", "metrics.png"]
    with pytest.raises(ValueError, match="reward_mean"):
        write_report(small, samples, {"grpo_density": pd.DataFrame({"step": [0]})}, {}, tmp_path / "r.md",
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
