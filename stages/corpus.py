"""Stage corpus: build data/corpus/{train,val}.parquet, objects.parquet (the stdlib object table every embedded
source reads: the only stage that reads the interpreter's files) and stats.json; keeps the interpreter pin
(data/interpreter.json, speedrun.data.stdlib) true to the stdlib it read; and ngram_vocab.json, the EAD vocabulary size
of the train split that every evaluation reads."""
from speedrun.common import read_json, write_json, write_parquet
from speedrun.data import corpus
from speedrun.data.docstrings import collect, objects_frame, objects_stats
from speedrun.data.stdlib import pin_interpreter
from speedrun.eval.diversity import ngram_vocab
from speedrun.stage import run_stage

READS = ("seed", "corpus")
PATHS = {"interpreter": "data/interpreter.json", "out_dir": "data/corpus"}


def main(p, io) -> None:
    c = p.corpus
    old_pin = pin_interpreter(io.interpreter)
    if old_pin is not None:
        print(f"corpus: {io.interpreter} pinned {old_pin or 'nothing'}; this run reads another stdlib, so it now pins "
              f"{read_json(io.interpreter)} (commit it with dvc.lock)")
    objects, file_skips = collect()  # the embedded SFT and pair sources need them whatever the corpus source
    if c.source == "embedded":
        docs = corpus.embedded_docs(objects, c.val_frac, c.max_docs)
    else:
        docs, file_skips = corpus.hf_docs(c.hf_path, c.hf_name or None, c.hf_split, c.text_column, c.max_docs,
                                          c.val_frac, p.seed, c.hf_shuffle_buffer), None
    frames, stats = corpus.build(docs, file_skips)
    stats["source"] = c.source
    stats["read"] = objects_stats(objects)
    write_parquet(io.out_dir / "objects.parquet", objects_frame(objects))
    for split, df in frames.items():
        write_parquet(io.out_dir / f"{split}.parquet", df)
    write_json(io.out_dir / "stats.json", stats)
    # EAD's fixed V (distinct word 1-3-grams of the train split), counted once per corpus for every evaluation
    write_json(io.out_dir / "ngram_vocab.json", {"n": [1, 2, 3], "distinct": ngram_vocab(frames["train"]["text"])})
    print(f"corpus: {stats['kept']} docs kept of {stats['docs_in']} (skipped {stats['skipped']}); "
          + ", ".join(f"{s} {v['docs']} docs / {v['chars'] / 1e6:.2f} MB" for s, v in stats["splits"].items()))


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
