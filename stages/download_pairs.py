"""Stage download_pairs: preference pairs from every source in pairs.only -> data/pairs/{pairs.parquet,stats.json}.

Real data (needs the hub):  python -m stages.download_pairs -S 'pairs.only=[hh,uf,se,embedded]'
                            -S pairs.limit_per_source=20000 (a local mirror dir works for pairs.hh_path etc.)"""
from speedrun.common import write_json
from speedrun.data import pairs, pairs_embedded, pairs_hh, pairs_se, pairs_uf
from speedrun.data.docstrings import load_objects
from speedrun.stage import run_stage

READS = ("pairs", "corpus.val_frac", "prompts.eval_frac")
PATHS = {"objects": "data/corpus/objects.parquet", "out_dir": "data/pairs"}


def main(p, io) -> None:
    c = p.pairs
    wanted = c.only  # a list of known sources: checked at load (speedrun.params)
    make = {
        "hh": lambda: pairs_hh.source(c.hh_path),
        "uf": lambda: pairs_uf.source(c.uf_path),
        "se": lambda: pairs_se.source(c.se_path, c.se_max_pairs_per_question, c.se_data_dir or None),
        "embedded": lambda: pairs_embedded.source(load_objects(io.objects), c.embedded_hard_frac,
                                                  p.corpus.val_frac, p.prompts.eval_frac,
                                                  negatives=c.embedded_negatives, echo=c.embedded_echo,
                                                  probes=c.embedded_probes),
    }
    chosen = [s for s in pairs.SOURCES if s in wanted]  # fixed order: hh, uf, se, embedded
    stats = pairs.build({s: make[s]() for s in chosen}, io.out_dir / "pairs.parquet", c.limit_per_source)
    stats["limit_per_source"] = c.limit_per_source
    write_json(io.out_dir / "stats.json", stats)
    for name, s in stats["sources"].items():
        print(f"pairs {name}: {s['pairs_kept']} kept from {s['rows_read']} rows "
              f"(+{s['extra_pairs']} extra pairs, {sum(s['skipped'].values())} skipped: {s['skipped']})")
    print(f"pairs: {stats['total_pairs']} written to {io.out_dir / 'pairs.parquet'}")


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
