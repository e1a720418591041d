"""What the evaluation measures on each model: sampled responses with their RM reward (same prompts, same
sampling seeds, same draws for every model), the log-likelihood of the held-out reference answers, and how much of
it the model owes to the answer's own prompt (does it read its prompt?)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from speedrun.common import UserError, files_digest, read_parquet, stable_hash, stable_seed, write_parquet
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
    rows = read_parquet(pairs_path).to_dict("records")
    refs = {r["prompt_id"]: r for r in reference_answers(rows, str(pairs_path))}
    missing = [p for p in prompt_ids if p not in refs]
    if missing:
        raise UserError(f"{pairs_path}: no reference answer for eval prompt(s) {missing[:3]}")
    rows = [fit(p, tok.encode(refs[pid]["chosen"]) + [tok.assistant_end_id], max_len)[0]
            for pid, p in zip(prompt_ids, ids)]
    return rows, [len(p) for p in ids]


def reference_logprob(model: GPT, rows: list[list[int]], prompt_lens: list[int], device: str) -> list[float]:
    """Mean log-probability per token of each reference answer (<|assistant_end|> included) under the model."""
    total = response_logprob(model, rows, prompt_lens, device=device)
    return [float(t) / max(1, len(r) - n) for t, r, n in zip(total.tolist(), rows, prompt_lens)]


PROMPT_GAIN = 0.05  # nats/token of a model that reads its prompt: a 60-token answer 20x likelier under its own question


def swapped_prompt_rows(rows: list[list[int]], prompt_lens: list[int], max_len: int) -> tuple:
    """Each reference answer under its own prompt and under the next row's prompt (a cyclic shift, so never its own),
    the answer cut to the same tokens in both: (own rows, own prompt lengths, other rows, other prompt lengths)."""
    if len(rows) < 2:
        raise ValueError(f"a prompt swap needs at least 2 prompts, got {len(rows)}")
    prompts = [r[:k] for r, k in zip(rows, prompt_lens)]
    others = prompts[1:] + prompts[:1]
    own, other = [], []
    for p, q, r, k in zip(prompts, others, rows, prompt_lens):
        longer = p if len(p) >= len(q) else q
        answer = fit(longer, r[k:], max_len)[0][len(longer):]  # what fits after the longer of the two prompts
        own.append(p + answer)
        other.append(q + answer)
    return own, [len(p) for p in prompts], other, [len(q) for q in others]


def prompt_gain(model: GPT, swapped: tuple, device: str) -> list[float]:
    """Does a model read its prompt? Per answer of swapped_prompt_rows: mean log-probability per token under its own
    prompt minus under another prompt (nats/token). About 0 when the model's answers do not depend on the question."""
    own_rows, own_lens, other_rows, other_lens = swapped
    own = response_logprob(model, own_rows, own_lens, device=device)
    other = response_logprob(model, other_rows, other_lens, device=device)
    return [float(a - b) / max(1, len(r) - n) for a, b, r, n in zip(own.tolist(), other.tolist(), own_rows, own_lens)]


def prompt_gain_summary(gains: list[float]) -> dict:
    """Mean prompt gain over prompts with its 95% interval (normal, over prompts)."""
    g = np.asarray(gains, dtype=np.float64)
    mean = float(g.mean())
    half = 1.96 * float(g.std(ddof=1)) / len(g) ** 0.5 if len(g) > 1 else float("nan")
    return {"gain": mean, "ci_low": mean - half, "ci_high": mean + half, "prompts": len(g)}


def sample_model(name: str, model: GPT, tok: Tokenizer, rm: RewardModel, prompts: pd.DataFrame,
                 ids: list[list[int]], seeds: int, samples_per_prompt: int, max_new_tokens: int, temperature: float,
                 top_p: float, seed: int, device: str, per_prompt: dict[str, list[float]] | None = None) -> list[dict]:
    """One row per response: model, prompt_id, seed, sample_idx, text, reward, prompt, and per_prompt's values
    ({column: one value per prompt}, e.g. ref_logprob)."""
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
                         **{k: v[p] for k, v in (per_prompt or {}).items()}})
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


def resume_file(resume: Path | None, fingerprint: str, name: str, ckpt: Path, *settings) -> Path | None:
    """Where a killed evaluation keeps one model's finished answers: under a key of the caller's settings and inputs
    (`fingerprint`), the model's name, checkpoint and own settings. None without a resume dir (the checkpoint is hashed
    only when there is somewhere to resume from)."""
    if resume is None:
        return None
    key = stable_hash(fingerprint, name, *settings, files_digest(Path(ckpt) / "model.pt"))
    return Path(resume) / f"{name}-{key}.parquet"


def sample_models(models: dict[str, Path], tok: Tokenizer, rm: RewardModel, prompts: pd.DataFrame,
                  ids: list[list[int]], pairs_path: Path | None, seeds: int, samples_per_prompt: int,
                  max_new_tokens: int, temperature: float, top_p: float, seed: int, device: str,
                  drawn: dict[str, pd.DataFrame] | None = None, resume: Path | None = None,
                  fingerprint: str = "") -> pd.DataFrame:
    """sample_model for every checkpoint dir of `models` ({name: dir}); with pairs_path, each row also carries
    the model's log-likelihood of its prompt's reference answer (capability kept?) and its prompt gain on that answer
    (does the model read its prompt? prompt_gain). drawn: {name: rows} a model already drew with this very
    sampler (same generators, so sampling again gives the same rows): reused. resume: a scratch dir where each
    finished model's rows are kept under a key of `fingerprint` (the caller's settings and inputs), the model's name,
    checkpoint and temperature: a killed evaluation's rerun reads them back instead of sampling again."""
    rows, ref, swapped, drawn = [], None, None, drawn or {}
    bar = Progress(len(models), "eval", unit="model")
    for name, ckpt in models.items():
        done = resume_file(resume, fingerprint, name, ckpt, temperature, pairs_path is not None)
        if done is not None and done.exists():
            rows += read_parquet(done).to_dict("records")
            bar.update(1)
            bar.log(f"eval: {name} read back from {done} (sampled before the last run stopped)")
            continue
        model, _ = load_model(Path(ckpt), device, tok.digest)
        per_prompt = {}
        if pairs_path is not None:
            if ref is None:
                ref = reference_token_ids(pairs_path, tok, prompts["prompt_id"].tolist(), ids, model.config.seq_len)
                swapped = swapped_prompt_rows(*ref, model.config.seq_len)
            per_prompt = {"ref_logprob": reference_logprob(model, *ref, device),
                          "prompt_gain": prompt_gain(model, swapped, device)}
        if name in drawn:
            at = {pid: i for i, pid in enumerate(prompts["prompt_id"])}
            mine = [r | {"model": name} | {k: v[at[r["prompt_id"]]] for k, v in per_prompt.items()}
                    for r in drawn[name].to_dict("records")]
        else:
            mine = sample_model(name, model, tok, rm, prompts, ids, seeds, samples_per_prompt, max_new_tokens,
                                temperature, top_p, seed, device, per_prompt)
        if done is not None:
            write_parquet(done, pd.DataFrame(mine))
        rows += mine
        bar.update(1)
        bar.log(f"eval: sampled {name} ({len(prompts)} prompts x {seeds} seeds x {samples_per_prompt})")
    bar.close()
    return pd.DataFrame(rows)
