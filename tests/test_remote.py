"""A run moves between machines through a DVC remote: push from one clone, pull into another, no stage reruns."""
import hashlib
import subprocess
import pytest

from conftest import dvc, git, make_pipeline_repo

MICRO = {"corpus.max_docs": 300, "tokenizer.vocab_size": 400}
ARTIFACTS = ["data/corpus/train.parquet", "data/corpus/objects.parquet", "outs/tokenizer/tokenizer.json"]


def digests(repo):
    return {a: hashlib.sha256((repo / a).read_bytes()).hexdigest() for a in ARTIFACTS}


@pytest.mark.slow
def test_push_from_one_clone_pull_into_another(tmp_path):
    (tmp_path / "node").mkdir()
    node = make_pipeline_repo(tmp_path / "node", MICRO)
    dvc(node, "repro", "tokenizer")
    dvc(node, "remote", "add", "-d", "storage", str(tmp_path / "remote"))
    git(node, "add", "-A")
    git(node, "commit", "-qm", "run")
    dvc(node, "push", "preflight", "corpus", "tokenizer")

    subprocess.run(["git", "clone", "-q", str(node), str(tmp_path / "laptop")], check=True)
    laptop = tmp_path / "laptop"
    assert not (laptop / "outs/tokenizer").exists()
    dvc(laptop, "pull", "preflight", "corpus", "tokenizer")  # the stages this run made
    assert digests(laptop) == digests(node)
    assert dvc(laptop, "status", "tokenizer").strip() == "Data and pipelines are up to date."
