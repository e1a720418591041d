"""Stage tokenizer: train a byte-level BPE on the corpus train split, pack both splits into token files once (what
pretrain and the adversarial stages read), report chars/token on val."""
import time

import pandas as pd

from speedrun import tokenizer as tok
from speedrun.common import write_json
from speedrun.stage import run_stage
from speedrun.train.data import pack_splits

READS = ("tokenizer",)
PATHS = {"corpus_dir": "data/corpus", "out_dir": "outs/tokenizer", "tokens_dir": "data/tokens",
         "metrics": "reports/metrics/tokenizer.json"}


def main(p, io) -> None:
    train_texts = pd.read_parquet(io.corpus_dir / "train.parquet")["text"].tolist()
    val_texts = pd.read_parquet(io.corpus_dir / "val.parquet")["text"].tolist()

    def capped():
        n = 0
        for t in train_texts:
            if n >= p.tokenizer.max_chars:
                return
            n += len(t)
            yield t

    t0 = time.perf_counter()
    enc = tok.train(capped(), p.tokenizer.vocab_size)
    seconds = time.perf_counter() - t0
    tok.save(enc, io.out_dir)
    t = tok.load(io.out_dir)
    t0 = time.perf_counter()
    counts = pack_splits(io.tokens_dir, {"train": train_texts, "val": val_texts}, t)
    n_tokens = counts["val"] - len(val_texts)  # each document's <|bos|> is not text
    n_chars = sum(len(s) for s in val_texts)
    m = {"vocab_size": t.vocab_size, "val_chars_per_token": round(n_chars / max(n_tokens, 1), 4),
         "train_seconds": round(seconds, 2), "tokens": counts, "pack_seconds": round(time.perf_counter() - t0, 2)}
    write_json(io.metrics, m)
    print(f"tokenizer: vocab {m['vocab_size']}, {m['val_chars_per_token']:.2f} chars/token on val, "
          f"trained in {seconds:.1f}s; {counts['train']:,} train / {counts['val']:,} val tokens packed in "
          f"{io.tokens_dir}")


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
