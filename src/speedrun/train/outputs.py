"""What every training stage writes around the loop: logs for `dvc plots`, throughput, samples."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from speedrun.common import write_text
from speedrun.engine import generate
from speedrun.model import GPT
from speedrun.tokenizer import Tokenizer
from speedrun.train.loop import TrainResult


def write_logs(out_dir: Path, result: TrainResult) -> None:
    """log.csv (per step) and eval.csv (per eval). Wall-clock columns are left out so that a rerun
    writes byte-identical files; throughput goes to the metrics JSON instead."""
    log = pd.DataFrame(result.log).drop(columns=["tokens_per_s"], errors="ignore")
    write_text(Path(out_dir) / "log.csv", log.to_csv(index=False, float_format="%.6g"))
    write_text(Path(out_dir) / "eval.csv", pd.DataFrame(result.evals).to_csv(index=False, float_format="%.6g"))


def throughput(result: TrainResult, flops_per_token: float, peak_flops: float | None = None) -> dict[str, float]:
    tps = result.timed_tokens / max(result.train_seconds, 1e-9)
    out = {"tokens_per_s": round(tps, 1), "model_tflops_per_s": round(tps * flops_per_token / 1e12, 5)}
    if peak_flops:
        out["mfu"] = round(tps * flops_per_token / peak_flops, 4)
    return out


@torch.no_grad()
def sample_texts(model: GPT, tok: Tokenizer, prompts: list[list[int]], max_new_tokens: int, device: str,
                 seed: int, stop_id: int | None = None) -> list[str]:
    """One short sample (temperature 0.8, top-k 50) per prompt, decoded: prompt ⟶ completion."""
    model.eval()
    g = torch.Generator(device=device).manual_seed(seed)
    s = generate(model, prompts, 1, max_new_tokens, temperature=0.8, top_k=50, stop_id=stop_id, generator=g)
    out = []
    for p, row, m in zip(prompts, s.tokens.tolist(), s.mask.tolist()):
        completion = [t for t, keep in zip(row, m) if keep and t != stop_id]
        out.append(tok.decode([t for t in p if t != tok.bos_id]) + " ⟶ " + tok.decode(completion))
    return out
