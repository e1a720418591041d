"""Stage eval_diversity: sample SFT, grpo_density and grpo_baseline on the held-out prompts (same seeds,
same sampler), score them, compare density - baseline with bootstrap intervals, write the report."""
from pathlib import Path

import pandas as pd
import torch
import typer

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import pick_device, read_json, stable_seed, write_json, write_parquet
from speedrun.engine import generate
from speedrun.eval.compare import evaluate, flat_metrics
from speedrun.eval.report import write_report
from speedrun.reward.preference import RewardModel
from speedrun.rl.density import group_shares
from speedrun.rl.prompts import load_prompts
from speedrun.rl.rewards import score_samples
from speedrun.train.checkpoint import load_model

MODELS = {"sft": "outs/sft", "grpo_density": "outs/grpo_density", "grpo_baseline": "outs/grpo_baseline"}


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


def main(
    prompts: Path = typer.Option(Path("data/prompts/prompts.parquet"), help="prompts; the 'eval' split is used"),
    tokenizer_dir: Path = typer.Option(Path("outs/tokenizer"), help="trained tokenizer"),
    rm_dir: Path = typer.Option(Path("outs/rm"), help="reward model for the mean reward"),
    max_prompts: int = typer.Option(64, help="held-out prompts used (the first N by prompt_id; 0 = all)"),
    max_prompt_len: int = typer.Option(128, help="prompts are cut to their last N tokens"),
    samples_per_prompt: int = typer.Option(4, help="completions per prompt and seed"),
    seeds: int = typer.Option(3, help="sampling seeds"),
    max_new_tokens: int = typer.Option(48, help="completion token budget"),
    temperature: float = typer.Option(1.0, help="sampling temperature (same for every model)"),
    top_p: float = typer.Option(1.0, help="nucleus mass (same for every model)"),
    n_boot: int = typer.Option(1000, help="bootstrap draws for the intervals"),
    seed: int = typer.Option(1337, help="base seed"),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    samples_out: Path = typer.Option(Path("outs/eval/samples.parquet"), help="every sampled response"),
    metrics: Path = typer.Option(Path("reports/metrics/diversity.json"), help="numbers for dvc metrics"),
    result_out: Path = typer.Option(Path("outs/eval/result.json"), help="the full comparison (intervals, verdicts)"),
    report: Path = typer.Option(Path("reports/report.md"), help="markdown report"),
    fig_dir: Path = typer.Option(Path("reports/figures"), help="report figures"),
) -> None:
    dev = pick_device(device)
    tok = tokenizer_lib.load(tokenizer_dir)
    df, ids = load_prompts(prompts, tok, "eval", max_prompt_len)
    order = df.sort_values("prompt_id").index[: max_prompts or None]
    df, ids = df.loc[order].reset_index(drop=True), [ids[i] for i in order]
    rm = RewardModel.load(rm_dir, dev, tok.digest)
    rows = []
    for model_name, ckpt in MODELS.items():
        model, _ = load_model(Path(ckpt), dev, tok.digest)
        for s in range(seeds):
            # common random numbers: every model draws with the same generator state per seed
            g = torch.Generator(device=dev).manual_seed(stable_seed(seed, "eval", s))
            out = generate(model, ids, samples_per_prompt, max_new_tokens, temperature=temperature, top_p=top_p,
                           stop_id=tok.assistant_end_id, pad_id=tok.bos_id, generator=g)
            rewards = score_samples(rm, ids, out, tok.bos_id, standardise=True)
            for n, (row, m) in enumerate(zip(out.tokens.tolist(), out.mask.tolist())):
                p = n // samples_per_prompt
                text = tok.decode([t for t, k in zip(row, m) if k and t != tok.assistant_end_id])
                rows.append({"model": model_name, "prompt_id": df["prompt_id"][p], "seed": s,
                             "sample_idx": n % samples_per_prompt, "text": text, "reward": float(rewards[n]),
                             "prompt": df["prompt"][p][-1]["content"]})
        print(f"eval: sampled {model_name} ({len(df)} prompts x {seeds} seeds x {samples_per_prompt})")
    samples = pd.DataFrame(rows)
    write_parquet(samples_out, samples)
    result = evaluate(samples, n_boot=n_boot, seed=seed)
    write_json(result_out, result)
    write_json(metrics, flat_metrics(result))
    logs, weights = {}, {}
    for variant in ["density", "baseline"]:
        out_dir = Path(MODELS[f"grpo_{variant}"])
        logs[f"grpo_{variant}"] = pd.read_csv(out_dir / "log.csv")
        w = pd.read_parquet(out_dir / "weights.parquet")
        weights[variant] = group_shares(torch.tensor(w["weight"].to_numpy()), w["group"].tolist())
    setup = {"models": MODELS, "eval prompts": len(df), "seeds": seeds, "samples per prompt": samples_per_prompt,
             "sampler": f"temperature {temperature}, top-p {top_p}, max {max_new_tokens} new tokens",
             "bootstrap draws": n_boot, "reward model": rm_summary(rm_dir)}
    extra = [f"## Adversarial track\n\nSee [adversarial.md](adversarial.md)."]
    write_report(result, samples, logs, weights, report, fig_dir, setup, extra_sections=extra)
    d = result["delta"]
    print("eval: density - baseline: " + ", ".join(
        f"{k} {v['value']:+.4f} [{v['ci_low']:+.4f}, {v['ci_high']:+.4f}] {v['verdict'] or ''}" for k, v in d.items()))


if __name__ == "__main__":
    typer.run(main)
