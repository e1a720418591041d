"""Stage dedup_prompts: unique prompts with their train/val/eval split -> data/prompts/
{prompts.parquet, pairs.parquet (pairs + prompt_id + split), prompt_id_map.tsv, stats.json}."""
import pyarrow.parquet as pq

from speedrun.common import require_values, write_json, write_parquet, write_table, write_text
from speedrun.data import prompts
from speedrun.stage import run_stage

READS = ("prompts", "corpus.val_frac")
PATHS = {"pairs": "data/pairs/pairs.parquet", "out_dir": "data/prompts"}


def main(p, io) -> None:
    c = p.prompts
    try:
        table = pq.read_table(io.pairs)
    except Exception as e:
        raise RuntimeError(f"cannot read pairs file {io.pairs}: {e}") from e
    require_values(table, ("id", "src", "group", "prompt", "chosen", "rejected"), io.pairs)
    uniq, pairs_out, id_map, stats = prompts.build(table, p.corpus.val_frac, c.eval_frac, c.near_dup_threshold,
                                                   c.shingle_size, str(io.pairs))
    write_parquet(io.out_dir / "prompts.parquet", uniq)
    write_table(io.out_dir / "pairs.parquet", pairs_out)
    write_text(io.out_dir / "prompt_id_map.tsv", id_map.to_csv(sep="\t", index=False, lineterminator="\n"))
    write_json(io.out_dir / "stats.json", stats)
    print(f"prompts: {stats['total_pairs']} pairs -> {stats['unique_prompts_exact']} exact-unique prompts -> "
          f"{stats['unique_prompts']} after {stats['near_dup_merges']} near-dup merges; "
          f"{stats['eval_prompts']} eval / {stats['val_prompts']} val / {stats['train_prompts']} train prompts, "
          f"{stats['groups']} groups")


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
