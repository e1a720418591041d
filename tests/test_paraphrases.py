"""The density embedding's test of meaning: hand-written paraphrases of the task's questions (data/paraphrases.py)
must find a nearest train prompt of their own cluster. The paraphrases keep the rules that make this a test of
meaning: no template word (or a form of one) beyond function words and no cluster noun, at least 8 per cluster."""
import json
from pathlib import Path

import pytest
import torch

from speedrun.data import task
from speedrun.data.paraphrases import HELD_OUT, NOUNS, PARAPHRASES, leaks, nearest_share, template_words, words
from speedrun.eval.task_report import PARAPHRASE_BAR
from speedrun.params import load
from speedrun.embeddings import prompt_embeddings


@pytest.fixture(scope="module")
def train():
    return [i for i in task.items(0.1, 0.25, 70) if i.split == "train"]


def test_paraphrases_use_no_template_word_and_no_cluster_noun():
    assert set(PARAPHRASES) == set(HELD_OUT) == set(task.TEMPLATES)
    banned = template_words() | NOUNS
    assert {"between", "greater", "after", "even", "month", "letter", "number"} <= banned
    assert leaks("named", banned) and leaks("falling", banned) and not leaks("sitting", banned)  # forms of a word
    for cluster in PARAPHRASES:
        assert not set(PARAPHRASES[cluster]) & set(HELD_OUT[cluster]), cluster  # the held-out set is new text
        for texts in (PARAPHRASES[cluster], HELD_OUT[cluster]):
            assert len(set(texts)) >= 8, cluster
            for t in texts:
                assert not [w for w in words(t) if leaks(w, banned)], (cluster, t)


@pytest.mark.slow
def test_the_default_embedding_places_paraphrases_better_than_the_lexical_one_and_the_run_reports_it(train):
    """Over the four clusters the default task embedding (params.yaml task.density.embedding) puts the paraphrases
    beside their own cluster's train prompts more often than the lexical embedding (words), whose only shared words
    with them are function words (positive and negative control on one outcome), on the set it was chosen on and on
    the held-out set written before any embedding saw it (HELD_OUT: 0.72 against 0.38; on the chosen-on set 0.81, an
    optimistic figure). Letters and months paraphrases keep their operands (backticked letters, month names), so they
    are the easy part; on the clusters GRPO trains on no embedding at hand reaches the 0.8 bar (default: 0.62 chosen-on,
    0.54 held out, chance 0.50; docs/LOG.md 2026-11-30). The default run's `paraphrase_purity` is that share on the
    chosen-on set, recomputed here; reports/task.md reads it against the bar."""
    p = load()
    assert p.task.density.embedding == "minilm_kind"

    def share(items, clusters, embedding, paraphrases=PARAPHRASES):
        texts, groups = [i.prompt() for i in items], [i.cluster for i in items]
        paras = [(c, t) for c, ts in paraphrases.items() if c in clusters for t in ts]
        e = prompt_embeddings(embedding, None, [], texts + [t for _, t in paras], "cpu")
        e = e.to_dense() if e.layout == torch.sparse_csr else e
        return nearest_share(e[:len(texts)], e[len(texts):], groups, [c for c, _ in paras])

    for paraphrases in (PARAPHRASES, HELD_OUT):
        meaning = share(train, set(paraphrases), "minilm_kind", paraphrases)
        assert meaning > share(train, set(paraphrases), "words", paraphrases) + 0.25, meaning
    assert share(train, set(HELD_OUT), "minilm_kind", HELD_OUT) < PARAPHRASE_BAR  # the bar unmet, as the LOG says
    trained = [i for i in train if i.cluster in p.task.train_clusters]
    committed = json.loads((Path(__file__).resolve().parents[1] / "reports/metrics/task_grpo/density_s1.json")
                           .read_text())["paraphrase_purity"]
    assert share(trained, set(p.task.train_clusters), "minilm_kind") == pytest.approx(committed, abs=1e-4)
