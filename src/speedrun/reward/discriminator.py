"""The discriminator of the adversarial cycle: a GPT trunk (initialised from the policy it must catch) with a
natural-vs-generated head on its final hidden states.

head="token" (default, ELECTRA-style): one logit per token, P(token is natural), from the hidden states of the
  token and of its predecessor (the state that predicted it); trained with per-token BCE, and the mean of its
  per-token probabilities estimates K/N. A learned per-position prior is added (see __init__).
head="pooled" (the seed's design, for comparison): a two-way [natural, generated] head on the last token's
  hidden state; its softmax's P(natural) is trained with a soft cross-entropy against K/N.
Both heads return a log-odds of "natural" (token: [B, T]; pooled: [B], z_natural - z_generated).

The trunk is frozen except its last `train_last_blocks` blocks. Training feeds cached activations of the frozen
part (prefix()) to from_prefix(); scoring calls forward(), which goes through GPT.hidden. A test checks both agree.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from speedrun.common import UserError, torch_load
from speedrun.model import GPT, GPTConfig, norm, rotary
from speedrun.train.checkpoint import load_meta, save_model

HEADS = ("token", "pooled")
REWARDS = ("prob", "logit")


class Discriminator(nn.Module):
    def __init__(self, trunk: GPT, head: str = "token", train_last_blocks: int = 0, seq_len: int | None = None):
        super().__init__()
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {head!r}")
        depth = trunk.config.depth
        if not 0 <= train_last_blocks <= depth:
            raise ValueError(f"train_last_blocks={train_last_blocks} must be in [0, {depth}]")
        self.kind, self.n_frozen = head, depth - train_last_blocks
        self.seq_len = seq_len or trunk.config.seq_len  # N: the length of the sequences it is trained on
        trunk.lm_head = nn.Identity()  # next-token logits are never needed: drop 1/5 of the parameters
        self.trunk = trunk
        C = trunk.config.n_embd
        # token head input: [state that predicted the token, the token's own state]; a causal state alone says
        # what came so far, the pair says whether this token fits what came before it
        self.head = nn.Sequential(nn.Linear(2 * C if head == "token" else C, C), nn.ReLU(),
                                  nn.Linear(C, 1 if head == "token" else 2))
        nn.init.zeros_(self.head[2].weight)  # every score starts at the prior (token) or 0.5 (pooled)
        nn.init.zeros_(self.head[2].bias)
        # token head: a log-odds per position, initialised to the prior of K uniform in [0, N],
        # P(token t natural) = P(K > t) = (N - t) / (N + 1), then learned. The trunk (rotary, causal) only
        # sees relative positions: its hidden states alone hardly learn this prior.
        t = torch.arange(self.seq_len if head == "token" else 0, dtype=torch.float32)
        self.pos_bias = nn.Parameter(torch.log((self.seq_len - t) / (t + 1)))
        trunk.requires_grad_(False)
        for block in trunk.blocks[self.n_frozen:]:
            block.requires_grad_(True)

    def _logits(self, h: Tensor, prior: bool = True) -> Tensor:
        """Log-odds of natural from final hidden states [B, T, C]: [B, T] (token) or [B] (pooled)."""
        if self.kind == "token":
            T = h.size(1)
            if T > self.seq_len:
                raise ValueError(f"sequence of {T} tokens is longer than the discriminator's {self.seq_len}")
            prev = F.pad(h[:, :-1], (0, 0, 1, 0))  # zeros before the first token
            z = self.head(torch.cat([prev, h], -1)).squeeze(-1).float()
            return z + self.pos_bias[:T] if prior else z
        z = self.head(h[:, -1]).float()  # the last token summarises the sequence
        return z[:, 0] - z[:, 1]  # softmax([z0, z1])[0] = sigmoid(z0 - z1)

    def forward(self, idx: Tensor, prior: bool = True) -> Tensor:
        """Log-odds of natural for unpadded token ids [B, T]. prior=False leaves out the token head's position
        prior: the evidence of the text alone, at even odds (what the GRPO reward uses)."""
        return self._logits(self.trunk.hidden(idx), prior)

    def _rotary(self, T: int, device: torch.device) -> tuple[Tensor, Tensor]:
        return rotary(torch.arange(T, device=device)[None], self.trunk.config.head_dim)

    @torch.no_grad()
    def prefix(self, idx: Tensor) -> Tensor:
        """Activations [B, T, C] after the frozen blocks: computed once, reused every training step."""
        cos, sin = self._rotary(idx.size(1), idx.device)
        x = norm(self.trunk.wte(idx))
        for block in self.trunk.blocks[:self.n_frozen]:
            x = block(x, cos, sin, None, None)
        return x

    def from_prefix(self, x: Tensor) -> Tensor:
        """The trainable part: the last blocks, the final norm and the head; equals forward() on the ids."""
        cos, sin = self._rotary(x.size(1), x.device)
        for block in self.trunk.blocks[self.n_frozen:]:
            x = block(x, cos, sin, None, None)
        return self._logits(norm(x))

    def loss_sum(self, logits: Tensor, target: Tensor) -> Tensor:
        """Summed BCE: token head against per-token labels [B, T]; pooled head against K/N [B]."""
        return F.binary_cross_entropy_with_logits(logits, target.to(logits.dtype), reduction="sum")


def k_fraction(logits: Tensor) -> Tensor:
    """Estimated K/N per sequence [B]: the mean per-token P(natural), or the pooled P(natural)."""
    p = torch.sigmoid(logits)
    return p.mean(1) if p.dim() == 2 else p


def switch_points(logits: Tensor) -> Tensor:
    """Estimated K per sequence [B] from per-token logits [B, T]: the K of the most likely step function
    (natural before K, generated from K on) under the per-token probabilities."""
    if logits.dim() != 2:
        raise ValueError("switch_points needs per-token logits [B, T]")
    zero = logits.new_zeros(logits.size(0), 1)
    nat = torch.cat([zero, F.logsigmoid(logits).cumsum(1)], 1)  # log P(first k natural), k = 0..T
    gen = torch.cat([zero, F.logsigmoid(-logits).cumsum(1)], 1)  # log P(first k generated)
    return (nat + gen[:, -1:] - gen).argmax(1)  # first k of the highest likelihood


def completion_reward(logits: Tensor, starts: Tensor, kind: str = "prob") -> Tensor:
    """GRPO reward per sequence [B]: the mean over positions >= start (the completion) of P(natural)
    (kind="prob") or of log D/(1-D) (kind="logit"). A pooled head scores the whole sequence instead."""
    if kind not in REWARDS:
        raise ValueError(f"reward kind must be one of {REWARDS}, got {kind!r}")
    score = torch.sigmoid(logits) if kind == "prob" else logits
    if logits.dim() == 1:
        return score
    pos = torch.arange(logits.size(1), device=logits.device)[None]
    m = (pos >= starts.to(logits.device)[:, None]).to(score.dtype)
    if bool((m.sum(1) == 0).any()):
        raise ValueError("a sequence has an empty completion (start >= length)")
    return (score * m).sum(1) / m.sum(1)


def auc(pos: Tensor, neg: Tensor) -> float | None:
    """P(score of a positive > score of a negative), ties count one half; None without both classes."""
    if pos.numel() == 0 or neg.numel() == 0:
        return None
    diff = pos.double()[:, None] - neg.double()[None]
    return float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())


@torch.no_grad()
def metrics(logits: Tensor, ks: Tensor, pure: Tensor | None, n: int) -> dict[str, float | None]:
    """Held-out metrics from the logits of N-token sequences with known K: MAE of K/N, the MAE of always
    predicting the mean K/N (the bar to beat), AUC of pure natural vs pure generated rows by estimated K/N,
    switch-point error in tokens, and (token head) per-token accuracy. MAE/switch use the non-pure rows."""
    frac, target = k_fraction(logits).cpu().double(), ks.cpu().double() / n
    uniform = ~pure.cpu() if pure is not None else torch.ones_like(ks, dtype=torch.bool)
    k_hat = switch_points(logits).cpu() if logits.dim() == 2 else (frac * n).round().long()
    out = {"mae_k_frac": float((frac - target)[uniform].abs().mean()),
           "mae_k_frac_baseline": float((target[uniform] - target[uniform].mean()).abs().mean()),
           "auc_pure": auc(frac[ks.cpu() == n], frac[ks.cpu() == 0]),
           "switch_error_tokens": float((k_hat - ks.cpu())[uniform].abs().double().mean()),
           "n_rows": int(ks.numel()), "n_pure_natural": int((ks == n).sum()), "n_pure_generated": int((ks == 0).sum())}
    if logits.dim() == 2:
        labels = torch.arange(n)[None] < ks.cpu()[:, None]
        out["token_accuracy"] = float(((logits.cpu() > 0) == labels).double().mean())
    return out


def save_discriminator(out_dir: Path, disc: Discriminator, meta: dict) -> None:
    save_model(out_dir, disc.state_dict(), disc.trunk.config, {**meta, "head": disc.kind, "seq_len": disc.seq_len,
               "train_last_blocks": disc.trunk.config.depth - disc.n_frozen})


def load_discriminator(ckpt_dir: Path, device: str = "cpu", tokenizer_digest: str | None = None
                       ) -> tuple[Discriminator, dict]:
    """A saved discriminator, frozen, in eval mode on device; checks the tokenizer it was trained with."""
    meta = load_meta(ckpt_dir)
    if tokenizer_digest and meta.get("tokenizer") not in (None, tokenizer_digest):
        raise UserError(f"{ckpt_dir}: trained with tokenizer {meta['tokenizer']}, not {tokenizer_digest}")
    disc = Discriminator(GPT(GPTConfig(**meta["config"])), meta["head"], meta["train_last_blocks"], meta["seq_len"])
    disc.load_state_dict(torch_load(Path(ckpt_dir) / "model.pt"))
    return disc.to(device).eval().requires_grad_(False), meta
