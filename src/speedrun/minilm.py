"""all-MiniLM-L6-v2 in plain torch: a 6-layer BERT read from its safetensors file, its tokens from its tokenizer.json
(the `tokenizers` library), mean-pooled over the real tokens and normalised, as the sentence-transformers pipeline
of the model's modules.json (Transformer, mean Pooling, Normalize) computes it. Why not that library: importing it
costs about 5 s of CPU (scikit-learn, scipy, transformers), paid by every process that embeds, several times the
embedding itself at the lab's sizes. tests/test_semantic.py checks these embeddings against sentence-transformers'."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tokenizers import Tokenizer
from speedrun.common import UserError

MODULES = ["sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
           "sentence_transformers.models.Normalize"]


class MiniLM:
    """encode(texts) -> unit embeddings [N, 384], float32; the texts run longest first in batches padded to their
    longest (sentence-transformers' order), so a text's bits depend on the batch it falls in, not on the call."""

    def __init__(self, path: Path, device: str = "cpu"):
        read = lambda name: json.loads((path / name).read_text())  # noqa: E731
        cfg, pooling = read("config.json"), read("1_Pooling/config.json")
        if [m["type"] for m in read("modules.json")] != MODULES or not pooling["pooling_mode_mean_tokens"] or \
                cfg["hidden_act"] != "gelu" or cfg["position_embedding_type"] != "absolute":
            raise UserError(f"{path}: not a mean-pooled, normalised BERT encoder with GELU and absolute positions")
        self.heads, self.layers, self.eps = cfg["num_attention_heads"], cfg["num_hidden_layers"], cfg["layer_norm_eps"]
        self.w = {k: v.to(device) for k, v in load_file(path / "model.safetensors").items()}
        self.tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tok.enable_truncation(read("sentence_bert_config.json")["max_seq_length"])
        self.tok.enable_padding(pad_id=cfg["pad_token_id"], pad_token="[PAD]")
        self.device = device

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[f"{name}.weight"], self.w[f"{name}.bias"])

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.w[f"{name}.weight"], self.w[f"{name}.bias"], self.eps)

    def _block(self, x: torch.Tensor, mask: torch.Tensor, i: int) -> torch.Tensor:
        B, T, C = x.shape
        p = f"encoder.layer.{i}."
        q, k, v = (self._linear(x, p + f"attention.self.{n}").view(B, T, self.heads, -1).transpose(1, 2)
                   for n in ("query", "key", "value"))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(B, T, C)
        x = self._norm(self._linear(a, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        h = F.gelu(self._linear(x, p + "intermediate.dense"))
        return self._norm(self._linear(h, p + "output.dense") + x, p + "output.LayerNorm")

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Unit embeddings [B, C] of token ids [B, T] whose real tokens are `keep` (1) and padding 0."""
        e = "embeddings."
        x = self.w[e + "word_embeddings.weight"][ids] + self.w[e + "token_type_embeddings.weight"][0]
        x = self._norm(x + self.w[e + "position_embeddings.weight"][:ids.shape[1]], e + "LayerNorm")
        mask = keep.bool()[:, None, None, :]  # every query attends to the real tokens only
        for i in range(self.layers):
            x = self._block(x, mask, i)
        m = keep.unsqueeze(-1).to(x.dtype)
        unit = F.normalize((x * m).sum(1, dtype=x.dtype) / m.sum(1, dtype=x.dtype).clamp(min=1e-9), p=2, dim=1)
        return F.normalize(unit, p=2, dim=1)  # twice, as the pipeline's Normalize and then encode() do: the same bits

    def encode(self, texts: list[str], batch_size: int = 256) -> np.ndarray:
        order = np.argsort([-len(t) for t in texts])
        out = []
        for start in range(0, len(texts), batch_size):
            batch = self.tok.encode_batch([texts[i] for i in order[start:start + batch_size]])
            ids, keep = (torch.tensor([getattr(b, f) for b in batch], device=self.device)
                         for f in ("ids", "attention_mask"))
            out.append(self.forward(ids, keep).float().cpu())
        emb = torch.cat(out).numpy() if out else np.zeros((0, 0), dtype=np.float32)
        return emb[np.argsort(order)]
