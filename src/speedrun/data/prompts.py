"""Prompt dedup: one row per unique prompt, near-duplicates merged, and a held-out eval split.

prompt_id = first 16 hex of sha256 of the normalised prompt (NFKC, whitespace collapsed, every
turn with its role). Exact duplicates share an id; near-duplicates (Jaccard of word shingles,
found with MinHash + LSH, confirmed exactly) merge into the earliest prompt by sorted id.

The split (train / val / eval) is made per final prompt, so near-duplicates never straddle it: an embedded prompt
takes its module's split (docstrings.heldout_split, the split SFT uses), a hub prompt a stable hash of its id; a
prompt whose merged pairs disagree takes the most held-out of their splits (eval over val over train).

A prompt's group is what the manipulation check, balanced sampling and the dense-module controls count over: an
embedded prompt's module; a hub prompt, which has none, its cluster of the words embedding (stage dedup_prompts),
not its source."""
from __future__ import annotations

import hashlib
import string
from collections import Counter, defaultdict

import numpy as np
import pandas as pd
import pyarrow as pa

from speedrun.common import SPLITS, chat_messages, normalize_text, require_unique, stable_hash, stable_unit

N_PERM, BANDS = 128, 32  # 32 bands of 4 rows: a pair with Jaccard 0.7 is a candidate with p > 0.999
_P = (1 << 31) - 1  # Mersenne prime: a*x + b stays below 2**63 in uint64
_rng = np.random.default_rng(1234)  # fixed seed: the same shingles give the same signature anywhere
_A = _rng.integers(1, _P, N_PERM).astype(np.uint64)
_B = _rng.integers(0, _P, N_PERM).astype(np.uint64)


def canonical_prompt(messages: list[dict]) -> str:
    """The normalised form ids are computed on: every turn with its role, one line each."""
    return "\n".join(f"{m['role']}: {normalize_text(m['content'])}" for m in messages)


def prompt_id(messages: list[dict]) -> str:
    return stable_hash(canonical_prompt(messages))  # one part: exactly sha256(text)[:16]


def hash_split(pid: str, val_frac: float, eval_frac: float) -> str:
    """The split of a prompt with no module (hub sources)."""
    if stable_unit("eval", pid) < eval_frac:
        return "eval"
    return "val" if stable_unit("val", pid) < val_frac else "train"


def words(canon: str) -> list[str]:
    """Whitespace tokens with outer punctuation stripped; case kept. `json.dumps` stays one word
    and `typing.Final` is not `typing.final`: prompts about two objects are never near-duplicates."""
    return [w for w in (t.strip(string.punctuation) for t in canon.split()) if w]


def shingles(canon: str, k: int = 3) -> np.ndarray:
    """Sorted unique 32-bit hashes of the word k-grams (the whole text if it has no words)."""
    words_ = words(canon)
    grams = [" ".join(words_[i:i + k]) for i in range(max(len(words_) - k + 1, 1))] if words_ else [canon]
    hashes = [int.from_bytes(hashlib.blake2b(g.encode("utf-8"), digest_size=4).digest(), "little") for g in grams]
    return np.unique(np.array(hashes, dtype=np.uint32))


def minhash(sh: np.ndarray) -> np.ndarray:
    x = sh.astype(np.uint64) % _P
    return ((x[:, None] * _A[None, :] + _B[None, :]) % _P).min(axis=0)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)


def near_duplicates(canon: dict[str, str], threshold: float, k: int = 3) -> dict[str, str]:
    """Map every prompt id to its representative. Ids are visited in sorted order; each joins the
    earliest representative with Jaccard >= threshold, or becomes one (no chains of merges)."""
    rows = N_PERM // BANDS
    buckets: dict[tuple[int, bytes], list[str]] = defaultdict(list)
    reps: dict[str, np.ndarray] = {}
    rep_of: dict[str, str] = {}
    for pid in sorted(canon):
        sh = shingles(canon[pid], k)
        sig = minhash(sh)
        keys = [(b, sig[b * rows:(b + 1) * rows].tobytes()) for b in range(BANDS)]
        candidates = sorted({c for key in keys for c in buckets.get(key, ())})
        match = next((c for c in candidates if jaccard(sh, reps[c]) >= threshold), None)
        if match is not None:
            rep_of[pid] = match
            continue
        rep_of[pid] = pid
        reps[pid] = sh
        for key in keys:
            buckets[key].append(pid)
    return rep_of


def build(pairs: pa.Table, val_frac: float, eval_frac: float, threshold: float, k: int = 3, path: str = "pairs"
          ) -> tuple[pd.DataFrame, pa.Table, pd.DataFrame, dict]:
    """(prompts, pairs with prompt_id/split added, pair_id -> prompt_id map, stats). A repeated pair id or a prompt
    that is not a list of text messages stops it, naming `path` and the row."""
    ids = pairs.column("id").to_pylist()
    require_unique(ids, "id", path)
    srcs = pairs.column("src").to_pylist()
    groups = pairs.column("group").to_pylist()
    msgs = [chat_messages(m, f"{path}: row {i}, column 'prompt'")
            for i, m in enumerate(pairs.column("prompt").to_pylist())]
    canon = [canonical_prompt(m) for m in msgs]
    raw = [stable_hash(c) for c in canon]

    # the text and group of a raw prompt come from its pair with the smallest id: row order is irrelevant
    first: dict[str, int] = {}
    for i, r in enumerate(raw):
        if r not in first or ids[i] < ids[first[r]]:
            first[r] = i
    rep = near_duplicates({r: canon[i] for r, i in first.items()}, threshold, k)
    final = [rep[r] for r in raw]

    n_pairs, variants, src_sets = Counter(final), Counter(rep.values()), defaultdict(set)
    split_rank: dict[str, int] = {}
    for f, s, sp in zip(final, srcs, pairs.column("split").to_pylist()):
        src_sets[f].add(s)
        own = sp if s == "embedded" else hash_split(f, val_frac, eval_frac)
        if own not in SPLITS:
            raise ValueError(f"pairs: an embedded pair of prompt {f} has split {own!r}, not one of {SPLITS}")
        split_rank[f] = max(split_rank.get(f, 0), SPLITS.index(own))
    reps = sorted(variants)
    prompts = pd.DataFrame({
        "prompt_id": reps,
        "prompt": [msgs[first[p]] for p in reps],
        "n_pairs": [n_pairs[p] for p in reps],
        "srcs": [sorted(src_sets[p]) for p in reps],
        "split": [SPLITS[split_rank[p]] for p in reps],
        "group": [groups[first[p]] for p in reps],
        "n_variants": [variants[p] for p in reps],  # exact-distinct prompts merged as near-duplicates
    }, columns=["prompt_id", "prompt", "n_pairs", "srcs", "split", "group", "n_variants"])

    split_of = dict(zip(prompts["prompt_id"], prompts["split"]))
    out = pairs.rename_columns(["src_split" if c == "split" else c for c in pairs.column_names])
    out = out.add_column(1, "prompt_id", pa.array(final, pa.string()))
    out = out.add_column(2, "split", pa.array([split_of[f] for f in final], pa.string()))
    id_map = pd.DataFrame({"pair_id": ids, "prompt_id": final, "raw_prompt_id": raw}).sort_values("pair_id")

    is_eval, is_val = prompts["split"] == "eval", prompts["split"] == "val"
    per_source = {}
    for s in sorted(set(srcs)):
        has = prompts["srcs"].map(lambda v, s=s: s in v)
        per_source[s] = {"pairs": srcs.count(s), "prompts": int(has.sum()), "eval_prompts": int((has & is_eval).sum())}
    stats = {
        "total_pairs": len(ids),
        "unique_prompts_exact": len(first),
        "unique_prompts": len(prompts),
        "near_dup_merges": len(first) - len(prompts),
        "near_dup_threshold": threshold,
        "shingle_size": k,
        "val_frac": val_frac,
        "eval_frac": eval_frac,
        "eval_prompts": int(is_eval.sum()),
        "val_prompts": int(is_val.sum()),
        "train_prompts": int((~is_eval & ~is_val).sum()),
        "eval_pairs": int(prompts.loc[is_eval, "n_pairs"].sum()),
        "groups": int(prompts["group"].nunique()),
        "per_source": per_source,
    }
    return prompts, out, id_map, stats
