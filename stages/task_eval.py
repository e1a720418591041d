"""Stage task_eval: the task track's checks, ahead of any density verdict. Every model answers every held-out item
task.eval.samples times (the task SFT model at each of task.eval.temperatures, every arm x seed at the GRPO
temperature and at task.eval.run_temperatures); per model and cluster: pass@1, pass@k, coverage, right-answer
entropy, top-phrasing share, and the answers' semantic diversity (a sentence encoder, shown where it orders the SFT
model's temperatures). Then: does an arm lie below the SFT model's temperature frontier (collapse, not sharpening)?
Did the density arm move the cluster mix (the manipulation check)? Each task.eval.comparisons pair (density against
uniform): Δ coverage beyond the frontier (and, with run temperatures, at equal pass@1 on each run's own curve;
task.eval.primary is the one called), pass@1 non-inferiority, the MDE and the seeds it would need. With
compute.nproc > 1 the models are shared over that many processes (torchrun), with the same output as one. A killed
evaluation's rerun reads the models it had finished back from scratch/task_eval (same settings and inputs only).
-> reports/metrics/task.json, reports/task.md, outs/task_eval/answers.parquet."""
import dataclasses
import shutil

import numpy as np
import pandas as pd

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import files_digest, pick_device, read_json, write_json, write_parquet, write_text
from speedrun.data import task
from speedrun.eval import semantic
from speedrun.embeddings import load_encoder
from speedrun.eval.sampling import resume_file
from speedrun.eval.task_report import manipulation, report
from speedrun.eval.task_compare import compare_arms
from speedrun.eval.envelope import dominated
from speedrun.eval.task_track import (blind_baseline, frontier_gaps, pass_k_values, reads_prompt, sample_answers,
                                      summary)
from speedrun.shapes import use_shapes
from speedrun.stage import run_stage
from speedrun.train import distributed
from speedrun.train.checkpoint import load_model

READS = ("seed", "compute.nproc", "compute.device", "compute.width_step", "task.run", "task.seeds", "task.variants",
         "task.source", "task.train_clusters", "task.train.temperature", "task.eval")
PATHS = {"items": "data/task/items.parquet", "tokenizer_dir": "outs/task_base/tokenizer", "sft_dir": "outs/task_sft",
         "runs_dir": "outs/task_grpo", "runs_metrics": "reports/metrics/task_grpo",
         "rm_metrics": "reports/metrics/task_rm.json", "answers":
         "outs/task_eval/answers.parquet", "metrics": "reports/metrics/task.json", "report": "reports/task.md",
         "scratch_dir": "scratch/task_eval"}


def main(p, io) -> None:
    c = p.task.eval
    distributed.maybe_relaunch(p.compute.nproc, "stages.task_eval")
    d = distributed.setup(pick_device(p.compute.device))
    use_shapes(p.compute.width_step, d.device)
    tok = tokenizer_lib.load(io.tokenizer_dir)
    all_items = task.load_items(io.items)
    items = [i for i in all_items if i.split == "eval"]
    trained = set(p.task.train_clusters) if p.task.source == "embedded" else {i.cluster for i in all_items}
    run_items = [i for i in items if i.cluster in trained]  # the runs answer the clusters they trained on
    k_values = pass_k_values(c.samples)

    # each finished model's answers kept in scratch until the stage ends: a killed evaluation does not sample it again
    fingerprint = f"task_eval|{p.digest()}|{d.device}|{files_digest(io.items, io.tokenizer_dir)}"

    def answers(job: tuple) -> pd.DataFrame:
        name, ckpt, temperature = job
        done = resume_file(io.scratch_dir, fingerprint, name, ckpt, temperature)
        if done.exists():
            print(f"task_eval: {name} at T={temperature:g} read back from {done} (answered before the last run "
                  "stopped)", flush=True)
            return pd.read_parquet(done)
        model, _ = load_model(ckpt, d.device, tok.digest)
        asked = items if name == "task_sft" else run_items  # the SFT model every cluster: the blind baseline's table
        out = sample_answers(model, name, tok, asked, c.samples, c.max_new_tokens, temperature, p.seed, d.device)
        write_parquet(done, out)
        return pd.read_parquet(done)  # as a rerun reads it back: the same frame, so the same output bytes

    arm_t = p.task.train.temperature
    run_ts = [arm_t] + sorted(set(c.run_temperatures) - {arm_t})  # the GRPO temperature first, then the others
    jobs = [("task_sft", io.sft_dir, t) for t in c.temperatures]
    jobs += [(f"{arm}_s{s}", io.runs_dir / f"{arm}_s{s}", t)
             for t in run_ts for arm in p.task.run for s in p.task.seeds]
    done = iter(distributed.map_jobs(answers, jobs, d))  # each model on one rank; rank 0 goes on alone
    distributed.teardown()
    if not d.is_main:
        return
    dev = d.device
    sft_all = {t: next(done) for t in c.temperatures}
    sft = {t: a[a["cluster"].isin(trained)].reset_index(drop=True) for t, a in sft_all.items()}
    by_t = {t: {arm: [next(done) for _ in p.task.seeds] for arm in p.task.run} for t in run_ts}
    runs = by_t[arm_t]
    curves = {arm: [{t: by_t[t][arm][i] for t in run_ts} for i in range(len(p.task.seeds))]
              for arm in p.task.run} if len(run_ts) > 1 else None
    sizes = {k: n for k, n in task.cluster_sizes(run_items, "eval").items() if n}
    result = {"items": len(run_items), "clusters": sizes, "samples": c.samples,
              "arm_temperature": p.task.train.temperature,
              "sft": {str(t): summary(a, k_values) for t, a in sft.items()},
              "arms": {arm: {"mean": _mean([summary(a, k_values) for a in frames]),
                             "runs": [summary(a, k_values) for a in frames]} for arm, frames in runs.items()},
              "frontier_gap": frontier_gaps(sft, runs, c.n_boot, p.seed, k_values),
              "comparisons": compare_arms(sft, runs, c.comparisons, c.n_boot, p.seed, k_values, c.pass1_margin,
                                          c.mde_share, curves, arm_t, c.primary, c.matched_at),
              "run_temperatures": run_ts[1:],
              "pass1_margin_share": c.pass1_margin, "mde_share": c.mde_share,
              "variants": {arm: dataclasses.asdict(p.task.variants[arm]) for arm in p.task.run}}
    sft_t = arm_t if arm_t in sft else 1.0
    result["blind"] = {"temperature": sft_t, "sft": blind_baseline(sft_all[sft_t], items),
                       "arms": {arm: _blind_mean([blind_baseline(a, items) for a in frames])
                                for arm, frames in runs.items()},
                       "trained": sorted(trained)}
    points = np.array([(t, s["all"]["pass@1"], s["all"]["coverage"]) for t, s in result["sft"].items()
                       for t in [float(t)]])
    result["off_envelope"] = [float(t) for t in points[dominated(points), 0]]
    if curves:
        result["curves"] = {arm: {str(t): {k: round(float(np.mean([summary(by_t[t][arm][i], k_values)["all"][k]
                                                                    for i in range(len(p.task.seeds))])), 4)
                                           for k in ("pass@1", "coverage")} for t in sorted(run_ts)}
                            for arm in p.task.run}
    result["semantic"] = semantic_diversity(sft, runs, dev)
    if any(i.text for i in items):  # hub items (GSM8K): the report says what the task is
        result["source"] = "gsm8k"
    metrics = {arm: [read_json(io.runs_metrics / f"{arm}_s{s}.json") for s in p.task.seeds] for arm in p.task.run}
    result["manipulation"] = manipulation(metrics, result["variants"])
    result["training"] = {arm: {k: [m.get(k) for m in ms] for k in ("reward_start", "reward_end", "gold_pass_start",
                                                                     "gold_pass_end", "kl_end", "rollouts",
                                                                     "groups_trained")}
                          for arm, ms in metrics.items()}
    if any(v["reward"] == "rm" for v in result["variants"].values()):  # what the RM knows of the task
        task_kind = read_json(io.rm_metrics)["by_kind"].get("task")
        result["rm"] = task_kind and {k: task_kind[k] for k in ("pairs", "acc", "margin", "baseline_acc",
                                                                 "sft_logprob_acc")}
    run_frames = (f for t in run_ts for fs in by_t[t].values() for f in fs)
    write_parquet(io.answers, pd.concat([*sft_all.values(), *run_frames], ignore_index=True))
    write_json(io.metrics, result)
    text = report(read_json(io.metrics))  # from the file as written (keys sorted): the report recomputes from it
    write_text(io.report, text)
    shutil.rmtree(io.scratch_dir, ignore_errors=True)  # done: the next run samples afresh
    print(text)


def semantic_diversity(sft: dict[float, pd.DataFrame], runs: dict[str, list[pd.DataFrame]], dev: str) -> dict:
    """Each model's semantic diversity (speedrun.eval.semantic), the SFT model's temperature control first."""
    names = {**{f"sft {t}": a for t, a in sft.items()}, **{f"{arm} {i}": a for arm, fs in runs.items()
                                                            for i, a in enumerate(fs)}}
    d = semantic.model_diversity(names, load_encoder(dev))
    by_t = {str(t): d[f"sft {t}"] for t in sft}
    arms = {arm: [d[f"{arm} {i}"] for i in range(len(fs))] for arm, fs in runs.items()}
    return {"control": semantic.temperature_control({float(t): v["all"] for t, v in by_t.items()}), "sft": by_t,
            "arms": {arm: {"mean": {k: round(sum(r[k] for r in rs) / len(rs), 5) for k in rs[0]}, "runs": rs}
                     for arm, rs in arms.items()}}


def _blind_mean(tables: list[dict]) -> dict:
    """blind_baseline's per-cluster figures averaged over an arm's runs (reads_prompt: on the means)."""
    out = {}
    for c in tables[0]:
        p1 = float(np.mean([t[c]["pass@1"] for t in tables]))
        blind = [t[c]["blind"] for t in tables if t[c]["blind"] is not None]
        b = float(np.mean(blind)) if blind else None
        out[c] = {"pass@1": round(p1, 4), "blind": b if b is None else round(b, 4),
                  "reads_prompt": b is not None and reads_prompt(p1, b)}
    return out


def _mean(summaries: list[dict]) -> dict:
    """Means over an arm's runs of every number of every cluster (a run's top phrasing is left out)."""
    keys = [k for k in summaries[0] if isinstance(summaries[0][k], dict)]
    return {k: {m: round(sum(s[k][m] for s in summaries) / len(summaries), 4) for m in summaries[0][k]} for k in keys}


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
