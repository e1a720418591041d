"""Preference reward model: last-token scoring under padding, Bradley-Terry learning, frozen trunk, the
train_rm stage end to end, and the held-out eval prompts kept out of training."""
import json
import shutil

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from conftest import run_module, sets, train_config
from speedrun import tokenizer as tokenizer_lib
from speedrun.common import write_parquet, write_table
from speedrun.data import pairs as pairs_lib
from speedrun.data import pairs_embedded, prompts
from speedrun.data.docstrings import collect, stdlib_dir
from speedrun.model import GPT, GPTConfig
from speedrun.reward import preference as pref
from speedrun.train.checkpoint import save_model
from speedrun.train.data import StepSampler
from speedrun.train.distributed import Dist
from speedrun.train.loop import train

torch.set_num_threads(1)
TINY = GPTConfig(vocab_size=32, depth=2, n_embd=32, head_dim=16, seq_len=32)


def tiny_rm(seed: int = 0, config: GPTConfig = TINY) -> pref.RewardModel:
    """Random blocks (not the identity of the zero-initialised out-projections) and a random head."""
    torch.manual_seed(seed)
    rm = pref.RewardModel(config)
    for block in rm.trunk.blocks:  # zero-initialised out-projections would make every block the identity
        torch.nn.init.normal_(block.attn.c_proj.weight, std=0.1)
        torch.nn.init.normal_(block.mlp.c_proj.weight, std=0.1)
    torch.nn.init.normal_(rm.head.weight)
    return rm.eval()


def test_score_reads_last_real_token_right_and_left_padded():
    rm = tiny_rm()
    rows = [[1, 5, 7, 9, 2], [1, 3], [1, 4, 4, 8, 8, 8, 6, 2, 11]]
    alone = torch.cat([rm.score(torch.tensor([r])) for r in rows])
    for left in (False, True):
        ids, mask = pref.pad_rows(rows, pad=0, left=left)
        assert torch.allclose(rm.score(ids, mask), alone, atol=1e-5)
        ids2 = ids.masked_fill(~mask, 17)  # what the pads hold must not matter
        assert torch.allclose(rm.score(ids2, mask), alone, atol=1e-5)
    # the head reads the final hidden state of the last token, not of any other position
    h = rm.trunk.hidden(torch.tensor([rows[0]]))
    assert torch.allclose(alone[0], rm.head(h[0, -1]).squeeze(), atol=1e-6)
    assert not torch.allclose(alone[0], rm.head(h[0, -2]).squeeze(), atol=1e-3)
    starts = [1] * len(rows)
    assert all(torch.equal(pref.score_ids(rm, rows, starts, batch_size=bs), pref.score_ids(rm, rows, starts,
                                                                                           batch_size=bs))
               for bs in (1, 2))
    assert torch.allclose(pref.score_ids(rm, rows, starts, batch_size=2), alone, atol=1e-5)


def test_mean_pool_averages_the_response_tokens_scores_under_any_padding():
    rm = tiny_rm()
    rm.pool = "mean"
    rows, starts = [[1, 5, 7, 9, 2], [1, 3, 4], [1, 4, 4, 8, 8, 8, 6, 2, 11]], [2, 1, 5]
    by_hand = torch.stack([rm.head(rm.trunk.hidden(torch.tensor([r]))[0, s:]).mean() for r, s in zip(rows, starts)])
    assert torch.allclose(pref.score_ids(rm, rows, starts, batch_size=3), by_hand, atol=1e-5)
    ids, mask = pref.pad_rows(rows, pad=0)
    assert torch.allclose(rm.score(ids, mask, torch.tensor(starts)), by_hand, atol=1e-5)
    with pytest.raises(ValueError, match="needs the response start"):
        rm.score(ids, mask)


@pytest.mark.parametrize("pool", ["last", "mean"])
def test_read_end_off_scores_an_ended_answer_as_the_same_answer_cut_before_its_end(pool):
    """rm.read_end false (end_id set): an answer closed by the end token scores as its content alone, under either
    padding and in the paired forward; an answer that is the end token alone keeps it; the prompt's own end
    tokens (a chat template closes its user turns with the same token) are read as before."""
    rm, end = tiny_rm(6), 2
    rm.pool = pool
    content = [[1, 5, 2, 7, 9], [1, 3, 4], [1, 4, 4, 8, 8, 8, 6, 11]]  # 2 closes the first prompt's turn
    starts = [3, 1, 5]
    cut = pref.score_ids(rm, content, starts)
    rm.end_id = end
    ended = [r + [end] for r in content]
    assert torch.allclose(pref.score_ids(rm, ended, starts, batch_size=2), cut, atol=1e-5)
    assert torch.allclose(pref.score_ids(rm, content, starts), cut, atol=1e-5)  # a cut answer: nothing left out
    for left in (False, True):
        ids, mask = pref.pad_rows(ended, pad=0, left=left)
        first = torch.tensor(starts) + (ids.size(1) - mask.sum(1) if left else 0)
        assert torch.allclose(rm.score(ids, mask, first), cut, atol=1e-5)
    alone = [[1, 5, 7, end]]  # the response (from 3) is the end token alone: it is read
    rm.end_id = None
    want = pref.score_ids(rm, alone, [3])
    rm.end_id = end
    assert torch.allclose(pref.score_ids(rm, alone, [3]), want, atol=1e-6)
    x, y = pref.pair_batch(ended[:2], [content[0], content[1][:1] + [end]], starts[:2])
    paired, unpaired = (rm(x.clamp(min=0), x >= 0, y.repeat(2), paired=flag) for flag in (True, False))
    torch.testing.assert_close(paired, unpaired, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(paired[:2], cut[:2], atol=1e-5, rtol=1e-5)


def toy_pairs(n: int, seed: int) -> dict[str, list]:
    """Separable: the chosen response contains token 30 somewhere, the rejected one token 31 instead;
    lengths and the other tokens are random."""
    g = torch.Generator().manual_seed(seed)
    out = {"chosen": [], "rejected": [], "kind": [], "prompt_len": []}
    for i in range(n):
        body = torch.randint(2, 28, (int(torch.randint(4, 12, (1,), generator=g)),), generator=g).tolist()
        at = int(torch.randint(0, len(body), (1,), generator=g))
        out["chosen"].append([1] + body[:at] + [30] + body[at:] + [29])
        out["rejected"].append([1] + body[:at] + [31] + body[at:] + [29])
        out["kind"].append("hard" if i % 2 else "random")
        out["prompt_len"].append(1)
    return out


def fit_toy(rm: pref.RewardModel, steps: int, lr: float = 3e-3):
    data, val = toy_pairs(256, 0), toy_pairs(64, 1)
    sampler = StepSampler(len(data["chosen"]), 16, 0, seed=0, salt="toy")
    cfg = train_config(steps=steps, lr=lr, warmup_steps=2, eval_every=steps)
    return train(rm, cfg, pref.pair_batch_fn(data, sampler), lambda m: pref.evaluate(m, val)[0],
                 Dist(0, 1, "cpu"), loss_fn=pref.bt_loss_sum, log_every=10**9)


def test_bt_loss_learns_a_separable_toy_problem():
    rm = pref.RewardModel(TINY)  # the real init: zero head, every reward 0 at the start
    pref.freeze(rm, TINY.depth)
    result = fit_toy(rm, 60)
    before, after = result.evals[0], result.evals[-1]
    assert before["val_loss"] == pytest.approx(0.6931, abs=1e-3) and before["val_acc"] == 0.5
    first, last = result.log[0]["loss"], sum(r["loss"] for r in result.log[-5:]) / 5
    assert last < 0.2 * first, (first, last)
    assert after["val_acc"] >= 0.97 and after["val_margin"] > 2.0, after
    assert {"val_acc_hard", "val_acc_random", "val_margin_hard"} <= set(after)


def test_length_micro_batches_keep_the_step_gradient():
    rm, data = tiny_rm(2), toy_pairs(24, 3)
    sampler = StepSampler(24, 12, 0, seed=0, salt="toy")

    def grads(micro_tokens):
        rm.zero_grad()
        micro = pref.pair_batch_fn(data, sampler, micro_tokens)(1, 0, 1)
        for x, y in micro:
            pref.bt_loss_sum(rm, x, y).backward()
        return len(micro), [p.grad.clone() for p in rm.parameters()]

    (n1, g1), (n2, g2) = grads(0), grads(64)
    assert n1 == 1 and n2 > 2
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g1, g2))


@pytest.mark.parametrize("pool", ["last", "mean"])
def test_paired_forward_runs_each_prompt_once_with_the_same_rewards_and_gradient(pool):
    """Training scores a pair_batch with paired=True (the shared prompt run once): the rewards and the BT gradient
    equal scoring every row on its own."""
    g = torch.Generator().manual_seed(5)
    chosen, rejected, plens = [], [], []
    for i in range(6):
        prompt = torch.randint(1, 32, (2 + i % 4,), generator=g).tolist()
        chosen.append(prompt + torch.randint(1, 32, (1 + (3 * i) % 7,), generator=g).tolist())
        rejected.append(prompt + torch.randint(1, 32, (2 + i % 3,), generator=g).tolist())
        plens.append(len(prompt))
    x, y = pref.pair_batch(chosen, rejected, plens)

    def rewards_and_grads(paired):
        rm = tiny_rm(4)
        rm.pool = pool
        r = rm(x.clamp(min=0), x >= 0, y.repeat(2), paired=paired)
        (r * torch.arange(1.0, 13.0)).sum().backward()
        return r.detach(), [p.grad for p in rm.parameters()]

    (r1, g1), (r2, g2) = rewards_and_grads(False), rewards_and_grads(True)
    torch.testing.assert_close(r2, r1, atol=1e-5, rtol=1e-5)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-3)


def test_train_last_blocks_freezes_the_rest_of_the_trunk():
    for k, changed in ((0, set()), (1, {"trunk.blocks.1."})):
        rm = tiny_rm(1)
        pref.freeze(rm, k)
        before = {n: p.detach().clone() for n, p in rm.state_dict().items()}
        fit_toy(rm, 3, lr=1e-2)
        after = rm.state_dict()
        assert not torch.equal(before["head.weight"], after["head.weight"])
        for name, w in before.items():
            if name.startswith("trunk."):
                trained = any(name.startswith(c) for c in changed)
                assert torch.equal(w, after[name]) == (not trained), (k, name)
    assert "trunk.lm_head.weight" not in after  # the RM has no vocabulary head at all


def test_response_logprob_sums_response_tokens_only():
    torch.manual_seed(0)
    gpt = GPT(TINY)
    rows, plens = [[1, 5, 7, 9, 2], [1, 3, 4]], [3, 2]
    got = pref.response_logprob(gpt, rows, plens)
    for row, p, g in zip(rows, plens, got):
        logp = torch.log_softmax(gpt(torch.tensor([row]))[0], -1)
        assert torch.allclose(g, sum(logp[t - 1, row[t]] for t in range(p, len(row))), atol=1e-5)


def test_overlap_baseline():
    p = [[{"role": "user", "content": "What does `json.JSONDecoder` do?"}]]
    assert pref.name_words("HTTPServer json_dumps") == {"http", "server", "json", "dumps"}
    assert pref.overlap_baseline(p * 3, ["Simple JSON decoder.", "x", "a"], ["A decoder.", "y", "JSON"]) == \
        [1.0, 0.5, 0.0]


# ---- pairs from the real embedded source, a real checkpoint, the real stage ----

@pytest.fixture(scope="module")
def rm_inputs(tiny_corpus, tmp_path_factory):
    """pairs.parquet of a few real stdlib modules through the real pairs + dedup code, and an init checkpoint."""
    root = tmp_path_factory.mktemp("rm")
    lib = root / "stdlib"  # a copy of a few modules: collect() over the whole stdlib takes too long
    for name in ("json", "csv.py", "abc.py", "datetime.py", "pathlib.py", "random.py"):
        src = stdlib_dir() / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, lib / name)
    objs, _ = collect(lib)
    # val_frac 0.17, eval_frac 0.2: abc and datetime are val modules, csv the eval module, the rest train
    pairs_lib.build({"embedded": pairs_embedded.source(objs, 0.5, 0.17, 0.2)}, root / "raw.parquet")
    _, with_split, _, _ = prompts.build(pq.read_table(root / "raw.parquet"), 0.17, 0.2, 0.8)
    write_table(root / "pairs.parquet", with_split)
    tok = tokenizer_lib.load(tiny_corpus / "tokenizer")
    config = GPTConfig(vocab_size=tok.vocab_size, depth=2, n_embd=32, head_dim=16, seq_len=64)
    trunk = tiny_rm(0, config).trunk.state_dict()  # random blocks: a stand-in for an SFT checkpoint
    lm_head = {"lm_head.weight": 0.01 * torch.randn(tok.vocab_size, 32)}
    save_model(root / "sft", trunk | lm_head, config, {"tokenizer": tok.digest, "step": 0})
    return root, tok


def rm_args(tiny_corpus, root, out, *extra, more_pairs=()):
    return ["--pairs", str(root / "pairs.parquet"), *(a for f in more_pairs for a in ("--pairs", str(f))),
            "--init-dir", str(root / "sft"),
            "--tokenizer-dir", str(tiny_corpus / "tokenizer"), *sets("rm.max_len=96", "rm.steps=6", "rm.batch_size=8",
                                                  "rm.warmup_steps=2", "rm.eval_every=3", "rm.eval_pairs=24",
                                                  "rm.train_last_blocks=1", "rm.lr=0.01", "rm.train_kinds=[all]"),
            "--scratch-dir", str(out / "scratch"), "--out-dir", str(out / "rm"), "--metrics", str(out / "rm.json"),
            *extra]


def test_val_and_eval_split_pairs_never_reach_training_batches(rm_inputs):
    root, tok = rm_inputs
    df = pref.load_pairs(root / "pairs.parquet")
    assert set(df["split"]) == {"train", "val", "eval"}
    split = pref.split_pairs(df, tok, 96)
    assert set(split) == {"train", "val"}  # the evaluation's pairs are not even rendered
    train_pairs, val = split["train"][0], split["val"][0]
    held_out = pref.render_pairs(df[df["split"] == "eval"], tok, 96)[0]
    assert len(val["id"]) >= 10 and len(train_pairs["id"]) >= 50 and len(held_out["id"]) >= 5
    eval_rows = {tuple(r) for r in val["chosen"] + val["rejected"] + held_out["chosen"] + held_out["rejected"]}
    train_rows = {tuple(r) for r in train_pairs["chosen"] + train_pairs["rejected"]}
    sampler = StepSampler(len(train_pairs["id"]), 8, 3, seed=0, salt="rm")
    batch_fn = pref.pair_batch_fn(train_pairs, sampler, micro_tokens=256)  # the stage re-cuts by length
    seen = set()
    for step in range(len(train_pairs["id"]) // 8 + 2):  # more than an epoch
        for x, y in batch_fn(step, 0, 1):
            assert x.size(0) == 2 * y.numel()
            for row in x.tolist():
                seen.add(tuple(t for t in row if t >= 0))
    assert seen == train_rows and not seen & eval_rows
    assert set(df.loc[df["split"] != "train", "prompt"].map(lambda p: p[0]["content"])).isdisjoint(
        {p[0]["content"] for p in train_pairs["prompt"]})
    bad = df.copy()
    bad.loc[bad.index[0], "prompt_id"] = bad.loc[bad["split"] == "eval", "prompt_id"].iloc[0]
    bad.loc[bad.index[0], "split"] = "train"
    write_parquet(root / "bad.parquet", bad)
    with pytest.raises(ValueError, match=r"pairs in several splits \['eval', 'train'\]"):
        pref.load_pairs(root / "bad.parquet")


def test_a_long_prompt_is_cut_as_grpo_cuts_it_counted_not_skipped(rm_inputs):
    """A prompt that leaves less than MIN_RESPONSE_TOKENS of rm.max_len keeps its chat header and its end, in the RM's
    training pairs and when the RM scores a conversation (as GRPO's prompts are cut), and the cut is counted."""
    from speedrun.tokenizer import cut_prompt
    root, tok = rm_inputs
    df = pref.load_pairs(root / "pairs.parquet")
    long_msgs = [{"role": "user", "content": "Tell me everything. " * 60}, {"role": "assistant", "content": "Sure."},
                 {"role": "user", "content": "Now, what does `json.dumps` return?"}]
    row = df[df["split"] == "train"].iloc[:1].copy()
    row.at[row.index[0], "prompt"] = long_msgs
    out, skipped, cut = pref.render_pairs(row, tok, 96)
    room = 96 - pref.MIN_RESPONSE_TOKENS
    want = cut_prompt(tok.render_prompt(long_msgs), room)
    assert skipped == {} and cut["prompts"] == 1 and len(out["id"]) == 1
    assert out["prompt_len"] == [room] and out["chosen"][0][:room] == want
    assert want[:2] == [tok.bos_id, tok.user_start_id]
    assert want[-1] == tok.assistant_start_id and tok.decode(want[2:-2]).endswith("what does `json.dumps` return?")
    rm = tiny_rm(0, GPTConfig(vocab_size=tok.vocab_size, depth=1, n_embd=32, head_dim=16, seq_len=96))
    rm.max_len = 96
    by_msgs = pref.score_conversations(rm, tok, [long_msgs], ["It returns a string."])
    by_ids = pref.score_ids(rm, [want + tok.encode("It returns a string.") + [tok.assistant_end_id]], [room])
    assert torch.allclose(by_msgs, by_ids, atol=1e-5)


@pytest.mark.slow
def test_stage_end_to_end_writes_loadable_outputs(tiny_corpus, rm_inputs, tmp_path):
    root, tok = rm_inputs
    out = run_module("stages.train_rm", *rm_args(tiny_corpus, root, tmp_path / "a"))
    assert "rm: val acc" in out
    run_module("stages.train_rm", *rm_args(tiny_corpus, root, tmp_path / "b"))
    for f in ("model.pt", "meta.json", "log.csv", "eval.csv"):  # a rerun is byte-identical
        assert (tmp_path / "a/rm" / f).read_bytes() == (tmp_path / "b/rm" / f).read_bytes(), f

    state = torch.load(tmp_path / "a/rm/model.pt", weights_only=True)
    assert "head.weight" in state and not any(k.startswith("trunk.lm_head") for k in state)
    meta = json.loads((tmp_path / "a/rm/meta.json").read_text())
    m = json.loads((tmp_path / "a/rm.json").read_text())
    n_val = len(pref.split_pairs(pref.load_pairs(root / "pairs.parquet"), tok, 96)["val"][0]["id"])
    assert meta["tokenizer"] == tok.digest and meta["reward_std"] > 0 and m["best_step"] > 0
    assert set(m["by_kind"]) == {"all", "hard", "random"} and 0 <= m["by_kind"]["hard"]["baseline_acc"] <= 1
    # periodic evals read 24 evenly spaced val pairs; the final metrics score every one of them
    assert n_val > 24 and m["val_pairs"] == m["by_kind"]["all"]["pairs"] == n_val and 0 <= m["sft_logprob_acc"] <= 1
    evals = pd.read_csv(tmp_path / "a/rm/eval.csv")
    assert list(evals["step"]) == [0, 3, 6] and {"val_acc", "val_margin", "val_loss"} <= set(evals.columns)

    rm = pref.RewardModel.load(tmp_path / "a/rm", "cpu", tok.digest)
    assert (rm.reward_mean, rm.reward_std) == (meta["reward_mean"], meta["reward_std"])
    df = pd.read_parquet(root / "pairs.parquet")
    ev = df[df["split"] == "eval"].head(5)
    msgs = [[dict(m) for m in p] for p in ev["prompt"]]
    texts = list(ev["chosen"])
    by_text = pref.score_conversations(rm, tok, msgs, texts, batch_size=2)
    # GRPO's way: prompt ids + sampled completion ids (<|assistant_end|> included), no re-encoding
    ids = pref.score_conversations(rm, tok, [tok.render_prompt(p) for p in msgs],
                                   [tok.encode(t) + [tok.assistant_end_id] for t in texts], batch_size=3)
    assert torch.allclose(by_text, ids, atol=1e-5)
    std = pref.score_conversations(rm, tok, msgs, texts, batch_size=2, standardise=True)
    assert torch.allclose(std, (by_text - rm.reward_mean) / rm.reward_std)
    assert abs(float(by_text[0]) - float(m["reward_mean"])) < 10 * m["reward_std"]
    assert meta["end_id"] is None and m["read_end"] is True and rm.end_id is None

    run_module("stages.train_rm", *rm_args(tiny_corpus, root, tmp_path / "c", *sets("rm.read_end=false")))
    meta = json.loads((tmp_path / "c/rm/meta.json").read_text())
    assert meta["end_id"] == tok.assistant_end_id
    assert json.loads((tmp_path / "c/rm.json").read_text())["read_end"] is False
    rm = pref.RewardModel.load(tmp_path / "c/rm", "cpu", tok.digest)
    assert rm.end_id == tok.assistant_end_id  # the loaded RM reads an ended answer as the same answer cut
    cut = pref.score_conversations(rm, tok, [tok.render_prompt(p) for p in msgs], [tok.encode(t) for t in texts])
    assert torch.allclose(pref.score_conversations(rm, tok, msgs, texts), cut, atol=1e-5)


@pytest.mark.parametrize("end_id", [None, 2])
@pytest.mark.parametrize("pool,max_len", [("last", 7), ("mean", 7), ("last", 9), ("mean", 9), ("last", 64),
                                          ("mean", 64)])
def test_grpo_scoring_of_samples_equals_scoring_each_row_alone(pool, max_len, end_id):
    """score_samples gives the rewards of each prompt + completion scored alone, for both pools: when the rows fit
    (max_len 64: each prompt run once, completions grouped by length), when a prompt is cut to its header and end
    as every stage cuts one (9: 3 tokens left beside 6 of completion), and when the completions leave no room for
    that (7: the batch is cut to its last max_len columns)."""
    from speedrun.engine import generate
    from speedrun.rl.rewards import score_samples
    from speedrun.tokenizer import cut_prompt

    rm = tiny_rm(3)
    rm.pool, rm.max_len, rm.end_id = pool, max_len, end_id  # end_id: rm.read_end false, the stop token not read
    torch.manual_seed(0)
    policy = GPT(rm.config)
    torch.nn.init.normal_(policy.lm_head.weight, std=0.5)
    prompts = [[1, 5, 7], [1, 3], [1, 4, 4, 8, 9]]
    s = generate(policy, prompts, 2, 6, stop_id=2, pad_id=0, generator=torch.Generator().manual_seed(0))
    got = score_samples(rm, prompts, s, pad_id=0, standardise=False)
    P, T = max(map(len, prompts)), s.tokens.size(1)
    assert T == 6 and len(set(s.mask.sum(1).tolist())) > 1  # mixed lengths
    room = max_len - T
    cut = max(0, P + T - rm.max_len) if room < 3 else 0  # leftmost columns dropped from the whole batch
    want = []
    for p, row, m in zip(s.prompt_index.tolist(), s.tokens, s.mask):
        kept = cut_prompt(prompts[p], room) if room >= 3 else prompts[p][max(0, cut - (P - len(prompts[p]))):]
        want.append(pref.score_ids(rm, [kept + row[m > 0].tolist()], [len(kept)])[0])
    if max_len == 9:
        assert cut_prompt(prompts[2], room) == [1, 4, 9]
    assert torch.allclose(got, torch.stack(want), atol=1e-5)
