"""Stage task_data: the task track's items (clusters of very uneven size, split train / val / eval by a stable hash)
and its preference pairs (a right answer over a wrong one, train and val items only) -> data/task/."""
import pandas as pd

from speedrun.common import write_json, write_parquet
from speedrun.data import task
from speedrun.stage import run_stage

READS = ("seed", "task.val_frac", "task.eval_frac", "task.pairs_per_item")
PATHS = {"items": "data/task/items.parquet", "pairs": "data/task/pairs.parquet", "stats": "data/task/stats.json"}


def main(p, io) -> None:
    c = p.task
    items = task.items(c.val_frac, c.eval_frac)
    pairs = task.pairs(items, c.pairs_per_item, p.seed)
    sizes = {s: task.cluster_sizes(items, s) for s in ("train", "val", "eval")}
    train = sizes["train"]
    stats = {"items": len(items), "clusters": sizes, "largest_to_smallest_train": round(
        max(train.values()) / min(train.values()), 2), "pairs": len(pairs)}
    write_parquet(io.items, task.items_frame(items))
    write_parquet(io.pairs, pd.DataFrame(pairs, columns=["id", "prompt_id", "split", "src", "src_split", "prompt",
                                                         "chosen", "rejected", "group", "negative"]))
    write_json(io.stats, stats)
    print(f"task_data: {len(items)} items, per split and cluster {sizes} (train: largest cluster "
          f"{stats['largest_to_smallest_train']}x the smallest), {len(pairs)} preference pairs")


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
