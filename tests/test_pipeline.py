"""End to end: the real DVC DAG in a fresh repo on micro params."""
import json

from conftest import dvc, make_pipeline_repo, set_params

MICRO = {"corpus.max_docs": 600, "tokenizer.vocab_size": 512}


def test_tokenizer_stages_cache_and_rerun(tmp_path):
    repo = make_pipeline_repo(tmp_path, MICRO)
    out = dvc(repo, "repro", "tokenizer")
    assert "Running stage 'corpus'" in out and "Running stage 'tokenizer'" in out
    metrics = json.loads((repo / "reports/metrics/tokenizer.json").read_text())
    assert metrics["vocab_size"] == 512 and metrics["val_chars_per_token"] > 1.5
    assert "Running stage" not in dvc(repo, "repro", "tokenizer")  # nothing stale: nothing runs

    set_params(repo, {"tokenizer.vocab_size": 600})
    out = dvc(repo, "repro", "tokenizer")
    assert "Running stage 'tokenizer'" in out and "Running stage 'corpus'" not in out
