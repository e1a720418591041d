"""Stage task_data: the task track's items (clusters of very uneven size, split train / val / eval by a stable hash;
or GSM8K's word problems, task.source gsm8k) and its preference pairs (a right answer over a wrong one, train and
val items only) -> data/task/."""
import pandas as pd

from speedrun.common import write_json, write_parquet
from speedrun.data import gsm8k, task
from speedrun.embeddings import word_embeddings
from speedrun.rl.density import cluster_labels
from speedrun.stage import run_stage

READS = ("seed", "task.source", "task.hf_path", "task.hf_name", "task.max_items", "task.hf_clusters", "task.val_frac",
         "task.eval_frac", "task.number_max", "task.pairs_per_item")
PATHS = {"items": "data/task/items.parquet", "pairs": "data/task/pairs.parquet", "stats": "data/task/stats.json"}


def gsm8k_items(c, seed: int) -> tuple[list[task.TaskItem], dict[str, int]]:
    """GSM8K's word problems as task items, grouped by k-means clusters of their question's words."""
    rows, skipped = gsm8k.read(c.hf_path, c.hf_name or None, c.val_frac, c.max_items, seed)
    for split in ("train", "eval"):
        if not any(r["split"] == split for r in rows):
            raise ValueError(f"{c.hf_path} ({c.hf_name}): no usable {split} item (skipped: {skipped})")
    labels = cluster_labels(word_embeddings([r["question"] for r in rows]), c.hf_clusters, seed)
    return [task.TaskItem(r["item_id"], f"cluster_{lab:02d}", "", "", (r["answer"],), r["split"], r["question"],
                          r["solution"]) for r, lab in zip(rows, labels)], skipped


def main(p, io) -> None:
    c = p.task
    if c.source == "gsm8k":
        items, skipped = gsm8k_items(c, p.seed)
    else:
        items, skipped = task.items(c.val_frac, c.eval_frac, c.number_max), None
    pairs = task.pairs(items, c.pairs_per_item, p.seed)
    sizes = {s: task.cluster_sizes(items, s) for s in ("train", "val", "eval")}
    train = sizes["train"]
    stats = {"items": len(items), "clusters": sizes, "largest_to_smallest_train": round(
        max(train.values()) / max(min(train.values()), 1), 2), "pairs": len(pairs)}
    if skipped is not None:
        stats.update(source=c.source, skipped=skipped)
    write_parquet(io.items, task.items_frame(items))
    write_parquet(io.pairs, pd.DataFrame(pairs, columns=["id", "prompt_id", "split", "src", "src_split", "prompt",
                                                         "chosen", "rejected", "group", "negative"]))
    write_json(io.stats, stats)
    print(f"task_data: {len(items)} items, per split and cluster {sizes} (train: largest cluster "
          f"{stats['largest_to_smallest_train']}x the smallest), {len(pairs)} preference pairs")


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
