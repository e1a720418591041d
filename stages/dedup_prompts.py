"""Stage dedup_prompts: unique prompts with their train/val/eval split -> data/prompts/
{prompts.parquet, pairs.parquet (pairs + prompt_id + split), prompt_id_map.tsv, stats.json}."""
import pandas as pd
import pyarrow.parquet as pq

from speedrun.common import UserError, require_values, write_json, write_parquet, write_table, write_text
from speedrun.data import prompts
from speedrun.embeddings import word_embeddings
from speedrun.rl.density import cluster_labels
from speedrun.stage import run_stage

READS = ("prompts", "corpus.val_frac", "seed")
PATHS = {"pairs": "data/pairs/pairs.parquet", "out_dir": "data/prompts"}


def cluster_hub_prompts(df: pd.DataFrame, k: int, seed: int) -> tuple[pd.DataFrame, dict]:
    """The prompts with every hub prompt's group (its source) replaced by its k-means cluster of the words embedding
    of its last user turn ("cluster_00" the largest), and the clusters' sizes and source mix. k 0: left as sources."""
    hub = df["srcs"].map(lambda v: "embedded" not in v).to_numpy()
    if k == 0 or not hub.any():
        return df, {}
    texts = [m[-1]["content"] for m in df.loc[hub, "prompt"]]
    labels = [f"cluster_{c:02d}" for c in cluster_labels(word_embeddings(texts), k, seed)]
    out = df.copy()
    out.loc[hub, "group"] = labels
    mix = pd.crosstab(pd.Series(labels, name="cluster"), df.loc[hub, "group"].to_numpy())
    return out, {c: {"prompts": int(row.sum()), **{str(s): int(v) for s, v in row.items() if v}}
                 for c, row in mix.iterrows()}


def main(p, io) -> None:
    c = p.prompts
    try:
        table = pq.read_table(io.pairs)
    except Exception as e:
        raise UserError(f"cannot read pairs file {io.pairs}: {e}") from e
    require_values(table, ("id", "src", "group", "prompt", "chosen", "rejected"), io.pairs)
    uniq, pairs_out, id_map, stats = prompts.build(table, p.corpus.val_frac, c.eval_frac, c.near_dup_threshold,
                                                   c.shingle_size, str(io.pairs))
    uniq, clusters = cluster_hub_prompts(uniq, c.hub_clusters, p.seed)
    stats["groups"] = int(uniq["group"].nunique())
    if clusters:
        stats["hub_clusters"] = clusters
    write_parquet(io.out_dir / "prompts.parquet", uniq)
    write_table(io.out_dir / "pairs.parquet", pairs_out)
    write_text(io.out_dir / "prompt_id_map.tsv", id_map.to_csv(sep="\t", index=False, lineterminator="\n"))
    write_json(io.out_dir / "stats.json", stats)
    print(f"prompts: {stats['total_pairs']} pairs -> {stats['unique_prompts_exact']} exact-unique prompts -> "
          f"{stats['unique_prompts']} after {stats['near_dup_merges']} near-dup merges; "
          f"{stats['eval_prompts']} eval / {stats['val_prompts']} val / {stats['train_prompts']} train prompts, "
          f"{stats['groups']} groups" + (f" ({len(clusters)} clusters of the hub prompts' words)" if clusters else ""))


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
