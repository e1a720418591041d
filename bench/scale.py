"""Time and peak memory of the pieces that grow with the data, at multiples of the embedded default's size.

    python bench/scale.py --what vocab --scales 1,10,100   # EAD vocabulary of the corpus: lean ids vs tuple sets
    python bench/scale.py --what knn --scales 1,10,100     # density k-NN over the train prompts (words embedding)
    python bench/scale.py --what pack --scales 1,10,100    # the corpus packed into a token file, then read back

vocab: the committed run's corpus train split (data/corpus/train.parquet) copied `scale` times, every word of copy c
suffixed with c, so the distinct n-grams grow linearly with the scale (the worst case: a real corpus grows them
sublinearly); `eval.diversity.ngram_vocab` (word ids, deduplicated int arrays) against the set-of-tuples count it
replaced (`--old`, also timed). knn: the train prompts (data/prompts/prompts.parquet) repeated `scale` times with a
copy marker word, the words embedding (sparse: its size grows with the prompts' words) and `rl.density.knn_distance`
(blocked: memory flat in N beside the embedding, time N^2, so above --knn-max prompts only one block of 1,024 query
rows runs against every row: all of the k-NN's memory, 1/blocks of its time). pack: the same scaled corpus as vocab;
`train.data.write_tokens` (the tokenizer stage's packing, one document at a time to a file) against `--old`, the
stream built in memory as the pack_documents it replaced did (tiktoken's threaded batch encoding of 1,024 documents
at a time, int32 parts, then one concatenation; what pretrain and each adversarial stage did on every rank), then a
pretrain batch read from the memory-mapped file (`read_tokens`, `windows`). vocab's and pack's peak memory is
tracemalloc's (Python and numpy allocations; pack's includes the UTF-8 copy CPython attaches to each non-ASCII input
string when tiktoken reads it, printed beside it: memory of the input, freed with it); knn's is the process's peak
RSS (torch's tensors are not traced), with the embedding's own size beside it. Run from the repository root after
`dvc repro dedup_prompts tokenizer`.
"""
import resource
import shutil
import time
import tracemalloc
from pathlib import Path
from typing import Literal

import pandas as pd
import typer

from speedrun.typer_app import new_app

from speedrun.eval import diversity as dv


def old_vocab(texts: list[str]) -> list[int]:
    """The count ngram_vocab replaced: every n-gram a tuple of str in a set."""
    seen: list[set] = [set(), set(), set()]
    for t in texts:
        w = dv.words(t)
        for n in (1, 2, 3):
            seen[n - 1].update(tuple(w[i:i + n]) for i in range(len(w) - n + 1))
    return [max(len(s), 1) for s in seen]


def measure(fn, *args) -> tuple[object, float, float]:
    tracemalloc.start()
    t0 = time.perf_counter()
    out = fn(*args)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return out, seconds, peak


def bench_vocab(scales: list[int], old: bool) -> None:
    base = pd.read_parquet("data/corpus/train.parquet", columns=["text"])["text"].tolist()
    print(f"corpus train split: {len(base)} docs, {sum(map(len, base)) / 2**20:.1f} MiB of text")
    for s in scales:
        texts = scaled_corpus(base, s)
        got, sec, mib = measure(dv.ngram_vocab, texts)
        line = f"x{s:<4} {len(texts):>8} docs  V = {got}  ngram_vocab {sec:7.1f} s, peak {mib:8.1f} MiB"
        if old:
            want, sec_o, mib_o = measure(old_vocab, texts)
            line += f" | tuple sets {sec_o:7.1f} s, peak {mib_o:8.1f} MiB ({'equal' if want == got else 'DIFFERENT'})"
        print(line, flush=True)


def bench_knn(scales: list[int], k: int, knn_max: int) -> None:
    from speedrun.embeddings import word_embeddings
    from speedrun.rl.density import knn_block, knn_distance

    df = pd.read_parquet("data/prompts/prompts.parquet")
    base = [m[-1]["content"] for m in df.loc[df["split"] == "train", "prompt"]]
    print(f"train prompts: {len(base)}")
    for s in scales:  # ascending: the process's peak RSS after each scale is that scale's
        texts = [f"{t} copy{c}" for c in range(s) for t in base]
        t0 = time.perf_counter()  # not measure(): tracemalloc's own bookkeeping would dominate the peak RSS
        emb = word_embeddings(texts)
        sec_e = time.perf_counter() - t0
        held = sum(t.numel() * t.element_size() for t in (emb.crow_indices(), emb.col_indices(), emb.values()))
        line = (f"x{s:<4} {len(texts):>8} prompts  embedding {sec_e:6.1f} s, {held / 2**20:8.1f} MiB sparse "
                f"({emb.shape[0] * emb.shape[1] * 8 / 2**20:9.1f} MiB it would take dense in fp64)")
        t0 = time.perf_counter()
        if len(texts) <= knn_max:
            knn_distance(emb, k)
            line += f"  knn {time.perf_counter() - t0:7.1f} s"
        else:  # one block of 1,024 query rows against every row: the whole k-NN's memory, 1/blocks of its time
            knn_block(emb, 0, 1024, k)
            blocks = -(-len(texts) // 1024)
            sec = time.perf_counter() - t0
            line += f"  knn one block {sec:6.1f} s (x {blocks} blocks: {sec * blocks / 60:6.1f} min)"
        print(f"{line}, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:8.1f} MiB", flush=True)


def scaled_corpus(base: list[str], s: int) -> list[str]:
    """The corpus `s` times, every word of copy c suffixed with c (distinct words and n-grams grow with the scale)."""
    return base if s == 1 else [" ".join(f"{w}{c}" for w in t.split()) for c in range(s) for t in base]


def bench_pack(scales: list[int], old: bool) -> None:
    import tempfile

    import numpy as np
    import torch

    from speedrun import tokenizer as tokenizer_lib
    from speedrun.common import write_json
    from speedrun.train.data import read_tokens, windows, write_tokens

    tok = tokenizer_lib.load("outs/tokenizer")
    base = pd.read_parquet("data/corpus/train.parquet", columns=["text"])["text"].tolist()
    tmp = Path(tempfile.mkdtemp(prefix="bench_pack_"))
    write_json(tmp / "meta.json", {"tokenizer": tok.digest})
    for s in scales:
        texts = scaled_corpus(base, s)
        # tiktoken reads a str as UTF-8: CPython builds that copy once per non-ASCII string and keeps it on the
        # string (PyUnicode_AsUTF8AndSize), so the input's non-ASCII documents gain it for their lifetime
        utf8 = sum(len(t.encode()) + 1 for t in texts if not t.isascii()) / 2**20
        n, sec, mib = measure(write_tokens, tmp / "train.bin", texts, tok)
        line = (f"x{s:<4} {len(texts):>8} docs {n:>12,} tokens  write_tokens {sec:6.1f} s, peak {mib:6.1f} MiB "
                f"(the input's UTF-8 copies {utf8:5.1f}), file {(tmp / 'train.bin').stat().st_size / 2**20:6.1f} MiB")

        def batch() -> torch.Tensor:  # what a pretrain step reads: 16 random windows of 256
            win = windows(read_tokens(tmp / "train.bin", tok.digest), 256)
            return win[torch.randint(len(win), (16,))].long()
        _, sec_r, mib_r = measure(batch)
        line += f" | read a batch {sec_r * 1e3:6.1f} ms, peak {mib_r:6.1f} MiB"
        if old:
            def in_memory() -> np.ndarray:  # pack_documents as it was, in numpy (tracemalloc sees numpy, not torch)
                parts = [np.asarray([tok.bos_id, *d], dtype=np.int32)
                         for i in range(0, len(texts), 1024)
                         for d in tok.enc.encode_ordinary_batch(texts[i:i + 1024], num_threads=2)]
                return np.concatenate(parts)
            got, sec_o, mib_o = measure(in_memory)
            same = np.array_equal(got, np.fromfile(tmp / "train.bin", dtype=np.int32))
            line += f" | in memory {sec_o:7.1f} s, peak {mib_o:8.1f} MiB ({'equal' if same else 'DIFFERENT'})"
        print(line, flush=True)
    shutil.rmtree(tmp)


app = new_app()


@app.command(help=__doc__)
def main(what: Literal["vocab", "knn", "pack"] = typer.Option("vocab"),
         scales: str = typer.Option("1,10,100", help="comma-separated multiples of the embedded size"),
         old: bool = typer.Option(True, "--old/--no-old", help="vocab, pack: also time what it replaced (tuple sets; "
                                  "the stream built in memory)"),
         k: int = typer.Option(20, help="knn: neighbours (params.yaml grpo.density.k)"),
         knn_max: int = typer.Option(60_000, help="knn: time the k-NN only up to this many prompts (its time grows "
                                     "as N^2)")) -> None:
    sizes = [int(x) for x in scales.split(",")]
    if what == "knn":
        bench_knn(sizes, k, knn_max)
    else:
        (bench_vocab if what == "vocab" else bench_pack)(sizes, old)


if __name__ == "__main__":
    app()
