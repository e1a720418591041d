"""Byte-level BPE: trained with rustbpe, run with tiktoken, saved as a ranks file + JSON (no pickle).
Chat conversations are rendered with special tokens and an assistant-only loss mask."""
from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Iterable, Iterator

import tiktoken

from speedrun.common import UserError, read_json, write_json, write_text

# GPT-4 split pattern, with numbers grouped by at most two digits (small vocabularies waste less on them)
SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)
SPECIAL_TOKENS = ["<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>"]
RANKS_FILE, META_FILE = "tokenizer.ranks", "tokenizer.json"


class Tokenizer:
    """tiktoken Encoding plus the chat template. Plain text never turns into special tokens."""

    def __init__(self, enc: tiktoken.Encoding, digest: str):
        self.enc = enc
        self.digest = digest  # content hash of the saved files: checkpoints record which tokenizer they need
        ids = {t: enc.encode_single_token(t) for t in SPECIAL_TOKENS}
        self.bos_id = ids["<|bos|>"]
        self.user_start_id, self.user_end_id = ids["<|user_start|>"], ids["<|user_end|>"]
        self.assistant_start_id, self.assistant_end_id = ids["<|assistant_start|>"], ids["<|assistant_end|>"]

    @property
    def vocab_size(self) -> int:
        return self.enc.n_vocab

    def encode(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def decode(self, ids: Iterable[int]) -> str:
        return self.enc.decode(list(ids))

    def render_conversation(self, messages: list[dict]) -> tuple[list[int], list[int]]:
        """<|bos|> then each turn wrapped in its role's tokens; mask is 1 exactly on assistant
        tokens (content and its closing <|assistant_end|>, which the model must learn to emit)."""
        ids, mask = [self.bos_id], [0]
        for i, m in enumerate(messages):
            role, content = m["role"], m["content"]
            if role == "system":  # folded into the next user turn: the template has no system role
                continue
            if role == "user":
                if i > 0 and messages[i - 1]["role"] == "system":
                    content = messages[i - 1]["content"] + "\n\n" + content
                body = [self.user_start_id, *self.encode(content), self.user_end_id]
                ids += body
                mask += [0] * len(body)
            elif role == "assistant":
                body = self.encode(content) + [self.assistant_end_id]
                ids += [self.assistant_start_id] + body
                mask += [0] + [1] * len(body)
            else:
                raise ValueError(f"unknown role {role!r} in message {i}")
        return ids, mask

    def render_prompt(self, messages: list[dict]) -> list[int]:
        """Conversation ending in a user turn, primed for the assistant's reply."""
        if not messages or messages[-1]["role"] != "user":
            raise ValueError("a prompt must end with a user message")
        ids, _ = self.render_conversation(messages)
        return ids + [self.assistant_start_id]


def cut_prompt(ids: list[int], max_len: int) -> list[int]:
    """A rendered prompt in at most max_len tokens: its first two (<|bos|> and the first turn's start token: the model
    still sees a chat) and its last max_len - 2 (the end of a long prompt is what the answer depends on). Every
    stage that feeds a prompt to a model (RM training and scoring, sampling, GRPO, evaluation) cuts it here."""
    if max_len < 3:
        raise ValueError(f"a prompt needs at least 3 tokens, got max_len {max_len}")
    return ids if len(ids) <= max_len else ids[:2] + ids[len(ids) - (max_len - 2):]


def train(texts: Iterator[str], vocab_size: int) -> tiktoken.Encoding:
    import rustbpe

    n_special = len(SPECIAL_TOKENS)
    if vocab_size < 256 + n_special + 1:
        raise ValueError(f"vocab_size {vocab_size} must exceed 256 bytes + {n_special} special tokens")
    bpe = rustbpe.Tokenizer()
    bpe.train_from_iterator(texts, vocab_size - n_special, pattern=SPLIT_PATTERN)
    ranks = {bytes(b): r for b, r in bpe.get_mergeable_ranks()}
    return _encoding(ranks)


def _encoding(ranks: dict[bytes, int]) -> tiktoken.Encoding:
    special = {t: len(ranks) + i for i, t in enumerate(SPECIAL_TOKENS)}
    return tiktoken.Encoding(name="speedrun", pat_str=SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=special)


def save(enc: tiktoken.Encoding, out_dir: Path, extra: dict | None = None) -> None:
    """The ranks file and the JSON beside it; `extra`: a checkpoint tokenizer's keys (save_chatml)."""
    ranks = enc._mergeable_ranks  # tiktoken keeps them; we write them in its own .tiktoken format
    lines = "".join(f"{base64.b64encode(b).decode()} {r}\n" for b, r in sorted(ranks.items(), key=lambda x: x[1]))
    write_text(Path(out_dir) / RANKS_FILE, lines)
    write_json(Path(out_dir) / META_FILE, {"pattern": enc._pat_str, "special_tokens": enc._special_tokens,
                                           "vocab_size": enc.n_vocab, **(extra or {})})


def save_chatml(tok: ChatMLTokenizer, out_dir: Path) -> None:
    """A checkpoint's tokenizer in the lab's files: load() reads it back as a ChatMLTokenizer."""
    save(tok.enc, out_dir, {"vocab_size": tok.n_vocab, "template": "chatml", "bos_id": tok.bos_id,
                            "unk_id": tok.unk_id, "default_system": tok.default_system})


def load(path: str | Path) -> Tokenizer:
    """The tokenizer saved in a dir: the lab's own (tokenizer stage), or a checkpoint's with its ChatML template."""
    path = Path(path)
    raw = (path / RANKS_FILE).read_bytes()
    ranks = {}
    for lineno, line in enumerate(raw.decode().splitlines(), 1):
        try:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
        except ValueError as e:
            raise UserError(f"{path / RANKS_FILE} line {lineno}: expected '<base64> <rank>': {e}") from None
    meta = read_json(path / META_FILE)
    enc = tiktoken.Encoding(name="speedrun", pat_str=meta["pattern"], mergeable_ranks=ranks,
                            special_tokens=meta["special_tokens"])
    digest = hashlib.sha256(raw + (path / META_FILE).read_bytes()).hexdigest()[:16]
    if meta.get("template", "lab") == "lab":
        return Tokenizer(enc, digest)
    if meta["template"] != "chatml":
        raise UserError(f"{path / META_FILE}: template {meta['template']!r} is not one the lab renders (lab, chatml)")
    return ChatMLTokenizer(enc, digest, meta["vocab_size"], meta["bos_id"], meta["unk_id"], meta["default_system"])


# A checkpoint's byte-level BPE as tiktoken runs it: each pre-tokenizer the loaders know, written as one pattern.
# GPT-2's split; with its digits first cut one by one (SmolLM2: Digits(individual) then ByteLevel), a digit becomes an
# alternative of its own and a space run before a digit ends there, as it ends a piece in the two-pass split.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
DIGITS_GPT2_PATTERN = r"""\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?=\p{N})|\s+(?!\S)|\s+"""
GGUF_PRE = {"smollm": DIGITS_GPT2_PATTERN, "gpt-2": GPT2_PATTERN, "default": GPT2_PATTERN}


def unicode_bytes() -> dict[str, int]:
    """GPT-2's byte-level alphabet read back: the printable character that stands for each of the 256 bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]  # the rest are moved past 255, in order
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(shifted)}


def checkpoint_encoding(name: str, tokens: list[str], specials: dict[str, int], pattern: str) -> tiktoken.Encoding:
    """A checkpoint's vocabulary (byte-level strings by id, merges in id order) as a tiktoken Encoding whose ranks
    are the checkpoint's ids, so tiktoken's lowest-rank-first merging is the checkpoint's merge order. A byte that
    has no token of its own gets a rank past the vocabulary (ChatMLTokenizer.encode maps it to the unknown token)."""
    to_byte, ranks = unicode_bytes(), {}
    for i, t in enumerate(tokens):
        if t in specials:
            continue
        try:
            ranks[bytes(to_byte[ch] for ch in t)] = i
        except KeyError:
            raise UserError(f"{name}: token {i} {t!r} is not byte-level BPE (a character outside GPT-2's byte "
                             "alphabet): only byte-level vocabularies are supported") from None
    extra = len(tokens)
    for b in range(256):
        if bytes([b]) not in ranks:
            ranks[bytes([b])], extra = extra, extra + 1
    return tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)


class ChatMLTokenizer(Tokenizer):
    """A pretrained checkpoint's tokenizer and its ChatML template (<|im_start|>role\\ncontent<|im_end|>\\n), with
    the template's default system turn when a conversation brings none. The lab's roles map onto it: a turn's
    start is <|im_start|>, the assistant's end (the stop token) is <|im_end|>, padding is the checkpoint's bos."""

    def __init__(self, enc: tiktoken.Encoding, digest: str, vocab_size: int, bos_id: int, unk_id: int,
                 default_system: str = ""):
        self.enc, self.digest, self.n_vocab, self.unk_id = enc, digest, vocab_size, unk_id
        self.default_system = default_system
        self.bos_id = bos_id
        self.user_start_id = self.assistant_start_id = enc.encode_single_token("<|im_start|>")
        self.user_end_id = self.assistant_end_id = enc.encode_single_token("<|im_end|>")

    @property
    def vocab_size(self) -> int:
        return self.n_vocab

    def encode(self, text: str) -> list[int]:
        ids = self.enc.encode_ordinary(text)
        return ids if max(ids, default=0) < self.n_vocab else [i if i < self.n_vocab else self.unk_id for i in ids]

    def turn(self, role: str, content: str) -> list[int]:
        return [self.user_start_id, *self.encode(f"{role}\n{content}"), self.user_end_id, *self.encode("\n")]

    def render_conversation(self, messages: list[dict]) -> tuple[list[int], list[int]]:
        """Every turn in the template; mask 1 on the assistant's content and its <|im_end|> (the stop it learns)."""
        ids, mask = [], []
        if self.default_system and (not messages or messages[0]["role"] != "system"):
            ids += self.turn("system", self.default_system)
            mask += [0] * len(ids)
        for i, m in enumerate(messages):
            if m["role"] not in ("system", "user", "assistant"):
                raise ValueError(f"unknown role {m['role']!r} in message {i}")
            body = self.turn(m["role"], m["content"])
            head = 1 + len(self.encode(m["role"] + "\n"))  # <|im_start|>role\n (one token in ChatML vocabularies)
            ids += body
            mask += [0] * len(body) if m["role"] != "assistant" else [0] * head + [1] * (len(body) - head - 1) + [0]
        return ids, mask

    def render_prompt(self, messages: list[dict]) -> list[int]:
        if not messages or messages[-1]["role"] != "user":
            raise ValueError("a prompt must end with a user message")
        ids, _ = self.render_conversation(messages)
        return ids + [self.assistant_start_id, *self.encode("assistant\n")]
