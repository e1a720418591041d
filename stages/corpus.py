"""Stage corpus: build data/corpus/{train,val}.parquet, objects.parquet (the stdlib object table every embedded
source reads: the only stage that reads the interpreter's files) and stats.json; keeps the interpreter pin
(data/interpreter.json, speedrun.data.stdlib) true to the stdlib it read."""
from pathlib import Path
import typer

from speedrun.common import read_json, write_json, write_parquet
from speedrun.data import corpus
from speedrun.data.docstrings import collect, objects_frame, objects_stats
from speedrun.data.stdlib import pin_interpreter
from speedrun.cli import stage_flags


@stage_flags()
def main(source: str, val_frac: float, hf_path: str, hf_name: str, hf_split: str, text_column: str, max_docs: int,
         interpreter: Path, out_dir: Path) -> None:
    if source not in ("embedded", "hf"):
        raise typer.BadParameter(f"--source must be embedded or hf, not {source!r}")
    old_pin = pin_interpreter(interpreter)
    if old_pin is not None:
        print(f"corpus: {interpreter} pinned {old_pin or 'nothing'}; this run reads another stdlib, so it now pins "
              f"{read_json(interpreter)} (commit it with dvc.lock)")
    objects, file_skips = collect()  # the embedded SFT and pair sources need them whatever the corpus source
    if source == "embedded":
        docs = corpus.embedded_docs(objects, val_frac, max_docs)
    else:
        docs, file_skips = corpus.hf_docs(hf_path, hf_name or None, hf_split, text_column, max_docs, val_frac), None
    frames, stats = corpus.build(docs, file_skips)
    stats["source"] = source
    stats["read"] = objects_stats(objects)
    write_parquet(out_dir / "objects.parquet", objects_frame(objects))
    for split, df in frames.items():
        write_parquet(out_dir / f"{split}.parquet", df)
    write_json(out_dir / "stats.json", stats)
    print(f"corpus: {stats['kept']} docs kept of {stats['docs_in']} (skipped {stats['skipped']}); "
          + ", ".join(f"{s} {v['docs']} docs / {v['chars'] / 1e6:.2f} MB" for s, v in stats["splits"].items()))


if __name__ == "__main__":
    typer.run(main)
