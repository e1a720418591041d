"""The gold-checked task (data/gold.py, eval/task.py) and the metric controls of the evaluation: EAD on a fixed
scale (eval/diversity.ngram_vocab), the temperature ordering (eval/controls.py)."""
import zlib

import numpy as np
import pandas as pd
import pytest
import torch

from speedrun.data import gold
from speedrun.data.docstrings import heldout_split, load_objects
from speedrun.eval import diversity as dv
from speedrun.eval.compare import evaluate
from speedrun.eval.controls import temperature_ordering
from speedrun.eval.stats import spearman
from speedrun.eval.task import compare_task, per_item, task_section
from speedrun.eval.sampling import PROMPT_GAIN, prompt_gain, prompt_gain_summary, swapped_prompt_rows
from speedrun.probe import copy_probe
from test_report import RUNS, make_samples


@pytest.fixture(scope="module")
def items(objects_path):
    return gold.gold_items(load_objects(objects_path), 0.1, 0.1)


def test_items_are_modules_with_several_right_answers_split_like_sft(items, objects_path):
    assert {i.split for i in items} == {"train", "val", "eval"} and {i.kind for i in items} == {"function", "class"}
    json_fn = next(i for i in items if (i.module, i.kind) == ("json", "function"))
    assert {"json.dumps", "json.loads"} <= json_fn.answers and "json.JSONDecoder" not in json_fn.answers
    assert all(len(i.answers) >= gold.MIN_ANSWERS and all(a.startswith(i.module + ".") for a in i.answers)
               for i in items)
    top_of = {o.module: o.top for o in load_objects(objects_path)}
    assert all(i.split == heldout_split(top_of[i.module], 0.1, 0.1) for i in items)
    pool = gold.distractor_pool(items)
    q = json_fn.prompt(pool)
    assert q == json_fn.prompt(pool) and "`json`" in q  # the evaluation asks an item the same question every time
    listed = [n.strip("`,.?:") for n in q.split() if n.startswith("`") and "." in n]
    assert len(listed) == gold.SHOWN + gold.DISTRACTORS and len(set(listed) & json_fn.answers) == gold.SHOWN


def test_sft_conversations_come_from_one_split_with_right_answers(items):
    convs = gold.conversations(items, "train", 3, seed=0)
    train = [i for i in items if i.split == "train" for _ in range(3)]  # in item order, 3 questions each
    assert len(convs) == len(train)
    train_names = gold.distractor_pool([i for i in items if i.split == "train"])
    for item, (user, bot) in zip(train, convs):
        assert f"`{item.module}`" in user["content"] and bot["content"] in user["content"]  # a listed name
        listed = [w.strip("`,.?:") for w in user["content"].split() if w.startswith("`") and "." in w]
        assert set(listed) - {item.module} <= set(train_names)  # wrong options too come from train modules only
        assert gold.check(item, bot["content"]) == bot["content"].strip("`")
    assert convs == gold.conversations(items, "train", 3, seed=0) != gold.conversations(items, "train", 3, seed=1)


def test_the_check_reads_the_first_dotted_name():
    item = gold.GoldItem("x", "json", "function", "eval", frozenset({"json.dumps", "json.loads"}))
    assert gold.check(item, "`json.dumps`") == "json.dumps"
    assert gold.check(item, "Use json.loads(s), not json.dumps.") == "json.loads"
    assert gold.check(item, "`json.JSONDecoder`") is None and gold.check(item, "dumps") is None
    assert gold.check(item, "`pickle.dumps` or json.dumps") is None  # the first name counts


def test_pass_at_k_is_the_unbiased_estimator():
    assert gold.pass_at_k(16, 0, 4) == 0.0 and gold.pass_at_k(16, 13, 4) == 1.0
    assert gold.pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert gold.pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
    with pytest.raises(ValueError):
        gold.pass_at_k(2, 1, 4)


def _answers(model: str, right_share: float, names: int, n: int = 8, items: int = 12) -> list[dict]:
    rng = np.random.default_rng(zlib.crc32(repr((model, right_share, names)).encode()))  # not hash(): salted per run
    return [{"model": model, "item_id": f"i{i}", "sample_idx": j, "text": "",
             "answer": f"m.f{rng.integers(names)}" if rng.random() < right_share else None}
            for i in range(items) for j in range(n)]


def test_task_metrics_and_comparison_see_a_planted_loss():
    rows = _answers("sft", 0.6, 6)
    for r in RUNS["density"]:
        rows += _answers(r, 0.6, 6)
    for r in RUNS["baseline"]:
        rows += _answers(r, 0.1, 1)  # collapsed: rarely right, and always the same answer
    df = pd.DataFrame(rows)
    table = per_item(df, (1, 4, 8))
    assert list(table["sft"].columns) == ["pass@1", "pass@4", "pass@8", "coverage@8"]
    assert table["grpo_baseline_s1"]["coverage@8"].max() <= 1
    res = compare_task(df, RUNS, [("density", "baseline")], "sft", margin=0.05, n_boot=200, seed=0)
    d = res["comparisons"][0]["delta"]
    assert d["pass@1"]["ci_low"] > 0 and d["coverage@8"]["ci_low"] > 0
    assert res["vs_reference"]["baseline"]["pass@1"]["noninferiority"] == "inferior"
    same = compare_task(df, {"a": RUNS["density"], "b": RUNS["density"]}, [("a", "b")], "sft", 0.05, 200, 0)
    d = same["comparisons"][0]["delta"]["pass@1"]
    assert d["value"] == 0.0 and d["ci_low"] < 0 < d["ci_high"] and d["noninferiority"] != "inferior"
    floor = df.assign(answer=None)  # nobody is ever right: no verdict, not "non-inferior"
    res = compare_task(floor, RUNS, [("density", "baseline")], "sft", 0.05, 50, 0)
    assert res["at_floor"] and res["comparisons"][0]["delta"]["pass@1"]["noninferiority"] is None
    assert res["vs_reference"]["density"]["pass@1"]["noninferiority"] is None


class _Copier(torch.nn.Module):
    """A planted copier: predicts the token `lag` positions back (a perfect induction head) where there is one."""

    def __init__(self, vocab: int, lag: int):
        super().__init__()
        self.vocab, self.lag = vocab, lag

    def forward(self, idx, targets, reduction="mean"):
        logits = torch.zeros(*idx.shape, self.vocab)
        t = torch.arange(idx.shape[1])
        src = (t + 1 - self.lag).clamp(min=0)
        logits.scatter_(2, idx[:, src].unsqueeze(-1), 20.0 * (t + 1 >= self.lag).float().expand_as(idx).unsqueeze(-1))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction)
        return loss.view(targets.shape) if reduction == "none" else loss


def test_the_copy_probe_sees_a_copier_and_a_model_that_cannot():
    from speedrun.model import GPT, GPTConfig
    torch.manual_seed(0)
    blind = copy_probe(GPT(GPTConfig(vocab_size=512, depth=2, seq_len=128)), 0, 512, 0, "cpu")
    assert not blind["copies"] and abs(blind["gain"]) < 0.2  # an untrained model: both copies at chance
    copier = copy_probe(_Copier(512, 48), 0, 512, 0, "cpu")
    assert copier["copies"] and copier["second_copy"] < 0.01 < copier["first_copy"]
    md = task_section({"metrics": ["pass@1"], "items": 3, "samples_per_item": 2, "at_floor": True, "margin": 0.05,
                       "values": {"sft": {"pass@1": 0.0}}, "comparisons": [], "vs_reference": {}}, "sft", blind)
    assert "it does not copy" in md and "It cannot copy from its context" in md


def test_the_prompt_swap_keeps_each_answer_and_never_its_own_prompt():
    rows = [[1, 5, 2, 7, 8, 9, 3], [1, 6, 6, 6, 2, 7, 3], [1, 4, 2, 9, 3]]
    own, own_lens, other, other_lens = swapped_prompt_rows(rows, [3, 5, 3], max_len=8)
    assert [r[:n] for r, n in zip(other, other_lens)] == [[1, 6, 6, 6, 2], [1, 4, 2], [1, 5, 2]]
    for o, n, x, m in zip(own, own_lens, other, other_lens):  # the same answer tokens under both prompts
        assert o[n:] == x[m:] and o[n:][-1] == 3 and len(o) <= 8 and len(x) <= 8
    assert own[0][3:] == [7, 8, 3]  # cut to fit after the longer prompt (5 tokens), keeping its last token
    with pytest.raises(ValueError, match="at least 2 prompts"):
        swapped_prompt_rows(rows[:1], [3], 8)


def test_the_prompt_gain_sees_a_model_that_reads_its_prompt_and_one_that_does_not():
    from speedrun.model import GPT, GPTConfig
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, depth=1, seq_len=16)
    rows = [[1, a, 2, a, 3] for a in range(10, 42)]  # the answer repeats the prompt's token: only a reader knows it
    swapped = swapped_prompt_rows(rows, [3] * len(rows), cfg.seq_len)
    blind = prompt_gain_summary(prompt_gain(GPT(cfg), swapped, "cpu"))  # an untrained model: no use of the prompt
    assert blind["ci_high"] < PROMPT_GAIN and abs(blind["gain"]) < 0.02
    reader = GPT(cfg)
    opt = torch.optim.AdamW(reader.parameters(), lr=1e-2)
    x = torch.tensor(rows)
    for _ in range(150):
        loss = reader(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
    reads = prompt_gain_summary(prompt_gain(reader.eval(), swapped, "cpu"))
    assert reads["ci_low"] > 1.0 > PROMPT_GAIN  # its answers are far likelier under their own prompt
    task = {"metrics": ["pass@1"], "items": 3, "samples_per_item": 2, "at_floor": True, "margin": 0.05,
            "values": {"sft": {"pass@1": 0.0}}, "comparisons": [], "vs_reference": {}}
    assert "barely depend on the question" in task_section(task, "sft", None, blind)
    assert "of a model that reads it." in task_section(task, "sft", None, reads)
    assert "barely depend" not in task_section(task, "sft", None, reads)


def test_ead_on_a_fixed_vocabulary_ignores_the_other_models():
    corpus = [" ".join(f"w{i}" for i in range(k, k + 50)) for k in range(0, 2000, 7)]
    vocab = dv.ngram_vocab(corpus)
    assert vocab[0] == len({f"w{i}" for k in range(0, 2000, 7) for i in range(k, k + 50)}) and vocab[1] == 2044
    kinds = {"sft": ("diverse", 0.0), "grpo_density_s1": ("collapsed", 0.0), "grpo_density_s2": ("collapsed", 0.0)}
    df = make_samples(kinds, n_prompts=4)
    alone = evaluate(df[df["model"] == "sft"], {}, [], reference=None, n_boot=2, ead_vocab_size=vocab)
    together = evaluate(df, {}, [], reference=None, n_boot=2, ead_vocab_size=vocab)
    loose = evaluate(df, {}, [], reference=None, n_boot=2)  # V from the evaluated models' own n-grams
    for n in ("ead_1", "ead_2", "ead_3"):
        assert alone["values"]["sft"][n] == together["values"]["sft"][n]
    assert loose["values"]["sft"]["ead_1"] != alone["values"]["sft"]["ead_1"]


def test_the_temperature_control_passes_a_metric_that_orders_and_drops_one_that_cannot():
    vocab = [f"w{i}" for i in range(400)]
    rows = []
    for t in (0.3, 0.6, 1.0, 1.5):  # a softmax over word scores: a higher temperature spreads the words
        p = np.exp(-np.arange(len(vocab)) / (20 * t))
        p /= p.sum()
        rng = np.random.default_rng(int(t * 10))
        for i in range(6):
            for s in (0, 1):
                for j in range(4):
                    rows.append({"model": f"T{t}", "prompt_id": f"p{i}", "seed": s, "sample_idx": j, "reward": 0.0,
                                 "text": " ".join(rng.choice(vocab, 20, p=p)) + " -- x"})
    temps = {f"T{t}": t for t in (0.3, 0.6, 1.0, 1.5)}
    res = temperature_ordering(pd.DataFrame(rows), temps, ["ead_1", "self_bleu", "len_words"], dv.ngram_vocab(
        [" ".join(vocab)]), seed=0)
    assert res["temperatures"] == [0.3, 0.6, 1.0, 1.5]
    assert res["metrics"]["ead_1"]["passes"] and res["metrics"]["self_bleu"]["passes"]
    assert not res["metrics"]["len_words"]["passes"]  # every response has 22 words: it cannot see anything
    assert spearman([1, 2, 3], [3, 2, 1]) == -1.0 and spearman([1, 1, 1], [1, 2, 3]) == 0.0


def test_mde_shrinks_with_seeds_and_the_power_table_reads_the_comparison():
    from speedrun.eval import stats
    from speedrun.eval.controls import power_section, power_table
    assert stats.mde(1.0, 0.0, 3, 12) < stats.mde(1.0, 0.0, 3, 6) < stats.mde(1.0, 0.0, 3, 3)
    assert stats.mde(1.0, 0.0, 3, 3, m=3) > stats.mde(1.0, 0.0, 3, 3, m=1)  # Holm's first step is stricter
    assert stats.mde(0.0, 0.01, 3, 64) > 0.1  # the prompt term does not shrink with seeds
    r = stats.runs_needed(1.0, 0.0, 3, stats.mde(1.0, 0.0, 3, 10))
    assert r == 10 and stats.runs_needed(1.0, 0.5, 3, 0.01) is None
    kinds = {"sft": ("diverse", 0.0)} | {r: ("diverse", 0.5) for r in RUNS["density"]}
    kinds |= {r: ("collapsed", 1.0) for r in RUNS["baseline"]}
    res = evaluate(make_samples(kinds, n_prompts=6), RUNS, primary=["ead_1", "self_bleu"], n_boot=50)
    power = power_table(res, res["comparisons"][0], "baseline")
    assert set(power) == {"ead_1", "self_bleu"}
    ead = power["ead_1"]
    assert ead["collapse"] == pytest.approx(abs(res["vs_reference"]["baseline"]["ead_1"]["value"]))
    assert ead["mde_share"] == pytest.approx(ead["mde"] / ead["collapse"]) and ead["runs"] == 3
    assert ead["mde_share_max_runs"] < ead["mde_share"] and 0 <= ead["seed_var_share"] <= 1
    d = res["comparisons"][0]["delta"]["ead_1"]
    assert ead["seed_var_share"] == pytest.approx(d["between_var"] / (d["between_var"] + d["prompt_var"]))
    md = power_section(power, res["comparisons"][0], "baseline", "sft")
    assert "Var(Δ) from seeds" in md and f"at {stats.MAX_RUNS} seeds" in md
    assert power["self_bleu"]["collapse"] > 0  # collapse is signed: self-BLEU rose, a loss of diversity
    # GRPO that makes the runs MORE diverse than the reference has no collapse to measure an MDE against
    kinds = {"sft": ("collapsed", 1.0)} | {r: ("diverse", 0.0) for r in RUNS["density"] + RUNS["baseline"]}
    res = evaluate(make_samples(kinds, n_prompts=6), RUNS, primary=["ead_1", "self_bleu"], n_boot=50)
    power = power_table(res, res["comparisons"][0], "baseline")
    assert all(d["collapse"] < 0 and d["mde_share"] is None and d["runs_for_30pct"] is None for d in power.values())
    assert "| no collapse |" in power_section(power, res["comparisons"][0], "baseline", "sft")


def test_the_manipulation_check_measures_how_far_the_prompt_mix_moves():
    from speedrun.eval.controls import crowding_bins, manipulation_check, noise_floor_tv
    groups = ["big"] * 6 + ["mid"] * 3 + ["small"]
    frame = lambda w, draws: pd.DataFrame({"prompt_id": [f"p{i}" for i in range(10)], "group": groups,  # noqa: E731
                                           "weight": w, "draws": draws})
    uniform = np.ones(10)
    balanced = np.array([1 / 6] * 6 + [1 / 3] * 3 + [1.0])  # every group the same total weight
    runs = {"density": {1: frame(balanced, [1] * 6 + [2] * 3 + [6]), 2: frame(balanced, [1] * 6 + [2] * 3 + [6])},
            "baseline": {1: frame(uniform, [2] * 10), 2: frame(uniform, [3] * 6 + [1] * 3 + [0])}}
    check = manipulation_check(runs, "density", "baseline", top=1)
    assert check["group_tv"] == pytest.approx(0.6 - 1 / 3)
    assert check["top1_share"] == {"density": pytest.approx(1 / 3), "baseline": pytest.approx(0.6)}
    assert check["weight_vs_group_size_corr"] < -0.8 and check["draws_per_prompt_max"] == 6
    assert check["drawn_tv_between_arms"] > 0 and check["drawn_tv_between_seeds"] > 0
    same = manipulation_check({"a": runs["baseline"], "b": runs["baseline"]}, "a", "b")
    assert same["prompt_tv"] == same["group_tv"] == same["drawn_tv_between_arms"] == 0.0
    assert same["bin_tv_between_arms"] == 0.0 and not same["passes"]
    # crowding bins: modules by size, cut at equal prompt counts (a module's bin is where its middle prompt falls)
    assert crowding_bins(pd.Series(groups)).to_dict() == {"small": 0, "mid": 1, "big": 3}
    assert check["bin_share"]["density"] == [pytest.approx(1 / 3, abs=1e-4)] * 3 and check["crowding_bins"] == 3
    # one module per bin here: the bin mixes are the module mixes
    assert check["bin_tv_between_arms"] == pytest.approx(check["drawn_tv_between_arms"])
    assert check["bin_arm_to_seed_ratio"] == pytest.approx(check["drawn_tv_between_arms"]
                                                           / check["drawn_tv_between_seeds"])
    assert not check["passes"]  # group TV 0.27 < 0.3, whatever the draws
    # the noise floor: two runs of 20 draws from one set of weights differ by about TV 0.2 over 3 groups
    floor = noise_floor_tv(runs["baseline"][1], pd.Series({"big": "big", "mid": "mid", "small": "small"}))
    assert 0.1 < floor < 0.3
