"""The gold-checked task in the evaluation (data/gold.py): every model answers every held-out item n times with
the same sampler and the same draws, and each answer is checked against the object table.

Per model: pass@1 (share of right answers), pass@k (unbiased, Chen et al. 2021) and coverage@n (distinct right
answers among an item's n samples, averaged over items): the task is kept, and the right answers stay varied.
Variants are compared like the diversity metrics (stats.pooled_delta over training seeds, bootstrap over items), and
pass@1 carries a non-inferiority margin of its own.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from speedrun.common import stable_seed
from speedrun.data.gold import GoldItem, check, pass_at_k
from speedrun.engine import completion_texts, generate
from speedrun.eval import stats
from speedrun.eval.sampling import PROMPT_GAIN
from speedrun.probe import COPY_GAIN
from speedrun.progress import Progress
from speedrun.tokenizer import Tokenizer
from speedrun.train.checkpoint import load_model

FLOOR = 0.05  # a reference pass@1 below this leaves no room to detect a loss


@torch.no_grad()
def sample_task(models: dict[str, Path], tok: Tokenizer, items: list[GoldItem], distractors: list[str], n: int,
                max_new_tokens: int, temperature: float, top_p: float, seed: int, device: str) -> pd.DataFrame:
    """One row per answer: model, item_id, sample_idx, text, answer (the right name it gives, or None). Each item
    is asked its own fixed question (wrong options drawn from `distractors`)."""
    ids = [tok.render_prompt([{"role": "user", "content": item.prompt(distractors)}]) for item in items]
    rows = []
    bar = Progress(len(models), "task", unit="model")
    for name, ckpt in models.items():
        model, _ = load_model(Path(ckpt), device, tok.digest)
        g = torch.Generator(device=device).manual_seed(stable_seed(seed, "task"))  # the same draws for every model
        out = generate(model, ids, n, max_new_tokens, temperature=temperature, top_p=top_p,
                       stop_id=tok.assistant_end_id, pad_id=tok.bos_id, generator=g)
        for r, text in enumerate(completion_texts(out, tok)):
            item = items[r // n]
            rows.append({"model": name, "item_id": item.item_id, "sample_idx": r % n, "text": text,
                         "answer": check(item, text)})
        bar.update(1)
    bar.close()
    return pd.DataFrame(rows, columns=["model", "item_id", "sample_idx", "text", "answer"])


def per_item(answers: pd.DataFrame, k_values: tuple[int, ...]) -> dict[str, pd.DataFrame]:
    """{model: one row per item (in item_id order): pass@k for each k, coverage = distinct right answers}."""
    out = {}
    for model, g in answers.groupby("model", sort=True):
        rows = []
        for item_id, a in g.groupby("item_id", sort=True):
            n, right = len(a), a["answer"].dropna()
            rows.append({"item_id": item_id, **{f"pass@{k}": pass_at_k(n, len(right), k) for k in k_values},
                         f"coverage@{n}": right.nunique()})
        out[model] = pd.DataFrame(rows).set_index("item_id")
    return out


def compare_task(answers: pd.DataFrame, variants: dict[str, list[str]], comparisons: list[tuple[str, str]],
                 reference: str, margin: float, n_boot: int, seed: int, k_values: tuple[int, ...] = (1, 4)) -> dict:
    """Values per model; per comparison (a, b) and per variant against the reference: Δ with the interval of
    stats.pooled_delta (bootstrap over items) and pass@1 non-inferiority within `margin` (absolute)."""
    n = int(answers.groupby(["model", "item_id"]).size().min())
    k_values = tuple(k for k in k_values if k < n) + (n,)
    table = per_item(answers, k_values)
    models = list(table)
    names = list(table[models[0]].columns)
    items = table[models[0]].index
    for m in models:
        if not table[m].index.equals(items):
            raise ValueError(f"task answers: model {m!r} was asked other items than {models[0]!r}")
    rng = np.random.default_rng(stable_seed("task_bootstrap", seed))
    draws = rng.integers(0, len(items), size=(n_boot, len(items)))
    point = {m: table[m].mean().to_numpy() for m in models}
    at_floor = bool(point[reference][names.index("pass@1")] < FLOOR)  # no room to show a loss: no verdict
    boot = {m: table[m].to_numpy()[draws].mean(axis=1) for m in models}  # [n_boot, metric]

    def delta(runs_a: list[str], runs_b: list[str], fixed_b: bool) -> dict:
        out = {}
        for j, name in enumerate(names):
            out[name] = stats.pooled_delta([point[r][j] for r in runs_a], [point[r][j] for r in runs_b],
                                           np.stack([boot[r][:, j] for r in runs_a], 1),
                                           np.stack([boot[r][:, j] for r in runs_b], 1), fixed_b=fixed_b)
        d = out["pass@1"]
        out["pass@1"]["noninferiority"] = (stats.non_inferiority(d["ci_low"], d["ci_high"], margin)
                                           if (d["seed_variance"] or fixed_b) and not at_floor else None)
        return out

    return {"metrics": names, "items": len(items), "samples_per_item": n, "margin": margin, "at_floor": at_floor,
            "values": {m: dict(zip(names, map(float, point[m]))) for m in models},
            "comparisons": [{"a": a, "b": b, "delta": delta(variants[a], variants[b], False)} for a, b in comparisons],
            "vs_reference": {v: delta(runs, [reference], True) for v, runs in variants.items()}}


def task_section(task: dict, reference: str, probe: dict | None = None, reads: dict | None = None) -> str:
    """The report's gold-task section: values per model, the reference's copy probe and prompt gain
    (sampling.prompt_gain_summary), then the comparisons with their intervals."""
    names = task["metrics"]
    lines = ["## Task performance (gold-checked)", "",
             f"\"Which of these is a function (class) defined in the `M` module: <4 of its members and 2 of other "
             f"modules, shuffled>? Name one.\" on {task['items']} held-out items (modules no post-training stage "
             f"saw), {task['samples_per_item']} answers per item and model; an answer is right when the first dotted "
             "name it gives is a documented top-level member of M of that kind (the corpus object table). "
             "coverage = distinct right answers per item.", "",
             "| model | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for m, v in task["values"].items():
        lines.append(f"| {m} | " + " | ".join(f"{v[n]:.3f}" for n in names) + " |")
    if probe:
        lines += ["", f"**Can {reference} copy from its context?** (the task is to pick a listed name and copy it) "
                  f"Induction probe: {probe['rows']} random token sequences of {probe['length']} shown twice; loss "
                  f"{probe['first_copy']:.2f} nats/token on the first copy, {probe['second_copy']:.2f} on the second "
                  f"(gain {probe['gain']:+.2f}; a model that copies gains ≥ {COPY_GAIN:g}): "
                  + ("it copies." if probe["copies"] else "it does not copy.")]
    blind = reads is not None and reads["ci_high"] < PROMPT_GAIN
    if reads:
        verdict = (f"below the {PROMPT_GAIN:g} of a model that reads it: its answers barely depend on the question."
                   if blind else f"at least the {PROMPT_GAIN:g} of a model that reads it."
                   if reads["ci_low"] >= PROMPT_GAIN else f"the interval straddles the {PROMPT_GAIN:g} bar: no call.")
        lines += ["", f"**Does {reference} read its prompt?** Its held-out reference answers are "
                  f"{reads['gain']:+.3f} [{reads['ci_low']:+.3f}, {reads['ci_high']:+.3f}] nats/token more likely "
                  f"under their own question than under another prompt's ({reads['prompts']} prompts; 95% interval), "
                  + verdict]
    if task["at_floor"]:
        why = (" It cannot copy from its context (the probe above), and the task needs that."
               if probe and not probe["copies"] else "")
        why += " Its answers barely depend on the question at all (the prompt gain above)." if blind else ""
        lines += ["", f"**At floor:** {reference} answers right in under {FLOOR:.0%} of tries, so no comparison below "
                  f"can show a loss of this ability: at this scale the model has not learned the task.{why} It needs "
                  "a model that does (more pretraining, a larger model). The intervals below are reported, not read."]
    lines += ["", f"pass@1 non-inferiority margin: {task['margin']} (absolute).", "",
              "| comparison | " + " | ".join(f"Δ {n} [95% CI]" for n in names) + " | pass@1 |",
              "|---|" + "---:|" * len(names) + "---|"]
    rows = [(f"{c['a']} − {c['b']}", c["delta"]) for c in task["comparisons"]]
    rows += [(f"{v} − {reference}", d) for v, d in task["vs_reference"].items()]
    for label, d in rows:
        cells = [f"{d[n]['value']:+.3f} [{d[n]['ci_low']:+.3f}, {d[n]['ci_high']:+.3f}]" for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {d['pass@1']['noninferiority'] or 'no verdict'} |")
    return "\n".join(lines)
