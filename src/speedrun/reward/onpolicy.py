"""On-policy rejected answers: for every prompt, K samples of the SFT model as the rejected side of a pair whose
chosen side is the prompt's reference answer (on-policy / self-play negatives, as in SPIN). The RM then learns to
tell the reference from what the policy actually emits, on exactly the ids it emits: the sampled token ids are
kept (`rejected_ids`, <|assistant_end|> included when the sample stopped), never decoded and re-encoded.

A sample's draws depend only on (seed, prompt_id, sample index): rerunning, or adding prompts, leaves every
other prompt's samples as they were."""
from __future__ import annotations

import math

from collections import Counter

import pyarrow as pa
import torch

from speedrun.common import UserError, stable_hash, stable_seed
from speedrun.engine import generate
from speedrun.model import GPT
from speedrun.progress import Progress
from speedrun.tokenizer import Tokenizer, cut_prompt
from speedrun.train import distributed

KIND = "sft_sample"  # the `negative` of these pairs: the RM's metrics report them as their own kind
EXTRA_FIELDS = [pa.field("rejected_ids", pa.list_(pa.int32())), pa.field("truncated", pa.bool_())]


def reference_answers(pairs: list[dict], path: str) -> list[dict]:
    """One row per prompt_id, in prompt_id order: its first pair by pair id (a prompt with several pairs, e.g.
    several negatives or hub answers, has one reference answer)."""
    for i, row in enumerate(pairs):
        for c in ("id", "prompt_id", "prompt", "chosen"):
            if row.get(c) is None or (isinstance(row[c], float) and math.isnan(row[c])):
                raise UserError(f"{path}: row {i}, column {c!r}: no value (null or NaN); fix or drop that row "
                                 "upstream")
    first: dict[str, dict] = {}
    for row in sorted(pairs, key=lambda r: (r["prompt_id"], r["id"])):
        first.setdefault(row["prompt_id"], row)
    return list(first.values())


def row_uniforms(seed: int, prompt_ids: list[str], k: int, max_new_tokens: int) -> torch.Tensor:
    """[len(prompt_ids) * k, max_new_tokens] uniforms: row i*k + j is sample j of prompt i, from its own stream."""
    rows = [torch.rand(max_new_tokens, generator=torch.Generator().manual_seed(stable_seed(seed, "onpolicy", pid, j)))
            for pid in prompt_ids for j in range(k)]
    return torch.stack(rows) if rows else torch.empty(0, max_new_tokens)


@torch.no_grad()
def sample_rejected(model: GPT, tok: Tokenizer, refs: list[dict], k: int, max_new_tokens: int,
                    temperature: float, top_p: float, seed: int, batch_prompts: int, max_prompt_len: int,
                    device: str = "cpu", d: distributed.Dist | None = None,
                    keep_truncated: bool = True) -> tuple[list[dict], dict]:
    """K sampled answers per reference row as pair rows (the reference row's columns, rejected = the sample), and
    stats. Prompts are batched by rendered length (little padding); rows come back in refs order. d: the batches
    shared over torchrun's processes (every rank gets every row). keep_truncated=False skips (and counts) a sample
    cut at max_new_tokens: a reference always ends, so a cut rejected side teaches the RM to pay for ending."""
    model.eval()
    rendered = []
    for ref in refs:
        try:
            rendered.append(tok.render_prompt([{"role": m["role"], "content": m["content"]} for m in ref["prompt"]]))
        except ValueError as e:
            raise ValueError(f"prompt {ref['prompt_id']}: {e}") from None
    order = sorted(range(len(refs)), key=lambda i: (len(rendered[i]), refs[i]["prompt_id"]))
    batches = [order[s:s + batch_prompts] for s in range(0, len(order), batch_prompts)]
    bar = Progress(len(order), "onpolicy", unit="prompt")

    def sample_batch(b: int) -> list[list[list[int]]]:
        idx = batches[b]
        prompts = [cut_prompt(rendered[i], max_prompt_len) for i in idx]
        u = row_uniforms(seed, [refs[i]["prompt_id"] for i in idx], k, max_new_tokens)
        out = generate(model, prompts, k, max_new_tokens, temperature=temperature, top_p=top_p,
                       stop_id=tok.assistant_end_id, pad_id=tok.bos_id, uniforms=u)
        lengths = out.mask.sum(1).long().tolist()
        tokens = out.tokens.cpu().tolist()
        bar.update(len(idx) * (d.world if d else 1))  # this rank's share of the work, shown as the whole
        if b % 20 == 0:
            bar.log(f"onpolicy: sampled batch {b + 1}/{len(batches)} ({batch_prompts} prompts each)")
        return [[tokens[r * k + j][:lengths[r * k + j]] for j in range(k)] for r in range(len(idx))]

    # under torchrun each rank samples every world-th batch: the same batches, so the same samples, as one process
    done = distributed.map_jobs(sample_batch, range(len(batches)), d or distributed.Dist(0, 1, device))
    samples = {i: s for idx, got in zip(batches, done) for i, s in zip(idx, got)}
    bar.close()
    rows, counts, n_tokens = [], Counter(), 0
    for i, ref in enumerate(refs):
        chosen_ids = tok.encode(ref["chosen"]) + [tok.assistant_end_id]
        for j, ids in enumerate(samples[i]):
            truncated = not ids or ids[-1] != tok.assistant_end_id
            if ids == chosen_ids:  # the model reproduced the reference: no preference to learn
                counts["sample_equals_reference"] += 1
                continue
            if truncated and not keep_truncated:
                counts["truncated_skipped"] += 1
                continue
            counts["truncated"] += truncated
            n_tokens += len(ids)
            text = tok.decode([t for t in ids if t != tok.assistant_end_id])
            rows.append({**ref, "id": stable_hash(KIND, ref["prompt_id"], j), "rejected": text, "negative": KIND,
                         "rejected_ids": ids, "truncated": truncated})
    n = len(refs) * k
    stats = {"prompts": len(refs), "prompts_cut": sum(len(r) > max_prompt_len for r in rendered),
             "samples_per_prompt": k, "samples": n, "pairs": len(rows),
             "skipped": {"sample_equals_reference": counts["sample_equals_reference"],
                         "truncated": counts["truncated_skipped"]},
             "truncated_frac": round(counts["truncated"] / max(len(rows), 1), 4),
             "mean_sample_tokens": round(n_tokens / max(len(rows), 1), 2),
             "pairs_by_split": {sp: sum(r["split"] == sp for r in rows) for sp in ("train", "val")}}
    assert len(rows) + counts["sample_equals_reference"] + counts["truncated_skipped"] == n
    return rows, stats


def pairs_table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    """The rows in the schema of data/prompts/pairs.parquet plus rejected_ids and truncated (empty rows: an empty
    table of that schema, so that K = 0 still gives train_rm a file to read)."""
    full = pa.schema(list(schema) + EXTRA_FIELDS)
    return pa.Table.from_pylist([{f.name: r.get(f.name) for f in full} for r in rows], schema=full)
