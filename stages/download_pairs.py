"""Stage download_pairs: preference pairs from every source -> data/pairs/{pairs.parquet,stats.json}.

Real data (needs the hub):  python -m stages.download_pairs --limit-per-source 20000
                            (same as --only hh,uf,se,embedded; a local mirror dir works for --hh-path etc.)
Offline / CI default:       python -m stages.download_pairs --only embedded"""
from pathlib import Path
from typing import Optional

import typer

from speedrun.common import write_json
from speedrun.data import pairs, pairs_embedded, pairs_hh, pairs_se, pairs_uf
from speedrun.data.docstrings import load_objects
from speedrun.cli import stage_flags


@stage_flags(hh_path=pairs_hh.HUB_ID, uf_path=pairs_uf.HUB_ID, se_path=pairs_se.HUB_ID)
def main(only: Optional[str], no_hh: bool, no_uf: bool, no_se: bool, no_embedded: bool, limit_per_source: int,
         hh_path: str, uf_path: str, se_path: str, se_data_dir: Optional[str], se_max_pairs_per_question: int,
         embedded_hard_frac: float, embedded_negatives: int, val_frac: float, objects: Path, out_dir: Path) -> None:
    disabled = {"hh": no_hh, "uf": no_uf, "se": no_se, "embedded": no_embedded}
    wanted = [s.strip() for s in only.split(",")] if only else list(pairs.SOURCES)
    for s in wanted:
        if s not in pairs.SOURCES:
            raise typer.BadParameter(f"--only takes {', '.join(pairs.SOURCES)}, not {s!r}")
        if only and disabled[s]:
            raise typer.BadParameter(f"--only {s} contradicts --no-{s}")
    chosen = [s for s in pairs.SOURCES if s in wanted and not disabled[s]]  # fixed order: hh, uf, se, embedded
    if not chosen:
        raise typer.BadParameter("every source is disabled")
    if se_max_pairs_per_question < 1 or embedded_negatives < 1 or not 0.0 <= embedded_hard_frac <= 1.0:
        raise typer.BadParameter("--se-max-pairs-per-question and --embedded-negatives must be >= 1 "
                                 "and --embedded-hard-frac in [0, 1]")
    make = {
        "hh": lambda: pairs_hh.source(hh_path),
        "uf": lambda: pairs_uf.source(uf_path),
        "se": lambda: pairs_se.source(se_path, se_max_pairs_per_question, se_data_dir),
        "embedded": lambda: pairs_embedded.source(load_objects(objects), embedded_hard_frac, val_frac,
                                                  negatives=embedded_negatives),
    }
    stats = pairs.build({s: make[s]() for s in chosen}, out_dir / "pairs.parquet", limit_per_source)
    stats["limit_per_source"] = limit_per_source
    write_json(out_dir / "stats.json", stats)
    for name, s in stats["sources"].items():
        print(f"pairs {name}: {s['pairs_kept']} kept from {s['rows_read']} rows "
              f"(+{s['extra_pairs']} extra pairs, {sum(s['skipped'].values())} skipped: {s['skipped']})")
    print(f"pairs: {stats['total_pairs']} written to {out_dir / 'pairs.parquet'}")


if __name__ == "__main__":
    typer.run(main)
