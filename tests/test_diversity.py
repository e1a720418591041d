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


def test_word_entropy_and_repetition_by_hand():
    assert dv.entropy_bits([5, 5, 5, 5]) == pytest.approx(2.0) and dv.entropy_bits([7]) == 0.0
    assert dv.entropy_bits([]) == 0.0 and dv.entropy_bits([0, 0]) == 0.0
    assert dv.word_entropy(["a b", "a a"]) == pytest.approx(-(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25)))
    # 4-grams of "a b c d a b c d a": abcd bcda cdab dabc abcd bcda -> 4 distinct of 6
    assert dv.rep_n("a b c d a b c d a".split(), 4) == pytest.approx(1 - 4 / 6)
    assert dv.rep_n("a b c d e".split(), 4) == 0.0 and dv.rep_n(["a"], 4) == 0.0
    toks = [["the", "answer", "is", "x"], ["the", "answer", "is", "y"], ["it", "is"], []]
    assert dv.top_opening_share(toks) == pytest.approx(0.5) and dv.top_opening_share([]) == 0.0


def test_shared_ngrams_count_phrasing_reused_across_prompts_not_echoes_of_one():
    toks = [s.split() for s in ("in short the answer is one", "in short the answer is two", "echo echo echo echo",
                                "echo echo echo echo")]
    # prompts p, q, r, r: "in short the answer", "short the answer is" are said to p and q (2 x 2 of 6 + 6 + 1 + 1);
    # "echo echo echo echo" only to r
    assert dv.shared_ngram_share(toks, ["p", "q", "r", "r"]) == pytest.approx(4 / 8)
    assert dv.shared_ngram_share(toks, ["p", "p", "r", "r"]) == 0.0
    assert dv.shared_ngram_share(toks, ["p", "q", "r", "s"]) == pytest.approx(6 / 8)


def test_across_prompt_distance_by_hand():
    from speedrun.eval.semantic import across_distance
    e = np.eye(3)
    # seed 0 sample 0: prompts a, b, c orthogonal -> distance 1; seed 0 sample 1: a and b the same vector -> 0
    emb = np.stack([e[0], e[1], e[2], e[0], e[0]])
    got = across_distance(emb, ["a", "b", "c", "a", "b"], [0, 0, 0, 0, 0], [0, 0, 0, 1, 1])
    assert got == pytest.approx([1, 1, 1, 0, 0])
    assert across_distance(np.eye(2)[:1], ["a"], [0], [0]) == pytest.approx([0.0])  # a lone row


def test_text_instruments_see_a_model_that_says_one_thing_to_every_prompt():
    """Positive and negative control on the same pools: a model that opens every answer alike, reuses one phrase and
    loops reads worse on every new instrument than one whose answers differ; the same model against itself reads 0."""
    from speedrun.eval.compare import evaluate
    rng, gen = random.Random(0), np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(400)]
    rows = []
    for p in range(6):
        for j in range(4):
            free = " ".join(rng.choice(vocab) for _ in range(12))
            direction = gen.normal(size=16)
            # 8 4-grams, 6 distinct; the 4 holding the drawn word are said to one prompt only
            stuck = f"great question the answer is {free.split()[0]} great question the answer is"
            for m, text in (("stuck", stuck), ("free", free), ("free_copy", free)):
                unit = np.ones(16) / 4 if m == "stuck" else direction / np.linalg.norm(direction)
                rows.append(dict(model=m, prompt_id=f"p{p}", seed=0, sample_idx=j, text=text, reward=0.0,
                                 sentence_embedding=unit))
    res = evaluate(pd.DataFrame(rows), {"stuck": ["stuck"], "free": ["free"], "free_copy": ["free_copy"]},
                   [("stuck", "free"), ("free_copy", "free")], reference=None, n_boot=50)
    stuck, free = res["values"]["stuck"], res["values"]["free"]
    assert stuck["top_opening"] == 100.0 and free["top_opening"] < 10
    assert stuck["shared_4grams"] >= 50 and free["shared_4grams"] == 0.0
    assert stuck["rep_4"] == pytest.approx(25.0) and free["rep_4"] == 0.0
    assert stuck["word_entropy"] < free["word_entropy"]
    assert stuck["across_semantic"] == pytest.approx(0.0) and free["across_semantic"] > 0.5
    same = res["comparisons"][1]["delta"]
    for m in ("top_opening", "shared_4grams", "rep_4", "word_entropy", "across_semantic"):
        assert same[m]["value"] == 0.0 and same[m]["ci_low"] == 0.0 == same[m]["ci_high"]


def test_a_bootstrap_draw_scores_the_new_instruments_as_the_pool_it_stands_for():
    """A draw's cell weights give what the plain functions give on the pool with each cell repeated that often (a
    prompt drawn twice is still one prompt for the shared 4-grams)."""
    from speedrun.eval.pool import Pool
    rng = random.Random(1)
    vocab = ["a", "b", "c", "the", "answer", "is"]
    rows = [dict(prompt_id=f"p{p}", seed=s, sample_idx=j, text=" ".join(rng.choice(vocab) for _ in range(9)))
            for p in range(5) for s in (0, 1) for j in range(3)]
    df = pd.DataFrame(rows).assign(reward=0.0)
    toks = [dv.words(t) for t in df["text"]]
    pool = Pool(df, dv.encode(toks, 4), tic="")
    w_cell = np.asarray([2, 0, 1, 0, 0, 3, 1, 1, 0, 2], dtype=float)
    got = pool.metrics(w_cell, np.arange(4), [10, 10, 10])
    picked = [i for i, c in enumerate(pool.cell) for _ in range(int(w_cell[c]))]
    assert got["top_opening"] == pytest.approx(100 * dv.top_opening_share([toks[i] for i in picked]))
    assert got["shared_4grams"] == pytest.approx(
        100 * dv.shared_ngram_share([toks[i] for i in picked], [df["prompt_id"][i] for i in picked]))
    assert got["rep_4"] == pytest.approx(100 * np.mean([dv.rep_n(toks[i], 4) for i in picked]))
    assert got["word_entropy"] == pytest.approx(dv.word_entropy([df["text"][i] for i in picked]))
