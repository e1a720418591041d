"""Does a model read the task's bounds by what it finds likely, whatever it writes? (issue 71, item 6: a model that
does not take the answer format hides its reading from the checker.) For every held-out item of the embedded task,
every candidate value (the item's right answers and the wrong ones just outside its range, data.task.wrong_answers) is
scored by the log-probability of the bare reply "`v`" after the item's question in the model's own chat template. An
item's AUC is the chance that a right value outscores a wrong one (ties half). The prompt-blind control scores the
same values after another question of the same cluster (the next item in id order with other right answers): a model
that reads the bounds ranks right above wrong under the item's own question and not under another's. Per cluster:
the mean AUC, the blind AUC and their difference, with a bootstrap interval over items.

    python analysis/task_likelihood.py smollm2-135m outs/task_sft --tokenizer outs/task_base/tokenizer
A model is smollm2-135m (as shipped, speedrun.pretrained) or a checkpoint directory read with --tokenizer."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import typer

from speedrun import tokenizer as tokenizer_lib
from speedrun.data import task
from speedrun.pretrained import load_base
from speedrun.reward.preference import response_logprob
from speedrun.train.checkpoint import load_model
from speedrun.typer_app import new_app

app = new_app()


def load(spec: str, tokenizer_dir: Path | None):
    if spec == "smollm2-135m":
        ck, _ = load_base(spec)
        return ck.model().float().eval(), ck.tokenizer
    if tokenizer_dir is None:
        raise typer.BadParameter(f"{spec}: a checkpoint directory needs --tokenizer")
    tok = tokenizer_lib.load(tokenizer_dir)
    return load_model(Path(spec), "cpu", tok.digest)[0].float().eval(), tok


def auc(right: np.ndarray, wrong: np.ndarray) -> float:
    """P(a right value's score > a wrong one's), ties half."""
    diff = right[:, None] - wrong[None, :]
    return float((diff > 0).mean() + 0.5 * (diff == 0).mean())


def blind_partner(items: list[task.TaskItem]) -> dict[str, task.TaskItem]:
    """Each item's control question: the next item of its cluster (id order, cyclic) whose right answers differ."""
    out = {}
    by_cluster: dict[str, list] = {}
    for i in sorted(items, key=lambda i: i.item_id):
        by_cluster.setdefault(i.cluster, []).append(i)
    for group in by_cluster.values():
        for k, item in enumerate(group):
            others = group[k + 1:] + group[:k]
            out[item.item_id] = next((o for o in others if set(o.answers) != set(item.answers)), None)
    return out


def item_scores(model, tok, item: task.TaskItem, question: task.TaskItem) -> tuple[np.ndarray, np.ndarray]:
    """Log-probabilities of item's right and wrong values as the reply to `question`."""
    prompt = tok.render_prompt([{"role": "user", "content": question.prompt()}])
    right, wrong = list(item.answers), task.wrong_answers(item)
    rows = [prompt + tok.encode(f"`{v}`") + [tok.assistant_end_id] for v in right + wrong]
    with torch.no_grad():
        lp = response_logprob(model, rows, [len(prompt)] * len(rows)).numpy()
    return lp[:len(right)], lp[len(right):]


@app.command(help=__doc__)
def main(models: list[str] = typer.Argument(..., help="smollm2-135m, or checkpoint directories"),
         tokenizer: Path = typer.Option(None, help="the checkpoint directories' tokenizer"),
         items_path: Path = typer.Option(Path("data/task/items.parquet"), help="the task stage's items"),
         n_boot: int = typer.Option(1000, help="bootstrap draws over items"),
         threads: int = typer.Option(2, help="torch CPU threads")) -> None:
    torch.set_num_threads(threads)
    held_out = [i for i in task.load_items(items_path) if i.split == "eval" and not i.solution]
    partner = blind_partner(held_out)
    rng = np.random.default_rng(0)
    print("| model | cluster | items | AUC | blind AUC | Δ [95% CI over items] |\n|---|---|---:|---:|---:|---|")
    for spec in models:
        model, tok = load(spec, tokenizer)
        rows = []
        for item in held_out:
            if partner[item.item_id] is None:
                continue
            own = auc(*item_scores(model, tok, item, item))
            blind = auc(*item_scores(model, tok, item, partner[item.item_id]))
            rows.append((item.cluster, own, blind))
        for cluster in sorted({c for c, _, _ in rows}):
            own = np.array([o for c, o, _ in rows if c == cluster])
            blind = np.array([b for c, _, b in rows if c == cluster])
            d = own - blind
            boot = [d[rng.integers(0, len(d), len(d))].mean() for _ in range(n_boot)]
            lo, hi = np.percentile(boot, [2.5, 97.5])
            print(f"| {spec} | {cluster} | {len(d)} | {own.mean():.3f} | {blind.mean():.3f} | "
                  f"{d.mean():+.3f} [{lo:+.3f}, {hi:+.3f}] |", flush=True)


if __name__ == "__main__":
    app()
