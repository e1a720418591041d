"""Stage corpus: build data/corpus/{train,val}.parquet, objects.parquet (the stdlib object table every embedded
source reads: the only stage that reads the interpreter's files) and stats.json."""
from pathlib import Path
import typer

from speedrun.common import write_json, write_parquet
from speedrun.data import corpus
from speedrun.data.docstrings import collect, objects_frame, objects_stats
from speedrun.params import param_default


def main(
    source: str = typer.Option(param_default("corpus.source"),
                               help="embedded (stdlib docstrings + pydoc topics) or hf"),
    val_frac: float = typer.Option(param_default("corpus.val_frac"),
                                   help="fraction of split units (modules / docs) sent to val"),
    hf_path: str = typer.Option(param_default("corpus.hf_path"),
                                help="hub id, local dir in hub layout, or a .parquet/.jsonl file"),
    hf_name: str = typer.Option(param_default("corpus.hf_name"),
                                help="dataset config name, e.g. sample-10BT ('' = none)"),
    hf_split: str = typer.Option(param_default("corpus.hf_split"), help="split to stream"),
    text_column: str = typer.Option(param_default("corpus.text_column"), help="column holding the document text"),
    max_docs: int = typer.Option(param_default("corpus.max_docs"),
                                 help="documents to read at most (hf: rows streamed; embedded: first N objects)"),
    out_dir: Path = typer.Option(Path("data/corpus"), help="output directory"),
) -> None:
    if source not in ("embedded", "hf"):
        raise typer.BadParameter(f"--source must be embedded or hf, not {source!r}")
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
