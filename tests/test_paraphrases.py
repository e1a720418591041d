"""The density embedding's test of meaning: hand-written paraphrases of the task's questions (data/paraphrases.py)
must find a nearest train prompt of their own cluster. The paraphrases keep the rules that make this a test of
meaning: no template word beyond function words and no cluster noun, at least 8 per cluster."""
import pytest

from speedrun.data import task
from speedrun.data.paraphrases import NOUNS, PARAPHRASES, nearest_share, template_words, words
from speedrun.eval.task_report import PARAPHRASE_BAR
from speedrun.params import load
from speedrun.rl.density import word_embeddings
from speedrun.rl.prompts import prompt_embeddings


@pytest.fixture(scope="module")
def train():
    return [i for i in task.items(0.1, 0.25, 70) if i.split == "train"]


def test_paraphrases_use_no_template_word_and_no_cluster_noun():
    assert set(PARAPHRASES) == set(task.TEMPLATES)
    banned = template_words() | NOUNS
    assert {"between", "greater", "after", "even", "month", "letter", "number"} <= banned
    for cluster, texts in PARAPHRASES.items():
        assert len(set(texts)) >= 8, cluster
        for t in texts:
            assert not words(t) & banned, (cluster, t, words(t) & banned)


def test_the_default_task_embedding_places_paraphrases_by_meaning_and_the_lexical_one_does_not(train):
    """Positive: the default task embedding (params.yaml task.density.embedding) puts at least PARAPHRASE_BAR of the
    paraphrases beside a train prompt of their own cluster, over every cluster of the generated task. Negative control
    on the same outcome: the lexical embedding (words), whose only shared words with a paraphrase are function words,
    does not."""
    texts, groups = [i.prompt() for i in train], [i.cluster for i in train]
    paras = [(c, t) for c, ts in PARAPHRASES.items() for t in ts]
    labels = [c for c, _ in paras]
    embedding = load().task.density.embedding
    assert embedding.startswith("minilm")
    e = prompt_embeddings(embedding, None, [], texts + [t for _, t in paras], "cpu")
    share = nearest_share(e[:len(texts)], e[len(texts):], groups, labels)
    assert share >= PARAPHRASE_BAR
    w = word_embeddings(texts + [t for _, t in paras]).to_dense()
    lexical = nearest_share(w[:len(texts)], w[len(texts):], groups, labels)
    assert lexical < PARAPHRASE_BAR and lexical < share
