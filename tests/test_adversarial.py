"""The adversarial cycle: mixed windows, the discriminator, the self-supervised reward, the stages."""
import json

import pandas as pd
import pytest
import torch
from conftest import grpo_config, run_module, train_config

from speedrun import tokenizer as tokenizer_lib
from speedrun.adversarial import data as adv
from speedrun.adversarial import evaluate as ev
from speedrun.adversarial.reward import grpo_reward_fn, score
from speedrun.common import read_json, write_parquet
from speedrun.model import GPT, GPTConfig
from speedrun.reward.discriminator import (Discriminator, completion_reward, k_fraction, load_discriminator, metrics,
                                           save_discriminator, switch_points)
from speedrun.rl.trainer import grpo_train
from speedrun.train.checkpoint import save_model
from speedrun.train.data import StepSampler
from speedrun.train.distributed import Dist
from speedrun.train.loop import train

torch.set_num_threads(1)
N = 32


def tiny_gpt(vocab: int, depth: int = 2, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=vocab, depth=depth, n_embd=64, head_dim=32, seq_len=N))


@pytest.fixture(scope="module")
def split_windows(tiny_corpus):
    tok = tokenizer_lib.load(tiny_corpus / "tokenizer")
    wins = {s: adv.corpus_windows(tiny_corpus / "tokens" / f"{s}.bin", tok.digest, N) for s in ("train", "val")}
    return tok, wins


def test_mixed_windows_labels_k_and_provenance(split_windows, tmp_path):
    tok, wins = split_windows
    policy = tiny_gpt(tok.vocab_size)
    frames = {s: adv.build_split(policy, wins[s], 40, 6, 16, 7, "1", s, pad_id=tok.bos_id) for s in ("train", "val")}
    again = adv.build_split(policy, wins["val"], 40, 6, 16, 7, "1", "val", pad_id=tok.bos_id)
    pd.testing.assert_frame_equal(frames["val"], again)  # seeded from (seed, cycle, split, batch)
    for split, df in frames.items():
        assert len(df) == 46 and df["pure"].sum() == 6 and df["window"].is_unique
        assert {0, N} <= set(df["K"]) and df["K"].between(0, N).all()
        for row in df.itertuples():
            assert list(row.labels) == [1] * row.K + [0] * (N - row.K)
            assert list(row.tokens[:row.K]) == wins[split][row.window, 1:1 + row.K].tolist()  # natural, same split
        generated = [t for row in df.itertuples() for t in row.tokens[row.K:]]
        natural_rest = [t for row in df.itertuples() for t in wins[split][row.window, 1 + row.K:].tolist()]
        assert generated != natural_rest  # the policy really wrote the tail
    write_parquet(tmp_path / "val.parquet", frames["val"])
    tokens, labels, ks, pure = adv.load_split(pd.read_parquet(tmp_path / "val.parquet"), N, "val.parquet")
    assert tokens.shape == labels.shape == (46, N) and torch.equal(labels.sum(1).long(), ks) and int(pure.sum()) == 6
    bad = frames["val"].copy()
    bad.at[3, "labels"] = [1] * N
    with pytest.raises(ValueError, match="val.parquet row 3"):
        adv.load_split(bad, N, "val.parquet")


def test_prefix_path_equals_forward_and_save_load(tmp_path):
    idx = torch.randint(0, 100, (3, N))
    for k in (0, 1, 2):
        disc = Discriminator(tiny_gpt(100), "token", k)
        with torch.no_grad():
            disc.head[2].weight.normal_()
        torch.testing.assert_close(disc.from_prefix(disc.prefix(idx)), disc(idx))
        trainable = {n.split(".")[0] for n, p in disc.named_parameters() if p.requires_grad}
        assert trainable == ({"head", "pos_bias"} if k == 0 else {"head", "pos_bias", "trunk"})
    pooled = Discriminator(tiny_gpt(100), "pooled", 1)
    assert pooled(idx).shape == (3,)
    save_discriminator(tmp_path / "d", pooled, {"tokenizer": "x"})
    loaded, meta = load_discriminator(tmp_path / "d")
    assert meta["head"] == "pooled" and meta["train_last_blocks"] == 1
    torch.testing.assert_close(loaded(idx), pooled(idx))


def test_switch_points_reward_and_auc_by_hand():
    big = 8.0
    logits = torch.tensor([[big, big, -big, -big], [big, big, big, big], [-big, big, -big, -big]])
    assert switch_points(logits).tolist() == [2, 4, 0]  # row 3: a lone natural-looking token is not a switch
    r = completion_reward(logits, torch.tensor([2, 1, 1]))
    torch.testing.assert_close(r, torch.tensor([0.0, 1.0, 1 / 3]), atol=1e-3, rtol=0)
    torch.testing.assert_close(completion_reward(logits, torch.tensor([2, 2, 2]), "logit"),
                               torch.tensor([-big, big, -big]))
    m = metrics(logits, torch.tensor([2, 4, 0]), torch.tensor([False, True, True]), 4)
    assert m["auc_pure"] == 1.0 and m["switch_error_tokens"] == 0.0 and m["n_pure_generated"] == 1


def test_cycles_in_numeric_order():
    cycles = ev.ordered_cycles({"2": {"prev": 1, "init": "outs/adv/cycle_1/policy"}, "10": {"prev": 2, "init": "x"},
                                "1": {"prev": 0, "init": "outs/pretrain"}})
    assert list(cycles) == ["1", "2", "10"] and cycles["2"] == {"prev": 1, "init": "outs/adv/cycle_1/policy"}
    assert list(ev.policy_dirs(cycles, "outs/adv")) == ["0", "1", "2", "10"]


def shuffle_tails(tokens: torch.Tensor, starts: torch.Tensor, seed: int) -> torch.Tensor:
    """Each row's tokens from its start on, in a random order: the same tokens, only their order is wrong."""
    g, out = torch.Generator().manual_seed(seed), tokens.clone()
    for row, k in zip(out, starts.tolist()):
        row[k:] = row[k:][torch.randperm(len(row) - k, generator=g)]
    return out


@pytest.fixture(scope="module")
def trained_disc(split_windows):
    """A discriminator trained on a toy split: the first K tokens of a window, then its other tokens shuffled."""
    tok, wins = split_windows
    x_tr = wins["train"][:1024, 1:]
    k_tr = adv.draw_ks(len(x_tr), N, 0, "toy", "train")
    x_tr, y_tr = shuffle_tails(x_tr, k_tr, 1), adv.token_labels(k_tr, N).float()
    x_va = wins["val"][:192, 1:]
    k_va = torch.cat([torch.zeros(32, dtype=torch.long), torch.full((32,), N), adv.draw_ks(128, N, 0, "toy", "val")])
    x_va = shuffle_tails(x_va, k_va, 2)
    disc = Discriminator(tiny_gpt(tok.vocab_size), "token", 0, N)
    cached = disc.prefix(x_tr)  # frozen trunk: its activations once, as adv_rm does
    sampler = StepSampler(len(x_tr), 32, 0, 0, "toy")
    batch_fn = lambda step, rank, world: [(cached[i], y_tr[i]) for i in sampler.items(step, rank, world)]  # noqa: E731
    train(disc, train_config(steps=400, lr=3e-3, warmup_steps=10, eval_every=400), batch_fn,
          lambda m: {"val_loss": 0.0}, Dist(0, 1, "cpu"), loss_fn=lambda m, x, y: m.loss_sum(m.from_prefix(x), y),
          log_every=1000)
    return disc.eval(), x_va, k_va


def test_discriminator_learns_toy_split(trained_disc):
    disc, x_va, k_va = trained_disc
    with torch.no_grad():
        logits = disc(x_va)
    m = metrics(logits, k_va, torch.arange(len(k_va)) < 64, N)
    assert m["n_pure_natural"] >= 32 and m["n_pure_generated"] >= 32
    assert m["auc_pure"] > 0.9
    assert m["mae_k_frac"] < m["mae_k_frac_baseline"]
    # the estimated K/N follows the true one (the mean of per-token probabilities is shrunk toward the middle)
    assert torch.corrcoef(torch.stack([k_fraction(logits), k_va.float()]))[0, 1] > 0.6


def test_reward_natural_beats_shuffled(trained_disc, split_windows):
    disc, _, _ = trained_disc
    tok, wins = split_windows
    prompts, idx = adv.prompt_pool(wins["val"], 128, 3, "test")  # held-out windows, GRPO's prefix lengths
    natural, starts = wins["val"][idx, 1:], torch.tensor([len(p) - 1 for p in prompts])
    r_nat, r_shuf = score(disc, natural, starts), score(disc, shuffle_tails(natural, starts, 4), starts)
    assert r_nat.mean() > r_shuf.mean() + 0.05 and (r_nat > r_shuf).float().mean() > 0.9


def test_grpo_reward_cuts_completions_at_n_tokens(split_windows):
    tok, wins = split_windows
    policy, ref = tiny_gpt(tok.vocab_size, 1), tiny_gpt(tok.vocab_size, 1)
    disc = Discriminator(tiny_gpt(tok.vocab_size, 1), "token").eval()
    prompts, _ = adv.prompt_pool(wins["train"], 8, 0, "grpo")
    cfg = grpo_config("adversarial.train", steps=2, prompts_per_step=2, group_size=3, max_new_tokens=N - 1, lr=1e-3,
                    beta=0.04, warmup_steps=5, reward_threshold=float("inf"), patience=0)
    result = grpo_train(policy, ref, prompts, lambda step, g: torch.arange(2) + 2 * step, grpo_reward_fn(disc, N),
                        cfg, "cpu", stop_id=None, pad_id=tok.bos_id)
    for step, row in enumerate(result.log):
        want = sum(N - (len(prompts[i]) - 1) for i in (2 * step, 2 * step + 1)) / 2
        assert row["completion_len"] == want and row["reward_mean"] == pytest.approx(0.5)  # zero-init head


@pytest.mark.slow
def test_stages_end_to_end_and_deterministic(tiny_corpus, tmp_path):
    tok = tokenizer_lib.load(tiny_corpus / "tokenizer")
    policy = tiny_gpt(tok.vocab_size, 1)
    save_model(tmp_path / "p0", policy.state_dict(), policy.config, {"tokenizer": tok.digest})
    common = ["--tokens-dir", str(tiny_corpus / "tokens"), "--tokenizer-dir", str(tiny_corpus / "tokenizer"),
              "-S", f"adversarial.seq_len={N}", "-S", "compute.device=cpu",
              "-S", "adversarial.cycles=" + json.dumps({"1": {"prev": 0, "init": str(tmp_path / "p0")}})]
    for out in ("a", "b"):
        run_module("stages.adv_data", "--cycle", "1", "-S", "adversarial.data.train_rows=64",
                   "-S", "adversarial.data.val_rows=32", "-S", "adversarial.data.val_pure_rows=8",
                   "--out-dir", str(tmp_path / out), *common)
    for f in ("train.parquet", "val.parquet", "stats.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    adv_dir = tmp_path / "adv" / "cycle_1"
    run_module("stages.adv_rm", "--cycle", "1", "--data-dir", str(tmp_path / "a"),
               "--tokenizer-dir", str(tiny_corpus / "tokenizer"), "-S", "adversarial.rm.steps=20",
               "-S", "adversarial.rm.eval_every=10", "--out-dir", str(adv_dir / "disc"), *common[4:])
    run_module("stages.adv_grpo", "--cycle", "1", "--disc-dir", str(adv_dir / "disc"),
               "-S", "adversarial.train.prompts=16", "-S", "adversarial.train.steps=2",
               "-S", "adversarial.train.prompts_per_step=2", "-S", "adversarial.train.group_size=2",
               "--out-dir", str(adv_dir / "policy"), *common)
    run_module("stages.adv_eval", "--adv-dir", str(tmp_path / "adv"), "-S", "adversarial.eval.prompts=8",
               "-S", f"model.seq_len={N}", "-S", "adversarial.eval.bpb_windows=8",
               "--metrics", str(tmp_path / "adv.json"),
               "--out-md", str(tmp_path / "adv.md"), "--fig-dir", str(tmp_path / "figures"), *common)
    result = read_json(tmp_path / "adv.json")
    c = result["cycles"]["1"]
    assert set(result["policies"]) == {"0", "1"} and set(result["crossplay"]["1"]) == {"0", "1", "natural"}
    assert c["disc"]["auc_pure"] is not None and c["grpo"]["steps"] == 2 and "val_bpb_delta" in c
    md = (tmp_path / "adv.md").read_text()
    assert "figures/adv_crossplay.png" in md and (tmp_path / "figures" / "adv_grpo.png").exists()
