"""Does the reward model pay more for a shorter answer on the prompts density sampling draws?

Per train prompt, the SFT model's own sample (the on-policy pairs' rejected answer, at least four words) is scored by
the RM whole and cut to its first half of words; the premium is reward(half) - reward(whole), standardised RM units.
Printed: its mean over prompts under uniform weights and under a density run's weights, and their difference with a
95% bootstrap interval over prompts. Run from the repository root, on the
workspace's run or an experiment's (after `dvc exp apply NAME`, which checks its outputs out of the DVC cache):
python analysis/brevity_premium.py outs/tokenizer outs/rm data/onpolicy/pairs.parquet \
    outs/grpo/density_s1/weights.parquet
"""
import sys

import numpy as np
import pandas as pd
import torch

from speedrun import tokenizer as tokenizer_lib
from speedrun.reward.preference import RewardModel, score_conversations

tok_dir, rm_dir, pairs_path, weights_path = sys.argv[1:5]
torch.set_num_threads(2)
tok, rm = tokenizer_lib.load(tok_dir), RewardModel.load(rm_dir)
w = pd.read_parquet(weights_path).set_index("prompt_id").weight
d = pd.read_parquet(pairs_path)
d = d[d.prompt_id.isin(w.index) & (d.rejected.map(lambda t: len(t.split())) >= 4)].reset_index(drop=True)
half = d.rejected.map(lambda t: " ".join(t.split()[: len(t.split()) // 2]))
msgs = [[{"role": m["role"], "content": m["content"]} for m in p] for p in d.prompt]
whole_r = score_conversations(rm, tok, msgs, d.rejected.tolist(), standardise=True).numpy()
premium = score_conversations(rm, tok, msgs, half.tolist(), standardise=True).numpy() - whole_r
ww = w[d.prompt_id].to_numpy() / w[d.prompt_id].sum()
rng = np.random.default_rng(0)
boot = []
for _ in range(2000):  # resample prompts; the density weights renormalised on each draw
    i = rng.integers(0, len(d), len(d))
    boot.append((ww[i] / ww[i].sum() * premium[i]).sum() - premium[i].mean())
lo, hi = np.percentile(boot, [2.5, 97.5])
print(f"{len(d)} prompts; premium for half the words: uniform {premium.mean():+.3f}, "
      f"density {(ww * premium).sum():+.3f}; "
      f"density - uniform {(ww * premium).sum() - premium.mean():+.3f} [{lo:+.3f}, {hi:+.3f}]")
