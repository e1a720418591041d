"""Stage eval_diversity: sample the SFT model and every GRPO run (grpo.variants x grpo.seeds) on the held-out
prompts (same seeds, same sampler), score them, compare the variants over their training seeds, write the report."""
from pathlib import Path

import pandas as pd
import torch

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import pick_device, read_json, write_json, write_parquet
from speedrun.eval.compare import evaluate, flat_metrics
from speedrun.eval.report import write_report
from speedrun.eval.sampling import run_name, sample_models
from speedrun.reward.preference import RewardModel
from speedrun.rl.density import group_shares
from speedrun.rl.prompts import load_prompts
from speedrun.stage import run_stage

READS = ("seed", "compute.device", "eval", "grpo.variants", "grpo.seeds")
PATHS = {"prompts": "data/prompts/prompts.parquet", "pairs": "data/prompts/pairs.parquet",
         "tokenizer_dir": "outs/tokenizer", "rm_dir": "outs/rm", "sft_dir": "outs/sft", "runs_dir": "outs/grpo",
         "samples_out": "outs/eval/samples.parquet", "result_out": "outs/eval/result.json",
         "metrics": "reports/metrics/diversity.json", "report": "reports/report.md", "fig_dir": "reports/figures"}


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


def main(p, io) -> None:
    c = p.eval
    sampling = {name: v.sampling for name, v in p.grpo.variants.items()}
    seeds_trained = p.grpo.seeds
    pairs_list = [tuple(x.split(":")) for x in c.comparisons.split(",") if x]
    for x in pairs_list:
        if len(x) != 2 or any(v not in sampling for v in x):
            raise SystemExit(f"error: params.yaml: eval.comparisons: {':'.join(x)!r} is not a:b of variants "
                             f"{sorted(sampling)}")
    dev = pick_device(p.compute.device)
    tok = tokenizer_lib.load(io.tokenizer_dir)
    df, ids = load_prompts(io.prompts, tok, "eval", c.max_prompt_len)
    order = df.sort_values("prompt_id").index[: c.max_prompts or None]
    df, ids = df.loc[order].reset_index(drop=True), [ids[i] for i in order]
    rm = RewardModel.load(io.rm_dir, dev, tok.digest)
    models = {"sft": io.sft_dir} | {run_name(v, s): io.runs_dir / f"{v}_s{s}" for v in sampling for s in seeds_trained}
    samples = sample_models(models, tok, rm, df, ids, io.pairs, c.seeds, c.samples_per_prompt, c.max_new_tokens,
                            c.temperature, c.top_p, p.seed, dev)
    write_parquet(io.samples_out, samples)
    variants = {v: [run_name(v, s) for s in seeds_trained] for v in sampling}
    result = evaluate(samples, variants, pairs_list, reference="sft", primary=[x for x in c.primary.split(",") if x],
                      reward_margin=c.reward_margin, n_boot=c.n_boot, seed=p.seed)
    write_json(io.result_out, result)
    write_json(io.metrics, flat_metrics(result))
    logs, weights = {}, {}
    for v in sampling:
        for s in seeds_trained:
            logs[run_name(v, s)] = pd.read_csv(io.runs_dir / f"{v}_s{s}" / "log.csv")
        w = pd.read_parquet(io.runs_dir / f"{v}_s{seeds_trained[0]}" / "weights.parquet")  # same for every seed
        weights[v] = group_shares(torch.tensor(w["weight"].to_numpy()), w["group"].tolist())
    setup = {"models": {k: str(v) for k, v in models.items()}, "eval prompts": len(df), "seeds": c.seeds,
             "samples per prompt": c.samples_per_prompt,
             "sampler": f"temperature {c.temperature}, top-p {c.top_p}, max {c.max_new_tokens} new tokens",
             "bootstrap draws": c.n_boot, "reward model": rm_summary(io.rm_dir)}
    extra = ["## Adversarial track\n\nSee [adversarial.md](adversarial.md)."]
    md = write_report(result, samples, logs, weights, io.report, io.fig_dir, setup, extra_sections=extra)
    print("eval: " + "\n".join(line for line in md.splitlines()[2:2 + len(pairs_list)]))


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
