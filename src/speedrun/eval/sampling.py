"""What the evaluation measures on each model: sampled responses with their RM reward (same prompts, same
sampling seeds, same draws for every model), and the log-likelihood of the held-out reference answers."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from speedrun.common import stable_seed
from speedrun.engine import completion_texts, generate, left_pad
from speedrun.model import GPT
from speedrun.progress import Progress
from speedrun.reward.onpolicy import reference_answers
from speedrun.reward.preference import RewardModel, fit, response_logprob
from speedrun.rl.rewards import score_samples
from speedrun.tokenizer import Tokenizer
from speedrun.train.checkpoint import load_model


def run_name(variant: str, seed: int) -> str:
    """The model name of one GRPO run in the evaluation (its outputs live in outs/grpo/<variant>_s<seed>)."""
    return f"grpo_{variant}_s{seed}"


def reference_token_ids(pairs_path: Path, tok: Tokenizer, prompt_ids: list[str], ids: list[list[int]],
                        max_len: int) -> tuple[list[list[int]], list[int]]:
    """Prompt + reference answer ids per eval prompt (the answer of its first pair by id), cut to max_len, and
    each row's prompt length: the rows response_logprob scores."""
    refs = {r["prompt_id"]: r for r in reference_answers(pd.read_parquet(pairs_path).to_dict("records"), str(pairs_path))}
    missing = [p for p in prompt_ids if p not in refs]
    if missing:
        raise ValueError(f"{pairs_path}: no reference answer for eval prompt(s) {missing[:3]}")
    rows = [fit(p, tok.encode(refs[pid]["chosen"]) + [tok.assistant_end_id], max_len)[0]
            for pid, p in zip(prompt_ids, ids)]
    return rows, [len(p) for p in ids]


def reference_logprob(model: GPT, rows: list[list[int]], prompt_lens: list[int], device: str) -> list[float]:
    """Mean log-probability per token of each reference answer (<|assistant_end|> included) under the model."""
    total = response_logprob(model, rows, prompt_lens, device=device)
    return [float(t) / max(1, len(r) - n) for t, r, n in zip(total.tolist(), rows, prompt_lens)]


def sample_model(name: str, model: GPT, tok: Tokenizer, rm: RewardModel, prompts: pd.DataFrame,
                 ids: list[list[int]], seeds: int, samples_per_prompt: int, max_new_tokens: int, temperature: float,
                 top_p: float, seed: int, device: str, ref_logprob: list[float] | None = None) -> list[dict]:
    """One row per response: model, prompt_id, seed, sample_idx, text, reward, prompt (and ref_logprob)."""
    rows = []
    for s in range(seeds):
        # common random numbers: every model draws with the same generator state per seed
        g = torch.Generator(device=device).manual_seed(stable_seed(seed, "eval", s))
        out = generate(model, ids, samples_per_prompt, max_new_tokens, temperature=temperature, top_p=top_p,
                       stop_id=tok.assistant_end_id, pad_id=tok.bos_id, generator=g)
        rewards = score_samples(rm, ids, out, tok.bos_id, standardise=True)
        for n, text in enumerate(completion_texts(out, tok)):
            p = n // samples_per_prompt
            rows.append({"model": name, "prompt_id": prompts["prompt_id"][p], "seed": s,
                         "sample_idx": n % samples_per_prompt, "text": text, "reward": float(rewards[n]),
                         "prompt": prompts["prompt"][p][-1]["content"],
                         **({"ref_logprob": ref_logprob[p]} if ref_logprob is not None else {})})
    return rows


@torch.no_grad()
def embed_texts(model: GPT, tok: Tokenizer, texts: list[str], device: str, batch_size: int = 256) -> list:
    """One unit vector per text: the model's final hidden states over the text's tokens (and <|assistant_end|>,
    so an empty text has one), mean-pooled. With one fixed model for every evaluated model's responses, a
    similarity between them does not depend on which models are evaluated."""
    rows = [(tok.encode(t) + [tok.assistant_end_id])[-model.config.seq_len:] for t in texts]
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i]), i))  # similar lengths batched: little padding
    out: list = [None] * len(rows)
    for i in range(0, len(order), batch_size):
        chunk = order[i:i + batch_size]
        ids, key_mask = left_pad([rows[j] for j in chunk], tok.bos_id, device)
        h = model.hidden(ids, key_mask=key_mask).float()
        pooled = (h * key_mask[..., None]).sum(1) / key_mask.sum(1, keepdim=True)
        for j, v in zip(chunk, torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()):
            out[j] = v
    return out


def sample_models(models: dict[str, Path], tok: Tokenizer, rm: RewardModel, prompts: pd.DataFrame,
                  ids: list[list[int]], pairs_path: Path | None, seeds: int, samples_per_prompt: int,
                  max_new_tokens: int, temperature: float, top_p: float, seed: int, device: str,
                  drawn: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
    """sample_model for every checkpoint dir of `models` ({name: dir}); with pairs_path, each row also carries
    the model's log-likelihood of its prompt's reference answer (capability kept?). drawn: {name: rows} a
    model already drew with this very sampler (same generators, so sampling again gives the same rows): reused."""
    rows, ref, drawn = [], None, drawn or {}
    bar = Progress(len(models), "eval", unit="model")
    for name, ckpt in models.items():
        model, _ = load_model(Path(ckpt), device, tok.digest)
        ll = None
        if pairs_path is not None:
            if ref is None:
                ref = reference_token_ids(pairs_path, tok, prompts["prompt_id"].tolist(), ids, model.config.seq_len)
            ll = reference_logprob(model, *ref, device)
        if name in drawn:
            at = {pid: i for i, pid in enumerate(prompts["prompt_id"])}
            rows += [r | {"model": name} | ({"ref_logprob": ll[at[r["prompt_id"]]]} if ll is not None else {})
                     for r in drawn[name].to_dict("records")]
        else:
            rows += sample_model(name, model, tok, rm, prompts, ids, seeds, samples_per_prompt, max_new_tokens,
                                 temperature, top_p, seed, device, ll)
        bar.update(1)
        bar.log(f"eval: sampled {name} ({len(prompts)} prompts x {seeds} seeds x {samples_per_prompt})")
    bar.close()
    return pd.DataFrame(rows)
