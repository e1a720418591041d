"""Each diversity metric pinned on examples computed by hand."""
import math
import random

import numpy as np
import pandas as pd
import pytest

from speedrun.eval import diversity as dv


def test_words_lowercase_regex():
    assert dv.words("The cat's `json.dumps`—fast!") == ["the", "cat", "s", "json", "dumps", "fast"]


def test_gini_uniform_zero_and_concentrated():
    assert dv.gini([3, 3, 3, 3]) == 0.0
    for n in (2, 4, 10):
        assert dv.gini([0] * (n - 1) + [7]) == pytest.approx((n - 1) / n)
    # sorted [1, 2, 3]: ((2-4)*1 + (4-4)*2 + (6-4)*3) / (3 * 6) = 4/18
    assert dv.gini([3, 1, 2]) == pytest.approx(4 / 18)
    assert dv.gini([]) == 0.0 and dv.gini([0, 0]) == 0.0
    with pytest.raises(ValueError):
        dv.gini([1, -1])


def test_gini_never_negative():
    rng = np.random.default_rng(0)
    for _ in range(200):
        assert dv.gini(rng.integers(0, 50, size=rng.integers(1, 30))) >= 0.0


def test_word_gini():
    assert dv.word_gini(["a b c", "c b a"]) == 0.0  # every word twice
    # counts {a: 3, b: 1} -> sorted [1, 3]: (-1*1 + 1*3) / (2 * 4)
    assert dv.word_gini(["A a", "a B"]) == pytest.approx(0.25)
    assert dv.word_gini([]) == 0.0


def test_distinct_n_known_text():
    text = ["the cat sat on the mat"]
    assert dv.distinct_n(text, 1) == pytest.approx(5 / 6)
    assert dv.distinct_n(text, 2) == 1.0
    # n-grams do not cross texts: bigrams ab ba ab | ab -> 2 unique of 4
    texts = ["a b a b", "a b"]
    assert dv.distinct_n(texts, 1) == pytest.approx(2 / 6)
    assert dv.distinct_n(texts, 2) == pytest.approx(2 / 4)
    assert dv.distinct_n(texts, 3) == 1.0
    assert dv.distinct_n(["one"], 2) == 0.0 and dv.distinct_n([], 1) == 0.0


def test_ead():
    # unique 5, total 6, V = 10: 5 / (10 * (1 - 0.9**6))
    assert dv.ead_n(["the cat sat on the mat"], 1, 10) == pytest.approx(5 / (10 * (1 - 0.9**6)))
    assert dv.ead_n(["the cat sat on the mat"], 1, 10) == pytest.approx(1.0671015, abs=1e-6)
    # V = 1: one possible type, expected distinct is 1 whatever the count
    assert dv.ead_n(["x x x x"], 1, 1) == 1.0
    assert dv.ead_n([""], 1, 10) == 0.0
    # huge V: the expectation is ~C, so EAD ~ distinct-n
    assert dv.ead_n(["a b a c"], 1, 10**12) == pytest.approx(3 / 4, rel=1e-6)
    with pytest.raises(ValueError):
        dv.ead_n(["a"], 1, 0)


def test_em_dash_rate():
    # 2 dashes (one em, one en; the hyphen does not count) in 10 characters -> 200 per 1,000
    assert dv.em_dash_rate(["a\u2014b\u2013c", "x-yzw"]) == pytest.approx(200.0)
    assert dv.em_dash_rate(["plain"]) == 0.0 and dv.em_dash_rate([]) == 0.0


def test_not_just_but_count():
    hits = ["It is not just fast but also safe.",
            "Not only X, but Y!",
            "This isn't merely a test but a proof.",
            "`json.dumps` is not simply a function but a tool."]  # a dot inside a name ends no sentence
    misses = ["It is not just fast. But it is safe.",  # across a sentence boundary
              "not only this\nbut that",
              "It is not just fast.",
              "nothing but trouble, not justified but fine"]
    for t in hits:
        assert dv.not_just_but_count([t]) == 1, t
    for t in misses:
        assert dv.not_just_but_count([t]) == 0, t
    assert dv.not_just_but_count(["not just a but b, and not only c but also d.", hits[0]]) == 3


def test_sentence_count():
    assert dv.sentence_count("One. Two! Three? `json.dumps` is four") == 4
    assert dv.sentence_count("line one\nline two\n\n") == 2
    assert dv.sentence_count("  ...  ") == 0


def test_bleu_by_hand():
    hyp, ref = "the cat sat on the mat".split(), "the cat is on the mat".split()
    # p1 = 5/6, p2 = 3/5 (the cat, on the, the mat), p3 = 1/4 (on the mat), p4 = 0/3 -> 0.1/3; BP = 1
    expected = (5 / 6 * 3 / 5 * 1 / 4 * (0.1 / 3)) ** 0.25
    assert dv.bleu(hyp, [ref]) == pytest.approx(expected, abs=1e-12)
    assert dv.bleu(hyp, [ref]) == pytest.approx(0.25406637407730737, abs=1e-12)  # nltk 3.10.4, method1
    # short hypothesis: p1 = p2 = 1, p3 = p4 = 0.1/1, BP = exp(1 - 6/2)
    short = dv.bleu("the cat".split(), [hyp])
    assert short == pytest.approx(math.exp(-2) * 0.1**0.5, abs=1e-12)
    assert short == pytest.approx(0.04279677428117006, abs=1e-12)  # nltk
    # closest reference length: 4 and 8 are both 2 away from 6, the shorter wins -> BP = 1
    assert dv.bleu("a b c d e f".split(), ["a b c d".split(), "a b c d e f g h".split()]) == pytest.approx(1.0)
    assert dv.bleu([], [ref]) == 0.0 and dv.bleu(["zzz"], [ref]) == 0.0
    # clipping: "the the the" matches "the" at most twice; BP = exp(1 - 6/3)
    assert dv.bleu("the the the".split(), [ref], n=1) == pytest.approx(2 / 3 * math.exp(-1))


def test_self_bleu_identical_is_one():
    assert dv.self_bleu(["a b c d e"] * 3) == pytest.approx(1.0)
    assert dv.self_bleu(["a b c d e", "v w x y z"]) == 0.0
    with pytest.raises(ValueError):
        dv.self_bleu(["only one"])


def test_self_bleu_matches_reference_bleu():
    rng = random.Random(0)
    vocab = "the a cat dog sat on mat ran json dumps returns object".split()
    for _ in range(50):
        texts = [" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 10))) for _ in range(rng.randint(2, 6))]
        toks = [dv.words(t) for t in texts]
        ref = np.mean([dv.bleu(h, toks[:i] + toks[i + 1:]) for i, h in enumerate(toks)])
        assert dv.self_bleu(texts) == pytest.approx(ref, abs=1e-12)


def test_self_bleu_subset_select():
    texts = ["a b c d e", "a b c d e", "p q r s t", "p q r s t x"]
    enc = dv.encode([dv.words(t) for t in texts], 4)
    scores = dv.self_bleu_scores(enc, np.array([0, 1]))
    assert scores == pytest.approx([1.0, 1.0])
    assert dv.self_bleu_scores(enc, np.array([0, 2])) == pytest.approx([0.0, 0.0])


def test_vendi_counts_effectively_distinct_items():
    from speedrun.eval.diversity import vendi
    assert vendi(np.ones((4, 3))) == pytest.approx(1.0)  # all alike
    assert vendi(np.eye(4)) == pytest.approx(4.0)  # mutually orthogonal
    assert vendi(np.array([[1.0, 0], [2.0, 0], [0, 3.0], [0, 1.0]])) == pytest.approx(2.0)  # two pairs; scale-free
    assert 1.0 < vendi(np.array([[1.0, 0.0], [1.0, 0.3]])) < 2.0


def test_vendi_and_sentence_distance_within_prompt_in_the_evaluation():
    """With an embedding per response the evaluation scores each prompt's responses (Vendi within prompt): a model
    whose responses share one vector scores 1, one whose responses point apart scores the prompt's sample count. With
    a sentence encoder's unit vector per response, the mean pairwise cosine distance: 0 alike, 1 orthogonal."""
    from speedrun.eval.compare import evaluate
    rows = [dict(model=m, prompt_id=f"p{p}", seed=0, sample_idx=j, text=f"text {p} {j}", reward=0.0,
                 embedding=np.ones(4) if m == "same" else np.eye(4)[j],
                 sentence_embedding=np.ones(4) / 2 if m == "same" else np.eye(4)[j])
            for m in ("same", "apart") for p in range(3) for j in range(4)]
    res = evaluate(pd.DataFrame(rows), {"same": ["same"], "apart": ["apart"]}, reference=None, n_boot=5)
    assert res["values"]["same"]["within_vendi"] == pytest.approx(1.0)
    assert res["values"]["apart"]["within_vendi"] == pytest.approx(4.0)
    assert res["values"]["same"]["within_semantic"] == pytest.approx(0.0)
    assert res["values"]["apart"]["within_semantic"] == pytest.approx(1.0)
    plain = evaluate(pd.DataFrame(rows).drop(columns=["embedding", "sentence_embedding"]), {"same": ["same"]}, [],
                     reference=None, n_boot=5)
    assert not {"within_vendi", "within_semantic"} & set(plain["values"]["same"])  # no embeddings, no score


def test_ngram_vocab_equals_counting_tuples_in_sets(monkeypatch):
    """The lean count (int ids, deduplicated packed keys merged in chunks, rows once ids outgrow a key) gives the
    sets' exact sizes."""
    from speedrun.data.docstrings import collect
    texts = [o.text for o in collect()[0][:400]] + ["", "one", "a b", "a b a b c"]
    seen = [set(), set(), set()]
    for t in texts:
        w = dv.words(t)
        for n in (1, 2, 3):
            seen[n - 1].update(tuple(w[i:i + n]) for i in range(len(w) - n + 1))
    want = [len(s) for s in seen]
    assert dv.ngram_vocab(texts) == want == dv.ngram_vocab(iter(texts), chunk_rows=97)  # many merges
    assert dv.ngram_vocab([]) == [1, 1, 1]
    monkeypatch.setattr(dv, "BITS", 8)  # word ids outgrow a key after 256 words: the rest counted as rows
    assert dv.ngram_vocab(texts, chunk_rows=97) == want
