"""Preference reward model: the SFT trunk + a scalar head on the final hidden state of the last real token of
the chat-rendered prompt+response, trained with the Bradley-Terry loss -logsigmoid(r_chosen - r_rejected).

A scored sequence is exactly what the policy emits: tok.render_prompt(messages) (ending in <|assistant_start|>)
+ the response tokens + <|assistant_end|>, so GRPO scores its sampled ids as they are, and text is rendered
into the same ids. Training batches fit the shared loop's contract: x holds the chosen rows then the rejected
rows, right-padded with -1 (the pad mask travels inside x); y has one target (1) per pair."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Sequence

import pandas as pd
import pyarrow.parquet as pq
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from speedrun.common import SPLITS, UserError, read_json, read_parquet, require_values, torch_load
from speedrun.engine import continuation_hidden, last_real, sequence_logprobs
from speedrun.model import GPT
from speedrun.tokenizer import Tokenizer, cut_prompt
from speedrun.train.checkpoint import Config, build, model_config
from speedrun.train.data import StepSampler, by_length

MIN_RESPONSE_TOKENS = 16  # a longer prompt is cut to leave this much room: a response is not scored on a stub
REQUIRED_COLUMNS = ("id", "prompt_id", "split", "src", "prompt", "chosen", "rejected")


POOLS = ("last", "mean")


class RewardModel(nn.Module):
    """The policy's trunk, GPT or Llama (its LM head dropped) + a linear scalar head; `reward_mean`/`reward_std`
    standardise rewards. pool "last": the head reads the last real token; "mean": the mean of the head's per-token
    scores over the response tokens (each token's evidence adds up, as in the adversarial discriminator's token
    head). end_id set (rm.read_end false): each response's closing token is left out of what the head reads."""

    def __init__(self, config: Config, pool: str = "last"):
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, not {pool!r}")
        self.config, self.pool = config, pool
        self.trunk = build(config)
        self.trunk.lm_head = None  # the reward reads hidden states, never vocabulary logits
        self.head = nn.Linear(config.n_embd, 1, bias=False)  # a bias cancels in r_chosen - r_rejected
        nn.init.zeros_(self.head.weight)  # every reward starts at 0: loss log 2, no random preference
        self.reward_mean, self.reward_std, self.max_len = 0.0, 1.0, config.seq_len
        self.end_id: int | None = None

    @classmethod
    def from_gpt(cls, gpt: GPT, pool: str = "last") -> RewardModel:
        rm = cls(gpt.config, pool)
        state = {k: v for k, v in gpt.state_dict().items() if not k.startswith("lm_head.")}
        rm.trunk.load_state_dict(state)
        return rm.to(next(gpt.parameters()).device)

    @classmethod
    def load(cls, rm_dir: Path, device: str = "cpu", tokenizer_digest: str | None = None) -> RewardModel:
        """outs/rm/ (model.pt + meta.json) on device, in eval mode, with the reward stats of its val responses."""
        meta = read_json(Path(rm_dir) / "meta.json")
        if tokenizer_digest and meta.get("tokenizer") not in (None, tokenizer_digest):
            raise UserError(f"{rm_dir}: trained with tokenizer {meta['tokenizer']}, not {tokenizer_digest}")
        rm = cls(model_config(meta, Path(rm_dir) / "meta.json"), meta.get("pool", "last"))
        rm.load_state_dict(torch_load(Path(rm_dir) / "model.pt"))
        rm.reward_mean, rm.reward_std = float(meta["reward_mean"]), float(meta["reward_std"])
        rm.max_len = int(meta.get("max_len", rm.config.seq_len))
        rm.end_id = meta.get("end_id")
        return rm.to(device).eval()

    def forward(self, ids: Tensor, key_mask: Tensor | None = None, start: Tensor | None = None,
                paired: bool = False) -> Tensor:
        """Raw reward [B] (fp32) of each row; rows may be right- or left-padded (key_mask False on pads).
        start [B]: the index of each row's first response token (needed by pool "mean"). paired: right-padded
        rows i and i + B/2 answer the same prompt, ids[i, :start[i]] (a pair_batch), which is then run once for
        both (the same rewards up to float rounding, ~30% fewer tokens). Training calls the module itself so
        that DDP sees the forward."""
        if not paired:
            h = self.trunk.hidden(ids, key_mask=key_mask)
            mask = key_mask if key_mask is not None else torch.ones_like(ids, dtype=torch.bool)
            return self.pool_scores(h, self.read_mask(ids, mask, start), start)
        n, T = ids.shape
        lengths = key_mask.sum(1)
        prompts = [row[:int(k)] for row, k in zip(ids[:n // 2].tolist(), start[:n // 2].tolist())]
        width = int((lengths - start).max())
        col = (start[:, None] + torch.arange(width, device=ids.device)[None]).clamp(max=T - 1)
        resp_mask = torch.arange(width, device=ids.device)[None] < (lengths - start)[:, None]
        resp = ids.gather(1, col).masked_fill(~resp_mask, 0)
        prompt_index = torch.arange(n // 2, device=ids.device).repeat(2)
        _, h = continuation_hidden(self.trunk, prompts, resp, prompt_index, 0, resp_mask.sum(1))
        return self.pool_scores(h, self.read_mask(resp, resp_mask), torch.zeros_like(start))

    def read_mask(self, ids: Tensor, mask: Tensor, start: Tensor | None = None) -> Tensor:
        """mask [B, T] (bool, True on real tokens) less each row's closing token where end_id is set: causal
        attention makes that the same score as the response without it, so an answer cut at a budget and one that
        ended are read alike. A row whose response (from start, default 0) is that token alone keeps it."""
        if self.end_id is None:
            return mask
        rows = torch.arange(ids.size(0), device=ids.device)
        last = last_real(mask)
        first = start.to(ids.device) if start is not None else torch.zeros_like(last)
        closing = (ids[rows, last] == self.end_id) & (last > first) & mask[rows, last]
        out = mask.clone()
        out[rows[closing], last[closing]] = False
        return out

    def pool_scores(self, h: Tensor, key_mask: Tensor | None = None, start: Tensor | None = None) -> Tensor:
        """Raw reward [B] from the trunk's hidden states h [B, T, C] of rows laid out as in forward()."""
        B, T = h.shape[:2]
        if self.pool == "mean":
            if start is None:
                raise ValueError("pool 'mean' needs the response start of every row")
            sel = torch.arange(T, device=h.device)[None] >= start.to(h.device)[:, None]
            sel = sel & key_mask if key_mask is not None else sel
            per_token = self.head(h).squeeze(-1).float()
            return (per_token * sel).sum(1) / sel.sum(1).clamp(min=1)
        if key_mask is None:
            last = torch.full((B,), T - 1, device=h.device)
        else:
            last = last_real(key_mask)
        return self.head(h[torch.arange(B, device=h.device), last]).squeeze(-1).float()

    def score(self, ids: Tensor, key_mask: Tensor | None = None, start: Tensor | None = None) -> Tensor:
        return self(ids, key_mask, start)

    def standardise(self, rewards: Tensor) -> Tensor:
        return (rewards - self.reward_mean) / max(self.reward_std, 1e-6)  # a constant RM has std 0


def freeze(rm: RewardModel, train_last_blocks: int) -> None:
    """Train the head and the last K blocks (K >= depth: the whole trunk, embedding included)."""
    depth = rm.config.depth
    for p in rm.trunk.parameters():
        p.requires_grad_(train_last_blocks >= depth)
    for block in rm.trunk.blocks[depth - min(train_last_blocks, depth):]:
        block.requires_grad_(True)
    rm.head.requires_grad_(True)


# ---- rendering and batches ----

def fit(prompt_ids: list[int], response_ids: list[int], max_len: int) -> tuple[list[int], bool]:
    """(prompt + response in at most max_len tokens, whether it was cut). A long response is cut short but keeps
    its last token (<|assistant_end|>), where the score is read; a prompt that leaves no room is kept whole."""
    room = max_len - len(prompt_ids)
    if len(response_ids) <= room or room < 2:
        return prompt_ids + response_ids, False
    return prompt_ids + response_ids[:room - 1] + response_ids[-1:], True


def load_pairs(*paths: Path) -> pd.DataFrame:
    """The union of pair files in the schema of data/prompts/pairs.parquet (pairs with prompt_id and the
    train/val/eval split of dedup_prompts; data/onpolicy/pairs.parquet adds rejected_ids, the sampled ids of the
    rejected side)."""
    frames = []
    for path in paths:
        df = read_parquet(path)
        missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
        if missing:
            raise UserError(f"{path}: missing columns {missing} (have {list(df.columns)}); "
                             "the RM reads the pairs of dedup_prompts (data/prompts/pairs.parquet)")
        require_values(pq.read_table(path, columns=list(REQUIRED_COLUMNS)), REQUIRED_COLUMNS, path)
        bad = ~df["split"].isin(SPLITS)
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            raise UserError(f"{path} row {i}: split {df['split'].iloc[i]!r} is not one of {SPLITS}")
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    straddle = df.groupby("prompt_id")["split"].nunique()
    if (straddle > 1).any():
        pid = sorted(straddle.index[straddle > 1])[0]
        raise UserError(f"{', '.join(map(str, paths))}: prompt_id {pid} has pairs in several splits "
                         f"{sorted(set(df.loc[df['prompt_id'] == pid, 'split']))}")
    dup = df["id"].duplicated()
    if dup.any():
        raise UserError(f"{', '.join(map(str, paths))}: pair id {df['id'][dup].iloc[0]} appears twice")
    return df


def pair_kind(row: dict) -> str:
    """The negative kind of embedded pairs (hard | random), else the source."""
    neg = row.get("negative")
    return row["src"] if neg is None or pd.isna(neg) else str(neg)


def render_pairs(df: pd.DataFrame, tok: Tokenizer, max_len: int) -> tuple[dict[str, list], dict[str, int], dict]:
    """(rendered chosen/rejected ids of every usable pair in file order, skip counts by reason, how many prompts
    and responses were cut to fit max_len). A prompt is cut as GRPO cuts one (tokenizer.cut_prompt), to leave
    MIN_RESPONSE_TOKENS for the response."""
    out: dict[str, list] = {k: [] for k in ("id", "chosen", "rejected", "kind", "prompt", "prompt_len",
                                            "chosen_text", "rejected_text")}
    skipped, cut = Counter(), {"prompts": 0, "responses": 0}
    for row in df.to_dict("records"):
        prompt = [{"role": m["role"], "content": m["content"]} for m in row["prompt"]]
        if not prompt or prompt[-1]["role"] != "user":
            skipped["prompt_not_ending_in_user_turn"] += 1
            continue
        p = tok.render_prompt(prompt)
        cut["prompts"] += len(p) > max_len - MIN_RESPONSE_TOKENS
        p = cut_prompt(p, max_len - MIN_RESPONSE_TOKENS)
        c, cut_c = fit(p, tok.encode(row["chosen"]) + [tok.assistant_end_id], max_len)
        sampled = row.get("rejected_ids")  # a policy sample: scored on its own ids, as GRPO scores it
        r_ids = [int(t) for t in sampled] if sampled is not None and not isinstance(sampled, float) else \
            tok.encode(row["rejected"]) + [tok.assistant_end_id]
        r, cut_r = fit(p, r_ids, max_len)
        cut["responses"] += cut_c + cut_r
        if c == r:
            skipped["same_ids_after_truncation"] += 1
            continue
        row_out = {"id": row["id"], "chosen": c, "rejected": r, "kind": pair_kind(row), "prompt": prompt,
                   "prompt_len": len(p), "chosen_text": row["chosen"], "rejected_text": row["rejected"]}
        for k, v in row_out.items():
            out[k].append(v)
    assert len(out["id"]) + sum(skipped.values()) == len(df)
    return out, dict(sorted(skipped.items())), cut


def split_pairs(df: pd.DataFrame, tok: Tokenizer, max_len: int) -> dict[str, tuple[dict[str, list], dict, dict]]:
    """render_pairs of the 'train' and the 'val' split; 'eval' pairs (the evaluation's prompts) are left out."""
    return {split: render_pairs(df[df["split"] == split], tok, max_len) for split in ("train", "val")}


def select_kinds(pairs: dict[str, list], kinds: list[str]) -> tuple[dict[str, list], dict[str, int]]:
    """The rendered pairs whose kind is in `kinds` (["all"]: every pair), and the count left out per kind."""
    if "all" in kinds:
        return pairs, {}
    wanted = set(kinds)
    keep = [i for i, k in enumerate(pairs["kind"]) if k in wanted]
    left_out = Counter(k for k in pairs["kind"] if k not in wanted)
    return {c: [v[i] for i in keep] for c, v in pairs.items()}, dict(sorted(left_out.items()))


def pad_rows(rows: Sequence[list[int]], pad: int = 0, left: bool = False) -> tuple[Tensor, Tensor]:
    """(ids [N, T], key_mask [N, T]) with pads (False in the mask) on the right, or on the left."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, r in enumerate(rows):
        sl = slice(T - len(r), T) if left else slice(0, len(r))
        ids[i, sl] = torch.tensor(r, dtype=torch.long)
        mask[i, sl] = True
    return ids, mask


def pair_batch(chosen: Sequence[list[int]], rejected: Sequence[list[int]], prompt_lens: Sequence[int]
               ) -> tuple[Tensor, Tensor]:
    """x [2B, T]: chosen rows then rejected rows, -1 on pads; y [B]: one target per pair, the pair's prompt length
    (where its responses start)."""
    ids, mask = pad_rows(list(chosen) + list(rejected))
    return ids.masked_fill(~mask, -1), torch.tensor(list(prompt_lens), dtype=torch.long)


def bt_loss_sum(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Bradley-Terry loss summed over the pairs of a pair_batch (the loop divides by the pair count)."""
    r = model(x.clamp(min=0), x >= 0, y.clamp(min=0).repeat(2), paired=True)
    margin = r[:y.numel()] - r[y.numel():]
    return -(F.logsigmoid(margin) * (y != -1)).sum()


def pair_batch_fn(pairs: dict[str, list], sampler: StepSampler, micro_tokens: int = 0):
    """Batches of the loop. micro_tokens > 0: each micro-batch is re-cut by length (at most that many padded
    tokens), which keeps the step's gradient (the loop sums micro-batches) and drops most of the padding."""
    size = [max(len(c), len(r)) for c, r in zip(pairs["chosen"], pairs["rejected"])]

    def batch_fn(step: int, rank: int, world: int) -> list[tuple[Tensor, Tensor]]:
        groups = sampler.items(step, rank, world)
        if micro_tokens:
            groups = [g for ids in groups for g in by_length(ids, size, micro_tokens, rows_per_item=2)]
        return [pair_batch([pairs["chosen"][i] for i in ids], [pairs["rejected"][i] for i in ids],
                           [pairs["prompt_len"][i] for i in ids]) for ids in groups]
    return batch_fn


# ---- scoring ----

@torch.no_grad()
def score_ids(rm: RewardModel, rows: Sequence[list[int]], starts: Sequence[int], batch_size: int = 64,
              device: str = "cpu") -> Tensor:
    """Raw rewards [N] (CPU fp32) of rendered sequences whose responses begin at starts, in input order; batched
    by length to pad little."""
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i]), i))
    out = torch.empty(len(rows))
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        ids, mask = pad_rows([rows[i] for i in idx])
        out[idx] = rm(ids.to(device), mask.to(device), torch.tensor([starts[i] for i in idx])).cpu()
    return out


def score_conversations(rm: RewardModel, tok: Tokenizer, prompts: Sequence[list[dict] | list[int]],
                        responses: Sequence[str | list[int]], batch_size: int = 64, device: str = "cpu",
                        standardise: bool = False) -> Tensor:
    """Rewards [N] of prompt i + response i. A prompt is a message list or its ids from tok.render_prompt;
    a response is text (<|assistant_end|> gets appended) or completion ids, scored as given (GRPO passes
    what it sampled, <|assistant_end|> included when the sample stopped)."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    rows, starts = [], []
    for p, r in zip(prompts, responses):
        p_ids = list(p) if not p or not isinstance(p[0], dict) else tok.render_prompt(list(p))
        p_ids = cut_prompt(p_ids, rm.max_len - MIN_RESPONSE_TOKENS)
        r_ids = tok.encode(r) + [tok.assistant_end_id] if isinstance(r, str) else list(r)
        rows.append(fit(p_ids, r_ids, rm.max_len)[0])
        starts.append(len(p_ids))
    rewards = score_ids(rm, rows, starts, batch_size, device)
    return rm.standardise(rewards) if standardise else rewards


def correct(margin: Tensor) -> Tensor:
    """Per pair 1 if the chosen response scores higher, 0.5 on a tie, else 0."""
    return (margin > 0).float() + 0.5 * (margin == 0).float()


def by_kind(kinds: Sequence[str], **columns: Tensor) -> dict[str, dict[str, float]]:
    """Mean of each per-pair column over all pairs and per kind, plus the pair counts."""
    groups = {"all": torch.ones(len(kinds), dtype=torch.bool)}
    groups.update({k: torch.tensor([x == k for x in kinds]) for k in sorted(set(kinds))})
    return {g: {"pairs": int(sel.sum()), **{c: round(float(v[sel].mean()), 4) for c, v in columns.items()}}
            for g, sel in groups.items()}


def pair_metrics(chosen: Tensor, rejected: Tensor, kinds: Sequence[str], prefix: str = "val") -> dict[str, float]:
    """BT loss, accuracy (a tie counts half), mean margin, overall and per kind."""
    margin = chosen - rejected
    correct_ = correct(margin)
    out = {f"{prefix}_loss": float(-F.logsigmoid(margin).mean()), f"{prefix}_acc": float(correct_.mean()),
           f"{prefix}_margin": float(margin.mean())}
    for kind in sorted(set(kinds)):
        sel = torch.tensor([k == kind for k in kinds])
        out[f"{prefix}_acc_{kind}"] = float(correct_[sel].mean())
        out[f"{prefix}_margin_{kind}"] = float(margin[sel].mean())
    return out


def evaluate(rm: RewardModel, pairs: dict[str, list], batch_size: int = 64, device: str = "cpu"
             ) -> tuple[dict[str, float], Tensor, Tensor]:
    """(metrics, chosen rewards, rejected rewards) of rendered pairs."""
    n = len(pairs["chosen"])
    rc, rr = torch.zeros(n), torch.zeros(n)
    if rm.head.weight.any():  # the untrained zero head scores everything 0: no forward pass needed
        order = sorted(range(n), key=lambda i: (max(len(pairs["chosen"][i]), len(pairs["rejected"][i])), i))
        for s in range(0, n, max(1, batch_size // 2)):  # batched by length, each pair's prompt run once
            idx = order[s:s + max(1, batch_size // 2)]
            x, y = pair_batch([pairs["chosen"][i] for i in idx], [pairs["rejected"][i] for i in idx],
                              [pairs["prompt_len"][i] for i in idx])
            x, y = x.to(device), y.to(device)
            with torch.no_grad():
                r = rm(x.clamp(min=0), x >= 0, y.repeat(2), paired=True).float().cpu()
            rc[idx], rr[idx] = r[:len(idx)], r[len(idx):]
    return pair_metrics(rc, rr, pairs["kind"]), rc, rr


@torch.no_grad()
def response_logprob(gpt: GPT, rows: Sequence[list[int]], prompt_lens: Sequence[int], batch_size: int = 256,
                     device: str = "cpu") -> Tensor:
    """Summed log-probability [N] of each row's response tokens (<|assistant_end|> included) given its prompt,
    under a language model: log p(chosen) > log p(rejected) says whether the SFT model itself knows which
    answer is right, the knowledge an RM built on its trunk can read out. Rows that share a prompt (a pair's
    chosen and rejected) run it once (sequence_logprobs)."""
    prompt = [tuple(r[:n]) for r, n in zip(rows, prompt_lens)]
    order = sorted(range(len(rows)), key=lambda i: (prompt[i], i))  # the rows of one prompt adjacent
    out = torch.empty(len(rows))
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        unique = {p: j for j, p in enumerate(dict.fromkeys(prompt[i] for i in idx))}
        tokens, mask = pad_rows([rows[i][prompt_lens[i]:] for i in idx])
        lp = sequence_logprobs(gpt, [list(p) for p in unique], tokens.to(device), mask=mask.to(device).float(),
                               prompt_index=torch.tensor([unique[prompt[i]] for i in idx], device=device))
        out[idx] = lp.sum(1).float().cpu()
    return out


# ---- the trivial baseline an RM must beat ----

_BACKTICKS = re.compile(r"`([^`]+)`")
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")  # identifier parts: HTTPServer -> HTTP, Server


def name_words(text: str) -> set[str]:
    return {w.lower() for w in _WORDS.findall(text)}


def overlap_baseline(prompts: Sequence[list[dict]], chosen: Sequence[str], rejected: Sequence[str]) -> list[float]:
    """Per pair 1 / 0.5 / 0: does the chosen response share more words with the object name in the question
    (the `backticked` part of the last user turn; the whole turn if none) than the rejected one?"""
    out = []
    for p, c, r in zip(prompts, chosen, rejected):
        q = p[-1]["content"]
        name = name_words(" ".join(_BACKTICKS.findall(q)) or q)
        oc, orj = len(name & name_words(c)), len(name & name_words(r))
        out.append(1.0 if oc > orj else 0.5 if oc == orj else 0.0)
    return out
