"""GRPO prompts: the train split of the deduplicated prompts, tokenised, and how each variant draws them."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from speedrun.common import UserError, chat_messages, read_parquet, require_unique, stable_seed
from speedrun.config import DensityConfig
from speedrun.progress import Progress
from speedrun.rl.controls import balanced_weights
from speedrun.embeddings import prompt_embeddings
from speedrun.rl.density import prompt_weights
from speedrun.tokenizer import Tokenizer, cut_prompt
from speedrun.train import distributed
from speedrun.train.distributed import Dist


def load_prompts(path: Path, tok: Tokenizer, split: str, max_prompt_len: int) -> tuple[pd.DataFrame, list[list[int]]]:
    """Rows of prompts.parquet with split == `split`, and their chat-rendered ids in at most max_prompt_len tokens
    (speedrun.tokenizer.cut_prompt; how many were cut is printed)."""
    df = read_parquet(path)
    missing = {"prompt_id", "prompt", "split", "group"} - set(df.columns)
    if missing:
        raise UserError(f"{path}: missing columns {sorted(missing)}")
    require_unique(df["prompt_id"].tolist(), "prompt_id", path)
    rows = [i for i, s in enumerate(df["split"]) if s == split]  # the file's row numbers, for messages
    total, df = len(df), df[df["split"] == split].reset_index(drop=True)
    if df.empty:
        raise UserError(f"{path}: no prompts with split == {split!r}")
    print(f"{path}: {len(df):,} {split} prompts of {total:,} rows read", flush=True)
    ids, cut = [], 0
    with Progress(len(df), f"{path}: tokenising", unit="prompt", every=30.0, enabled=False) as bar:
        for i, messages in enumerate(df["prompt"]):
            msgs = chat_messages(messages, f"{path}: row {rows[i]} (prompt {df['prompt_id'][i]}), column 'prompt'")
            try:
                rendered = tok.render_prompt(msgs)
            except ValueError as e:
                raise UserError(f"{path} prompt {df['prompt_id'][i]}: {e}") from None
            ids.append(cut_prompt(rendered, max_prompt_len))
            cut += len(rendered) > max_prompt_len
            bar.update(1)
    if cut:
        print(f"{path}: {cut} of {len(ids)} {split} prompts longer than {max_prompt_len} tokens, cut to their chat "
              f"header and last tokens")
    return df, ids


def pool_subset(df: pd.DataFrame, ids: list[list[int]], pool: int) -> tuple[pd.DataFrame, list[list[int]]]:
    """A fixed random subset of `pool` prompts (0 or more than there are: all), the same for every arm and seed:
    smaller pools make prompts repeat within a run."""
    if not 0 < pool < len(ids):
        return df, ids
    order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(stable_seed("pool")))
    keep = sorted(order[:pool].tolist())
    return df.iloc[keep].reset_index(drop=True), [ids[i] for i in keep]


def sampling_weights(variant: str, model: torch.nn.Module, ids: list[list[int]], texts: list[str],
                     groups: list[str], density: DensityConfig, device: str, d: Dist | None = None,
                     where: str = "density") -> torch.Tensor:
    """density: ∝ (mean cosine distance to the k nearest prompts)^alpha in the embedding density.embedding
    (isolated prompts drawn more often); uniform: equal weights; balanced: every group the same total weight.
    Under several processes (d) rank 0 computes them (the k-NN is O(N^2)) and broadcasts them to the others.
    `where` names density's params.yaml section in messages (grpo.density)."""
    if d is not None and d.world > 1:
        w = (sampling_weights(variant, model, ids, texts, groups, density, device, where=where) if d.is_main
             else torch.empty(len(ids), dtype=torch.float64))
        return distributed.broadcast(w, d)
    if variant == "uniform":
        return torch.full((len(ids),), 1.0 / len(ids), dtype=torch.float64)
    if variant == "balanced":
        return balanced_weights(groups)
    if variant == "density":
        if 0 < density.max_prompts < len(ids):
            raise UserError(f"{where}.max_prompts: {len(ids):,} train prompts for the density weights, above the "
                             f"limit of {density.max_prompts:,}: the k-NN's time grows as N^2 (539,200 prompts took "
                             f"about 227 minutes on a 2-core CPU). Raise {where}.max_prompts, or draw a pool of "
                             f"fewer prompts (the track's train.pool)")
        print(f"{where}: weights of {len(ids):,} train prompts in the {density.embedding} embedding, then their "
              f"k-NN (k {density.k}) on {device}", flush=True)
        emb = prompt_embeddings(density.embedding, model, ids, texts, device)
        return prompt_weights(emb.to(device), density.k, density.alpha, density.max_ratio, every=30.0)  # on the device
    raise ValueError(f"sampling must be density, uniform or balanced, not {variant!r}")
