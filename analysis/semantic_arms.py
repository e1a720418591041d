"""Semantic diversity of a task-track experiment's models, from its committed answers alone (no model, no DVC cache).

Do an arm's answers to one item say the same thing more often than another arm's? Per model: the mean over items of
the mean pairwise cosine distance between the item's answers, embedded by all-MiniLM-L6-v2 (speedrun.eval.semantic).
First the task SFT model at each temperature (the control: does it order them?), then each arm's runs, then per
"a:b" pair the difference with the interval the task comparisons use (stats.pooled_delta: seeds + items). The
figure reads the value and the wording together; it is a secondary reading, never pre-registered.

    python analysis/semantic_arms.py reports/experiments/task-control-batch32/answers.parquet checker:shuffled
"""
import sys

import numpy as np

from speedrun import kept
from speedrun.embeddings import embed, load_encoder
from speedrun.eval import semantic
from speedrun.eval.stats import pooled_delta
from speedrun.eval.task_track import item_draws


def main(path: str, pairs: list[str], n_boot: int = 1000) -> None:
    d = kept.read_parquet(path).reset_index(drop=True)
    items = sorted(d.item_id.unique())
    emb = embed(load_encoder("cpu"), d.text.tolist())
    per_item = {}  # model name -> per-item distance, in `items` order
    for (model, t), g in d.groupby(["model", "temperature"], sort=True):
        name = f"{model} T={t:g}" if model == "task_sft" else model
        per_item[name] = np.array([semantic.pairwise_distance(emb[rows.index]) for _, rows in g.groupby("item_id")])
    sft = {float(n.split("=")[1]): v.mean() for n, v in per_item.items() if n.startswith("task_sft")}
    print(f"{path}: {len(items)} held-out items, {len(d)} answers")
    print("temperature control:", semantic.temperature_control(sft))
    arms: dict[str, list[str]] = {}
    for m in sorted(n for n in per_item if not n.startswith("task_sft")):
        arms.setdefault(m.rsplit("_s", 1)[0], []).append(m)
    print("| model | runs | semantic diversity (per run) |\n|---|---:|---|")
    for t, v in sorted(sft.items()):
        print(f"| task SFT, T={t:g} | 1 | {v:.3f} |")
    for arm, ms in arms.items():
        vals = [per_item[m].mean() for m in ms]
        print(f"| {arm} | {len(ms)} | {np.mean(vals):.3f} ({', '.join(f'{v:.3f}' for v in vals)}) |")
    draws = item_draws(len(items), n_boot, 0, "semantic_arms")
    for pair in pairs:
        a, b = pair.split(":")
        ma, mb = (np.array([[per_item[m][r].mean() for m in arms[x]] for r in draws]) for x in (a, b))
        r = pooled_delta(ma[0], mb[0], ma[1:], mb[1:])
        print(f"{a} - {b}: {r['value']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] (p {r['p']:.3f})")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
