"""On-policy rejected answers (stage onpolicy_pairs), the RM training on them, and the rules that keep a constant
reward model out of GRPO: the best checkpoint is a trained one, and GRPO refuses an RM that scores all the same."""
import json
import subprocess
import sys

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from conftest import REPO, run_module, sets, train_config
from speedrun.reward import onpolicy
from speedrun.reward import preference as pref
from test_reward import rm_args, rm_inputs  # noqa: F401  (module fixture: real pairs + a tiny init checkpoint)


def onpolicy_args(tiny_corpus, root, out, *extra):
    return ["--pairs", str(root / "pairs.parquet"), "--sft-dir", str(root / "sft"), "--tokenizer-dir",
            str(tiny_corpus / "tokenizer"), *sets("onpolicy.samples_per_prompt=2", "onpolicy.max_new_tokens=8",
                                                "onpolicy.batch_prompts=16"), "--out-dir", str(out), *extra]


@pytest.fixture(scope="module")
def onpolicy_out(tiny_corpus, rm_inputs, tmp_path_factory):  # noqa: F811
    """data/onpolicy of the test pairs: K = 2 samples of 8 tokens per prompt."""
    out = tmp_path_factory.mktemp("onpolicy")
    run_module("stages.onpolicy_pairs", *onpolicy_args(tiny_corpus, rm_inputs[0], out))
    return out


@pytest.mark.slow
def test_stage_schema_ids_and_byte_identical_rerun(tiny_corpus, rm_inputs, onpolicy_out, tmp_path):  # noqa: F811
    root, tok = rm_inputs
    (tmp_path / "a").symlink_to(onpolicy_out)
    # the rerun under 2 processes (each samples every other batch of prompts): the same bytes
    run_module("stages.onpolicy_pairs", *onpolicy_args(tiny_corpus, root, tmp_path / "b"), "-S", "compute.nproc=2")
    for f in ("pairs.parquet", "stats.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    src = pq.read_schema(root / "pairs.parquet")
    got = pq.read_schema(tmp_path / "a/pairs.parquet")
    assert got.names == src.names + ["rejected_ids", "truncated"]
    assert [got.field(n).type for n in src.names] == [src.field(n).type for n in src.names]
    df, ref = pd.read_parquet(tmp_path / "a/pairs.parquet"), pd.read_parquet(root / "pairs.parquet")
    stats = json.loads((tmp_path / "a/stats.json").read_text())
    n_prompts = ref.loc[ref["split"] != "eval", "prompt_id"].nunique()  # the evaluation's prompts are never sampled
    assert stats["prompts"] == n_prompts and "eval" not in set(df["split"]) and (ref["split"] == "eval").any()
    assert stats["pairs"] + stats["skipped"]["sample_equals_reference"] == 2 * n_prompts
    assert set(df["negative"]) == {onpolicy.KIND} and df["id"].is_unique
    # same prompt ids and splits as dedup's pairs; chosen = the prompt's reference answer
    split_of = dict(zip(ref["prompt_id"], ref["split"]))
    assert all(split_of[p] == s for p, s in zip(df["prompt_id"], df["split"]))
    assert set(df["chosen"]) <= set(ref["chosen"])
    for ids, text, cut in zip(df["rejected_ids"], df["rejected"], df["truncated"]):
        ids = list(ids)
        assert 1 <= len(ids) <= 8 and cut == (ids[-1] != tok.assistant_end_id)
        assert tok.decode([t for t in ids if t != tok.assistant_end_id]) == text

    # K = 0: an empty file of the same schema, so train_rm still has its input
    run_module("stages.onpolicy_pairs", *onpolicy_args(tiny_corpus, root, tmp_path / "none"),
               "-S", "onpolicy.samples_per_prompt=0")
    assert pq.read_schema(tmp_path / "none/pairs.parquet") == got
    assert pq.read_metadata(tmp_path / "none/pairs.parquet").num_rows == 0


def test_a_prompts_samples_depend_on_its_id_only(tiny_corpus, rm_inputs):  # noqa: F811
    from speedrun.train.checkpoint import load_model

    root, tok = rm_inputs
    refs = onpolicy.reference_answers(pq.read_table(root / "pairs.parquet").to_pylist(), "pairs.parquet")
    model, _ = load_model(root / "sft", "cpu", tok.digest)
    sample = lambda rs: {r["id"]: list(r["rejected_ids"]) for r in onpolicy.sample_rejected(  # noqa: E731
        model, tok, rs, 2, 6, 1.0, 1.0, 7, 1, 64)[0]}
    every, some = sample(refs), sample(refs[::3])
    assert some and all(every[k] == v for k, v in some.items())  # fewer prompts: the same draws for the rest
    assert sample(refs[::3]) == some
    other_seed = {r["id"]: list(r["rejected_ids"]) for r in onpolicy.sample_rejected(
        model, tok, refs[::3], 2, 6, 1.0, 1.0, 8, 1, 64)[0]}
    assert other_seed != some
    # keep_truncated=False: the same draws, less every sample cut at the budget, each counted
    rows, stats = onpolicy.sample_rejected(model, tok, refs[::3], 2, 6, 1.0, 1.0, 7, 1, 64, keep_truncated=False)
    ended = {k: v for k, v in some.items() if v[-1] == tok.assistant_end_id}
    assert {r["id"]: list(r["rejected_ids"]) for r in rows} == ended and not any(r["truncated"] for r in rows)
    assert stats["skipped"]["truncated"] == len(some) - len(ended) > 0


@pytest.mark.slow
def test_rm_trains_on_the_union_scoring_the_sampled_ids(tiny_corpus, rm_inputs, onpolicy_out,  # noqa: F811
                                                        tmp_path):
    root, tok = rm_inputs
    (tmp_path / "on").symlink_to(onpolicy_out)
    both = pref.load_pairs(root / "pairs.parquet", tmp_path / "on/pairs.parquet")
    rendered, _, _ = pref.render_pairs(both[both["negative"] == onpolicy.KIND].head(3), tok, 96)
    for row, r in zip(both[both["negative"] == onpolicy.KIND].head(3).to_dict("records"), rendered["rejected"]):
        p = tok.render_prompt([dict(m) for m in row["prompt"]])
        assert r == p + list(row["rejected_ids"])  # the ids as sampled, not the decoded text re-encoded
    with pytest.raises(ValueError, match="appears twice"):
        pref.load_pairs(tmp_path / "on/pairs.parquet", tmp_path / "on/pairs.parquet")

    run_module("stages.train_rm", *rm_args(tiny_corpus, root, tmp_path / "rm",
                                           more_pairs=[tmp_path / "on/pairs.parquet"]))
    m = json.loads((tmp_path / "rm/rm.json").read_text())
    assert set(m["by_kind"]) == {"all", "hard", "random", onpolicy.KIND}
    assert m["train_pairs"] > len(both[(both["split"] == "train") & (both["negative"] != onpolicy.KIND)])
    assert m["best_step"] > 0 and m["reward_std"] > 0 and m["train_pairs_left_out"] == {}

    # trained on the on-policy kind alone: the other kinds are left out of training (counted), still scored
    run_module("stages.train_rm", *rm_args(tiny_corpus, root, tmp_path / "only", "-S",
                                           f"rm.train_kinds=[{onpolicy.KIND}]",
                                           more_pairs=[tmp_path / "on/pairs.parquet"]))
    only = json.loads((tmp_path / "only/rm.json").read_text())
    train = both[both["split"] == "train"]
    assert only["train_pairs"] == (train["negative"] == onpolicy.KIND).sum()
    assert only["train_pairs_left_out"] == {k: int(n) for k, n in train["negative"].value_counts().items()
                                            if k != onpolicy.KIND}
    assert set(only["by_kind"]) == set(m["by_kind"]) and only["val_pairs"] == m["val_pairs"]
    proc = subprocess.run([sys.executable, "-m", "stages.train_rm", *rm_args(tiny_corpus, root, tmp_path / "none"),
                           "-S", "rm.train_kinds=[uf]"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode != 0 and "no usable 'train' and 'val' pairs of kinds 'uf'" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr  # a user's failure: one line


def test_best_checkpoint_is_the_lowest_trained_loss_whatever_min_delta():
    from speedrun.model import GPT, GPTConfig
    from speedrun.train.distributed import Dist
    from speedrun.train.loop import train

    model = GPT(GPTConfig(vocab_size=16, depth=1, head_dim=32, seq_len=8))
    batch = lambda step, rank, world: [(torch.zeros(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long))]  # noqa: E731
    losses = iter([0.6931, 0.6925, 0.6918, 0.6915, 0.6917])  # each gain below min_delta
    snapshots = {}

    def eval_fn(m):
        snapshots[len(snapshots)] = {k: v.clone() for k, v in m.state_dict().items()}
        return {"val_loss": next(losses)}

    res = train(model, train_config(steps=4, eval_every=1, min_delta=0.002, patience=3), batch, eval_fn,
                Dist(0, 1, "cpu"))
    # patience (min_delta) stopped it after three evals without a 0.002 gain; the best is still step 3's 0.6915
    assert res.stopped_early and res.steps_done == 3 and res.best_eval == {"step": 3, "val_loss": 0.6915}
    assert all(torch.equal(res.best_state[k], snapshots[3][k]) for k in res.best_state)

    # an untrained step 0 is never the result, even when every trained eval is worse
    worse = iter([0.5, 0.7, 0.6])
    res = train(GPT(GPTConfig(vocab_size=16, depth=1, head_dim=32, seq_len=8)), train_config(steps=2, eval_every=1),
                batch, lambda m: {"val_loss": next(worse)}, Dist(0, 1, "cpu"))
    assert res.best_eval["step"] == 2


@pytest.mark.slow
def test_grpo_stages_refuse_a_constant_reward_model(tiny_corpus, rm_inputs, tmp_path):  # noqa: F811
    from speedrun.model import GPT, GPTConfig
    from speedrun.reward.discriminator import Discriminator, save_discriminator
    from speedrun.rl.grpo import require_reward_signal
    from speedrun.train.checkpoint import save_model

    root, tok = rm_inputs
    rm = pref.RewardModel.from_gpt(GPT(GPTConfig(vocab_size=tok.vocab_size, depth=2, n_embd=32, head_dim=16,
                                                 seq_len=64)))  # the untrained zero head
    save_model(tmp_path / "rm0", rm.state_dict(), rm.config, {"tokenizer": tok.digest, "reward_mean": 0.0,
                                                               "reward_std": 0.0, "max_len": 64})
    run_module("stages.dedup_prompts", "--pairs", str(root / "raw.parquet"), "--out-dir", str(tmp_path / "p"))
    proc = subprocess.run([sys.executable, "-m", "stages.grpo", "--arm", "density", "--seed", "1", "--sft-dir",
                           str(root / "sft"), "--rm-dir", str(tmp_path / "rm0"), "--tokenizer-dir",
                           str(tiny_corpus / "tokenizer"), "--prompts", str(tmp_path / "p/prompts.parquet"),
                           "-S", "grpo.train.steps=1", "--out-dir", str(tmp_path / "g"),
                           "--metrics", str(tmp_path / "g.json")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode != 0 and "constant reward model" in proc.stderr and str(tmp_path / "rm0") in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr  # a user's failure: one line
    assert not (tmp_path / "g").exists()
    # the adversarial discriminator: an untrained (zero) output layer is refused the same way
    disc = Discriminator(GPT(GPTConfig(vocab_size=tok.vocab_size, depth=1, n_embd=32, head_dim=16, seq_len=16)))
    with pytest.raises(ValueError, match="disc0: constant reward model: its output layer is all zeros"):
        require_reward_signal(disc.head[-1].weight, None, "disc0")
    save_discriminator(tmp_path / "disc0", disc, {"tokenizer": tok.digest})
    proc = subprocess.run([sys.executable, "-m", "stages.adv_grpo", "--cycle", "1", "--init-dir", str(root / "sft"),
                           "--disc-dir", str(tmp_path / "disc0"), "--tokens-dir", str(tiny_corpus / "tokens"),
                           "--tokenizer-dir", str(tiny_corpus / "tokenizer"), "-S", "adversarial.seq_len=16",
                           "-S", "adversarial.train.steps=1", "--out-dir", str(tmp_path / "adv")], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "constant reward model" in proc.stderr and "disc0" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr  # a user's failure: one line
    with pytest.raises(ValueError, match="rewards have std 0.0"):
        require_reward_signal(torch.ones(3), 0.0, "rm")
    require_reward_signal(torch.ones(3), 0.5, "rm")  # a trained head with spread passes
