import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def set_params(repo: Path, overrides: dict) -> None:
    """Apply dotted-key overrides ("pretrain.steps": 3) to repo/params.yaml."""
    path = repo / "params.yaml"
    params = yaml.safe_load(path.read_text())
    for key, value in overrides.items():
        node = params
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def committed(section: str, **changes):
    """The committed params.yaml's config of `section` (e.g. "pretrain", "adversarial.train"), some fields changed:
    a test states only what it varies."""
    import dataclasses
    from speedrun import params
    return dataclasses.replace(params.value_at(params.load(REPO / "params.yaml"), section), **changes)


def grpo_config(section: str = "grpo.train", **changes):
    """A GRPO config of the committed params for library tests: what a stage sets at run time given neutral values
    (no KL, no entropy bonus, seed 0, fp32, the dynamic decode, no warm-up; adversarial: temperature 1), then
    `changes`."""
    run = {"beta": 0.0, "entropy_bonus": 0.0, "seed": 0, "bf16": False, "decode": "dynamic", "warm_up": False}
    if section == "adversarial.train":
        run |= {"temperature": 1.0}
    return committed(section, **{**run, **changes})


def train_config(**changes):
    """A TrainConfig for library tests: the committed pretrain schedule, no early stopping, no scratch saves."""
    return committed("pretrain", **{"warmup_steps": 10, "patience": 0, "min_delta": 0.0, "save_every": 0, **changes})


def make_pipeline_repo(dest: Path, overrides: dict) -> Path:
    """A fresh git+DVC repo holding the project's files (tracked + untracked, not ignored)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split()
    for f in files:
        if (REPO / f).is_file() and not f.startswith(("reports/", "dvc.lock")):
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, dest / f)
    set_params(dest, overrides)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-qm", "init")
    return dest


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True)


def pythonpath(*dirs: Path) -> str:
    """`dirs` first, then the caller's PYTHONPATH: a hook it carries (bench/suite_without_avx512.py's) reaches the
    stages DVC starts too."""
    return os.pathsep.join([*map(str, dirs), *filter(None, [os.environ.get("PYTHONPATH")])])


def dvc_env(repo: Path, **extra: str) -> dict:
    # one thread per stage, as run_module's stages and torchrun's ranks have: their outputs compare byte for byte
    return dict(os.environ, DVC_SITE_CACHE_DIR=str(repo / ".dvc-site-cache"), DVC_NO_ANALYTICS="1", OMP_NUM_THREADS="1",
                GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t",
                PYTHONPATH=pythonpath(repo / "src"), **extra)


def dvc(repo: Path, *args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, env=dvc_env(repo), capture_output=True,
                         text=True)
    assert res.returncode == 0, f"dvc {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}"
    return res.stdout


import pytest  # noqa: E402


def pytest_collection_modifyitems(items: list) -> None:
    # the DAG tests are most of the suite's time. xdist hands each of its two workers one contiguous half of this
    # list, then lets an idle worker steal from the other's tail: the longest (marked first) leads the first half,
    # the other DAG tests end the list, so they run on the other worker beside it, not after it on the same one
    marked = lambda i: i.get_closest_marker("e2e")  # noqa: E731
    e2e = sorted(filter(marked, items), key=lambda i: not marked(i).kwargs.get("first"))
    rest = [i for i in items if not marked(i)]
    items[:] = e2e[:1] + rest + e2e[1:]


@pytest.fixture(autouse=True)
def exact_shapes():
    """Every test starts with exact shapes (width step 1); a stage run in this process sets its own, reset here."""
    from speedrun.shapes import using_width_step
    with using_width_step(1):
        yield


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    """data/corpus + outs/tokenizer of a few hundred embedded docs, vocab 320: what training tests run on."""
    from speedrun import tokenizer as tok
    from speedrun.common import write_parquet
    from speedrun.data import corpus

    from speedrun.data.docstrings import collect
    root = tmp_path_factory.mktemp("tiny")
    objects, skips = collect()
    frames, _ = corpus.build(corpus.embedded_docs(objects, 0.1, 300), skips)
    for split, df in frames.items():
        write_parquet(root / "corpus" / f"{split}.parquet", df)
    tok.save(tok.train(iter(frames["train"]["text"].tolist()), 320), root / "tokenizer")
    pack_splits(root / "corpus", root / "tokenizer", root / "tokens")
    return root


def pack_splits(corpus_dir: Path, tokenizer_dir: Path, tokens_dir: Path) -> None:
    """data/tokens as the tokenizer stage writes it: both splits packed, meta.json naming the tokenizer."""
    import pandas as pd
    from speedrun import tokenizer as tok
    from speedrun.train import data
    texts = {s: pd.read_parquet(corpus_dir / f"{s}.parquet")["text"].tolist() for s in ("train", "val")}
    data.pack_splits(tokens_dir, texts, tok.load(tokenizer_dir))


@pytest.fixture(scope="session")
def objects_path(tmp_path_factory) -> Path:
    """data/corpus/objects.parquet of this interpreter's stdlib, as the corpus stage writes it."""
    from speedrun.common import write_parquet
    from speedrun.data.docstrings import collect, objects_frame
    path = tmp_path_factory.mktemp("objects") / "objects.parquet"
    write_parquet(path, objects_frame(collect()[0]))
    return path


def sets(*assignments: str) -> list[str]:
    """-S key=value for each assignment: a stage's params overrides on its command line."""
    return [a for s in assignments for a in ("-S", s)]


def call_stage(module: str, *argv: str) -> None:
    """Run stages.<module> in this process, as its command line would (argv: ids, paths, -S overrides)."""
    import importlib
    from speedrun.stage import run_stage
    mod = importlib.import_module(f"stages.{module}")
    run_stage(mod.main, mod.__doc__, mod.READS, mod.PATHS, argv=[str(a) for a in argv])


def run_module(module: str, *args: str, cwd: Path = REPO, timeout: int = 300, env: dict | None = None) -> str:
    res = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    assert res.returncode == 0, f"{module} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


def run_queue(repo: Path, timeout_s: int = 600) -> str:
    """`dvc queue start`, then wait until no experiment is queued or running: the final `dvc queue status`."""
    import time
    dvc(repo, "queue", "start")
    for _ in range(timeout_s):
        status = dvc(repo, "queue", "status")
        if "Queued" not in status and "Running" not in status:
            return status
        time.sleep(1)
    raise AssertionError(f"the queue still runs after {timeout_s} s:\n{status}")
