"""Stage eval_diversity: sample the SFT model and every GRPO run (grpo.variants x grpo.seeds) on the held-out
prompts (same seeds, same sampler), score them, compare the variants over their training seeds, write the report."""
from pathlib import Path

import pandas as pd
import torch
import typer

from speedrun import params as params_lib
from speedrun import tokenizer as tokenizer_lib
from speedrun.common import pick_device, read_json, write_json, write_parquet
from speedrun.eval.compare import evaluate, flat_metrics
from speedrun.eval.report import write_report
from speedrun.eval.sampling import run_name, sample_models
from speedrun.reward.preference import RewardModel
from speedrun.rl.density import group_shares
from speedrun.rl.prompts import load_prompts
from speedrun.cli import stage_flags

def rm_summary(rm_dir: Path) -> str:
    """The RM's held-out accuracy, flagged when it is constant or near chance: then GRPO had little to follow."""
    meta = read_json(rm_dir / "meta.json")
    val = meta["val"]
    line = f"val pairwise accuracy {val['val_acc']:.3f} on held-out pairs (word-overlap baseline {val['baseline_acc']:.3f})"
    kinds = {k: v for k, v in val.get("by_kind", {}).items() if k != "all"}
    if len(kinds) > 1:  # e.g. sft_sample (reference vs the SFT model's own answer), hard, random
        line += "; per kind: " + ", ".join(f"{k} {v['acc']:.3f} (baseline {v['baseline_acc']:.3f}, {v['pairs']} pairs)"
                                           for k, v in kinds.items())
    if meta["reward_std"] == 0:
        line += (" — **constant: every reward is equal, every GRPO advantage is 0, both GRPO runs are the SFT model, "
                 "and any density − baseline difference below is sampling noise**")
    elif val["val_acc"] < 0.55:
        line += (" — **near chance: GRPO optimised a score that barely tracks which answer is right; the differences "
                 "below show how each sampler behaves under that score, not under a good reward**")
    return line


@stage_flags()
def main(prompts: Path, pairs: Path, tokenizer_dir: Path, rm_dir: Path, sft_dir: Path, runs_dir: Path, params: Path,
         comparisons: str, primary: str, reward_margin: float, max_prompts: int, max_prompt_len: int,
         samples_per_prompt: int, seeds: int, max_new_tokens: int, temperature: float, top_p: float, n_boot: int,
         seed: int, device: str, samples_out: Path, metrics: Path, result_out: Path, report: Path,
         fig_dir: Path) -> None:
    sampling, seeds_trained = params_lib.grpo_variants(params_lib.load(params), str(params))
    pairs_list = [tuple(c.split(":")) for c in comparisons.split(",") if c]
    for c in pairs_list:
        if len(c) != 2 or any(v not in sampling for v in c):
            raise typer.BadParameter(f"--comparisons: {':'.join(c)!r} is not a:b of variants {sorted(sampling)}")
    dev = pick_device(device)
    tok = tokenizer_lib.load(tokenizer_dir)
    df, ids = load_prompts(prompts, tok, "eval", max_prompt_len)
    order = df.sort_values("prompt_id").index[: max_prompts or None]
    df, ids = df.loc[order].reset_index(drop=True), [ids[i] for i in order]
    rm = RewardModel.load(rm_dir, dev, tok.digest)
    models = {"sft": sft_dir} | {run_name(v, s): runs_dir / f"{v}_s{s}" for v in sampling for s in seeds_trained}
    samples = sample_models(models, tok, rm, df, ids, pairs, seeds, samples_per_prompt, max_new_tokens, temperature,
                            top_p, seed, dev)
    write_parquet(samples_out, samples)
    variants = {v: [run_name(v, s) for s in seeds_trained] for v in sampling}
    result = evaluate(samples, variants, pairs_list, reference="sft", primary=[p for p in primary.split(",") if p],
                      reward_margin=reward_margin, n_boot=n_boot, seed=seed)
    write_json(result_out, result)
    write_json(metrics, flat_metrics(result))
    logs, weights = {}, {}
    for v in sampling:
        for s in seeds_trained:
            logs[run_name(v, s)] = pd.read_csv(runs_dir / f"{v}_s{s}" / "log.csv")
        w = pd.read_parquet(runs_dir / f"{v}_s{seeds_trained[0]}" / "weights.parquet")  # same for every seed
        weights[v] = group_shares(torch.tensor(w["weight"].to_numpy()), w["group"].tolist())
    setup = {"models": {k: str(v) for k, v in models.items()}, "eval prompts": len(df), "seeds": seeds,
             "samples per prompt": samples_per_prompt,
             "sampler": f"temperature {temperature}, top-p {top_p}, max {max_new_tokens} new tokens",
             "bootstrap draws": n_boot, "reward model": rm_summary(rm_dir)}
    extra = ["## Adversarial track\n\nSee [adversarial.md](adversarial.md)."]
    md = write_report(result, samples, logs, weights, report, fig_dir, setup, extra_sections=extra)
    print("eval: " + "\n".join(line for line in md.splitlines()[2:2 + len(pairs_list)]))


if __name__ == "__main__":
    typer.run(main)
