"""What the evaluation draws from each model (eval/sampling.py): embeddings that do not depend on which texts share a
batch, and responses reused only where sampling again would give the very same rows."""
import pandas as pd
import pytest
import torch

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import write_parquet
from speedrun.eval.sampling import embed_texts, sample_models
from speedrun.model import GPT, GPTConfig
from speedrun.reward.preference import RewardModel
from speedrun.train.checkpoint import save_model


@pytest.fixture(scope="module")
def setup(tiny_corpus, tmp_path_factory):
    tok = tokenizer_lib.load(tiny_corpus / "tokenizer")
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=tok.vocab_size, depth=1, seq_len=128))
    ckpt = tmp_path_factory.mktemp("eval_sampling") / "sft"
    save_model(ckpt, gpt.state_dict(), gpt.config, {"tokenizer": tok.digest})
    questions = ["What does `json.dumps` do?", "Name a function of `os.path`.", "What is `re.sub`?"]
    prompts = pd.DataFrame({"prompt_id": [f"p{i}" for i in range(3)],
                            "prompt": [[{"role": "user", "content": q}] for q in questions]})
    ids = [tok.render_prompt(p) for p in prompts["prompt"]]
    pairs = ckpt.parent / "pairs.parquet"
    write_parquet(pairs, pd.DataFrame({"id": ["a0", "a1", "a2"], "prompt_id": prompts["prompt_id"],
                                       "prompt": prompts["prompt"], "chosen": ["It serialises.", "join", "A swap."]}))
    return tok, gpt, ckpt, RewardModel.from_gpt(gpt), prompts, ids, pairs


def test_embeddings_do_not_depend_on_the_batch_or_its_order(setup):
    tok, gpt, *_ = setup
    texts = ["a much longer answer about json and its dumps function", "", "json", "a list of names",
             "the same words again and again and again", "x"]
    together = embed_texts(gpt, tok, texts, "cpu", batch_size=4)  # sorted by length: batches mix the input order
    for text, vec in zip(texts, together):
        alone = embed_texts(gpt, tok, [text], "cpu")[0]
        assert abs(float((vec * alone).sum()) - 1.0) < 1e-5 and abs(float((vec ** 2).sum()) - 1.0) < 1e-5


def test_a_model_sampled_with_the_same_sampler_is_reused_exactly(setup):
    tok, gpt, ckpt, rm, prompts, ids, pairs = setup
    kw = dict(seeds=2, samples_per_prompt=3, max_new_tokens=12, temperature=1.0, top_p=1.0, seed=7, device="cpu")
    control = sample_models({"sft@T1": ckpt}, tok, rm, prompts, ids, None, **kw)
    fresh = sample_models({"sft": ckpt}, tok, rm, prompts, ids, pairs, **kw)
    reused = sample_models({"sft": ckpt}, tok, rm, prompts, ids, pairs, **kw, drawn={"sft": control})
    assert len(fresh) == 2 * 3 * 3 and fresh["ref_logprob"].notna().all() and fresh["prompt_gain"].notna().all()
    pd.testing.assert_frame_equal(reused, fresh)  # text, reward, order and the reference log-likelihood


def test_a_killed_evaluation_reads_its_finished_models_back(setup, tmp_path, monkeypatch):
    """Rows kept in the resume dir come back exactly, without sampling; another setting or checkpoint samples."""
    from speedrun.eval import sampling
    tok, gpt, ckpt, rm, prompts, ids, pairs = setup
    kw = dict(seeds=1, samples_per_prompt=2, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=7, device="cpu")
    first = sample_models({"sft": ckpt}, tok, rm, prompts, ids, pairs, **kw, resume=tmp_path, fingerprint="a")
    assert len(list(tmp_path.glob("sft-*.parquet"))) == 1

    def no_sampling(*args, **kwargs):
        raise AssertionError("sampled again")

    monkeypatch.setattr(sampling, "sample_model", no_sampling)
    again = sample_models({"sft": ckpt}, tok, rm, prompts, ids, pairs, **kw, resume=tmp_path, fingerprint="a")
    pd.testing.assert_frame_equal(again, first)
    with pytest.raises(AssertionError, match="sampled again"):  # other settings: a new key
        sample_models({"sft": ckpt}, tok, rm, prompts, ids, pairs, **kw, resume=tmp_path, fingerprint="b")
