"""Stage dedup_prompts: unique prompts with a held-out eval split -> data/prompts/
{prompts.parquet, pairs.parquet (pairs + prompt_id + split), prompt_id_map.tsv, stats.json}."""
from pathlib import Path

import pyarrow.parquet as pq
import typer

from speedrun.common import write_json, write_parquet, write_table, write_text
from speedrun.data import prompts
from speedrun.cli import stage_flags


@stage_flags()
def main(pairs: Path, eval_frac: float, near_dup_threshold: float, shingle_size: int, out_dir: Path) -> None:
    if not 0.0 <= eval_frac < 1.0 or not 0.0 < near_dup_threshold <= 1.0 or shingle_size < 1:
        raise typer.BadParameter("need 0 <= --eval-frac < 1, 0 < --near-dup-threshold <= 1, --shingle-size >= 1")
    try:
        table = pq.read_table(pairs)
    except Exception as e:
        raise RuntimeError(f"cannot read pairs file {pairs}: {e}") from e
    uniq, pairs_out, id_map, stats = prompts.build(table, eval_frac, near_dup_threshold, shingle_size)
    write_parquet(out_dir / "prompts.parquet", uniq)
    write_table(out_dir / "pairs.parquet", pairs_out)
    write_text(out_dir / "prompt_id_map.tsv", id_map.to_csv(sep="\t", index=False, lineterminator="\n"))
    write_json(out_dir / "stats.json", stats)
    print(f"prompts: {stats['total_pairs']} pairs -> {stats['unique_prompts_exact']} exact-unique prompts -> "
          f"{stats['unique_prompts']} after {stats['near_dup_merges']} near-dup merges; "
          f"{stats['eval_prompts']} eval / {stats['train_prompts']} train prompts, {stats['groups']} groups")


if __name__ == "__main__":
    typer.run(main)
