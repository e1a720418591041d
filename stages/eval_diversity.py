"""Stage eval_diversity: sample the SFT model and every GRPO run (grpo.run x grpo.seeds) on the held-out
prompts (same seeds, same sampler), score them, compare the variants over their training seeds, write the report.

Before the comparison: the temperature control (can each primary metric see diversity? one that cannot is dropped
from the primary list). Beside it: the gold-checked task on the held-out modules (pass@1, pass@k, coverage).
A killed evaluation's rerun reads the models it had finished back from scratch/eval (same settings and inputs only).
With compute.nproc > 1 the models are shared over that many processes (torchrun), with the same output as one."""
import shutil
from pathlib import Path

import pandas as pd
import torch

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import UserError, files_digest, pick_device, read_json, write_json, write_parquet
from speedrun.data.docstrings import load_objects
from speedrun.data.gold import distractor_pool, gold_items
from speedrun.embeddings import embed, load_encoder
from speedrun.eval.compare import METRIC_BY_NAME, evaluate
from speedrun.eval.flat import flat_metrics
from speedrun.eval.controls import (manipulation_check, manipulation_section, ordering_section, power_section,
                                    power_table, temperature_ordering)
from speedrun.eval.equal_reward import equal_reward_section
from speedrun.eval.report import heldout_wording, write_report
from speedrun.eval.sampling import embed_texts, prompt_gain_summary, run_name, sample_models
from speedrun.eval.task import compare_task, sample_task, task_section
from speedrun.probe import copy_probe, merged_tokens
from speedrun.reward.onpolicy import reference_answers
from speedrun.reward.preference import RewardModel
from speedrun.rl.density import group_shares
from speedrun.rl.prompts import load_prompts
from speedrun.shapes import use_shapes
from speedrun.stage import run_stage
from speedrun.train import distributed
from speedrun.train.checkpoint import context_length, load_model

READS = ("seed", "compute.nproc", "compute.device", "compute.width_step", "corpus.val_frac", "prompts.eval_frac",
         "sft.source", "eval", "grpo.run", "grpo.variants", "grpo.controls.tic", "grpo.seeds")
PATHS = {"prompts": "data/prompts/prompts.parquet", "pairs": "data/prompts/pairs.parquet",
         "ngram_vocab": "data/corpus/ngram_vocab.json", "objects": "data/corpus/objects.parquet",
         "tokenizer_dir": "outs/base/tokenizer", "rm_dir": "outs/rm", "sft_dir": "outs/sft", "runs_dir": "outs/grpo",
         "samples_out": "outs/eval/samples.parquet", "result_out": "outs/eval/result.json",
         "metrics": "reports/metrics/diversity.json", "report": "reports/report.md", "fig_dir": "reports/figures",
         "scratch_dir": "scratch/eval"}


def rm_summary(rm_dir: Path) -> str:
    """The RM's held-out accuracy, flagged when it is constant or near chance: then GRPO had little to follow."""
    meta = read_json(rm_dir / "meta.json")
    val = meta["val"]
    line = (f"val pairwise accuracy {val['val_acc']:.3f} on held-out pairs (word-overlap baseline "
            f"{val['baseline_acc']:.3f})")
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


def held_out_prompts(p, io, tok) -> tuple[pd.DataFrame, list[list[int]], int]:
    """The eval prompts (by prompt id, at most eval.max_prompts), their token ids, and how many were left out: a
    held-out prompt whose reference answer is also some trained prompt's answer (the stdlib ships copies of a few
    modules) is not held out."""
    c = p.eval
    df, ids = load_prompts(io.prompts, tok, "eval", context_length(c.max_prompt_len, io.sft_dir, c.max_new_tokens,
                                                                   "eval.max_prompt_len"))
    pairs = pd.read_parquet(io.pairs, columns=["id", "prompt_id", "prompt", "split", "chosen"])
    trained = set(pairs.loc[pairs["split"] != "eval", "chosen"])
    refs = {r["prompt_id"]: r["chosen"] for r in reference_answers(pairs.to_dict("records"), str(io.pairs))}
    keep = df["prompt_id"].map(lambda pid: refs[pid] not in trained)
    order = df[keep].sort_values("prompt_id").index[: c.max_prompts or None]
    if len(order) < 2:  # a prompt swap (does the model read its prompt?) pairs each prompt with another
        raise UserError(f"{io.prompts}: {len(order)} held-out prompt(s) to evaluate, and the evaluation needs 2: "
                        f"{len(df)} eval prompts, {int((~keep).sum())} left out because a trained prompt has the same "
                        f"reference answer ({io.pairs}); more pairs or a larger prompts.eval_frac hold out more")
    return df.loc[order].reset_index(drop=True), [ids[i] for i in order], int((~keep).sum())


def run_logs(runs_dir: Path, frames: dict, seeds: list[int]) -> tuple[dict, dict]:
    """Each GRPO run's log.csv by model name, and each variant's sampling weight per prompt group."""
    logs, weights = {}, {}
    for v, by_seed in frames.items():
        for s in seeds:
            logs[run_name(v, s)] = pd.read_csv(runs_dir / f"{v}_s{s}" / "log.csv")
        w = by_seed[seeds[0]]  # the same weights for every seed
        weights[v] = group_shares(torch.tensor(w["weight"].to_numpy()), w["group"].tolist())
    return logs, weights


def control_check(control_samples: pd.DataFrame, temps: dict[str, float], c, vocab: list[int],
                  seed: int) -> tuple[dict, list[str]]:
    """The temperature control (which metrics order the SFT model's temperatures) and the configured primaries that
    pass it; none passing stops the stage (nothing could be tested)."""
    configured = list(c.primary)
    matched = ["ead_1_first", "distinct_2_first", "self_bleu_first"] if c.match_words else []
    others = ["ead_1", "distinct_2", "self_bleu"] + matched + ["within_self_bleu", "within_vendi", "within_semantic",
                                                               "word_gini", "word_entropy", "across_semantic",
                                                               "shared_4grams", "top_opening", "rep_4"]
    control = temperature_ordering(control_samples, temps, configured + [m for m in others if m not in configured],
                                   vocab, seed, c.match_words)
    primary = [m for m in configured if control["metrics"][m]["passes"]]
    if not primary:
        raise SystemExit(f"eval: no primary metric of {configured} orders the control temperatures "
                         f"{c.control_temperatures} (Spearman >= {control['min_rho']}): nothing to test")
    return control, primary


def gold_task_items(p, io) -> tuple[list, list]:
    """The gold-checked task's items (every split: the distractor pool) and those of the held-out modules."""
    all_items = gold_items(load_objects(io.objects), p.corpus.val_frac, p.prompts.eval_frac)
    items = [i for i in all_items if i.split == "eval"]
    if not items:
        raise SystemExit(f"eval: {io.objects} has no gold-task item in the held-out modules (prompts.eval_frac)")
    return all_items, items


def temperature_phase(p, io, draw: dict, tok, vocab: list[int], d: distributed.Dist
                      ) -> tuple[pd.DataFrame, dict[str, float], torch.nn.Module, object, dict, list[str]]:
    """The SFT model sampled at each control temperature (draw: sample_models' settings), its responses embedded by
    the SFT model's states and by the sentence encoder, and control_check's verdict; returns the samples, the two
    embedders (every model's responses use them later), the control and the primaries that pass it; returns the
    samples, their {model: temperature}, the two embedders, the control and its primaries."""
    temps = {f"sft@T{t:g}": t for t in p.eval.control_temperatures}
    control_samples = pd.concat(distributed.map_jobs(  # each model on one rank (map_jobs), every rank gets all rows
        lambda job: sample_models({job[0]: io.sft_dir}, pairs_path=None, temperature=job[1], **draw),
        list(temps.items()), d), ignore_index=True)
    embedder, _ = load_model(io.sft_dir, d.device, tok.digest)  # one fixed embedder for every model's responses
    control_samples["embedding"] = embed_texts(embedder, tok, control_samples["text"].tolist(), d.device)
    encoder = load_encoder(d.device)  # a sentence encoder: meaning, where the SFT model's states read words
    control_samples["sentence_embedding"] = list(embed(encoder, control_samples["text"].tolist()))
    control, primary = control_check(control_samples, temps, p.eval, vocab, p.seed)  # every rank stops or goes
    return control_samples, temps, embedder, encoder, control, primary


def main(p, io) -> None:
    c = p.eval
    sampling = {name: p.grpo.variants[name].sampling for name in p.grpo.run}
    seeds_trained = p.grpo.seeds
    pairs_list = [tuple(x.split(":")) for x in c.comparisons]  # a:b of grpo.run arms: checked at load
    distributed.maybe_relaunch(p.compute.nproc, "stages.eval_diversity")
    d = distributed.setup(pick_device(p.compute.device))
    dev = d.device
    use_shapes(p.compute.width_step, dev)
    tok = tokenizer_lib.load(io.tokenizer_dir)
    df, ids, left_out = held_out_prompts(p, io, tok)
    rm = RewardModel.load(io.rm_dir, dev, tok.digest)
    vocab = read_json(io.ngram_vocab)["distinct"]  # EAD's fixed V: the corpus's distinct n-grams (stage corpus)

    # each finished model's samples kept in scratch until the stage ends: a killed evaluation does not sample it again
    resume = {"resume": io.scratch_dir, "fingerprint": f"eval|{p.digest()}|{dev}|"
              f"{files_digest(io.prompts, io.pairs, io.rm_dir, io.tokenizer_dir)}"}
    draw = dict(tok=tok, rm=rm, prompts=df, ids=ids, seeds=c.seeds, samples_per_prompt=c.samples_per_prompt,
                max_new_tokens=c.max_new_tokens, top_p=c.top_p, seed=p.seed, device=dev, **resume)
    # the temperature control first: which primaries can see diversity at all
    control_samples, temps, embedder, encoder, control, primary = temperature_phase(p, io, draw, tok, vocab, d)

    all_items, items = gold_task_items(p, io)
    models = {"sft": io.sft_dir} | {run_name(v, s): io.runs_dir / f"{v}_s{s}" for v in sampling for s in seeds_trained}
    # the SFT model at the evaluation temperature drew exactly these responses in the control: not drawn twice
    same = control_samples[control_samples["model"] == f"sft@T{c.temperature:g}"]
    same = same.drop(columns=["embedding", "sentence_embedding"])
    drawn = {"sft": same} if len(same) else None

    def sample(job: tuple) -> pd.DataFrame:  # one model's responses, or its gold-task answers
        kind, name = job
        if kind == "task":
            return sample_task({name: models[name]}, tok, items, distractor_pool(all_items), c.gold.samples,
                               c.gold.max_new_tokens, c.temperature, c.top_p, p.seed, dev)
        return sample_models({name: models[name]}, pairs_path=io.pairs, temperature=c.temperature, drawn=drawn,
                             **draw)

    done = distributed.map_jobs(sample, [(kind, name) for kind in ("responses", "task") for name in models], d)
    distributed.teardown()
    if not d.is_main:
        return
    samples = pd.concat(done[:len(models)], ignore_index=True)
    answers = pd.concat(done[len(models):], ignore_index=True)
    write_parquet(io.samples_out, samples)
    samples["embedding"] = embed_texts(embedder, tok, samples["text"].tolist(), dev)  # for the Vendi score only
    if any(control["metrics"][m]["passes"] for m in ("within_semantic", "across_semantic")):  # where one can see
        samples["sentence_embedding"] = list(embed(encoder, samples["text"].tolist()))
    variants = {v: [run_name(v, s) for s in seeds_trained] for v in sampling}
    result = evaluate(samples, variants, pairs_list, reference="sft", primary=primary,
                      reward_keep=c.reward_keep, n_boot=c.n_boot, seed=p.seed, ead_vocab_size=vocab,
                      tic=p.grpo.controls.tic, match_words=c.match_words, control=control_samples, temperatures=temps)

    task = compare_task(answers, variants, pairs_list, "sft", c.gold.margin, c.n_boot, p.seed)
    task["copy_probe"] = copy_probe(embedder, *merged_tokens(tok), p.seed, dev)  # embedder: the SFT model
    sft_rows = samples[samples["model"] == "sft"].drop_duplicates("prompt_id")
    task["prompt_gain"] = prompt_gain_summary(sft_rows["prompt_gain"].tolist())
    first = result["comparisons"][0]
    power = power_table(result, first, first["b"]) if first["seed_variance"] else {}
    frames = {v: {s: pd.read_parquet(io.runs_dir / f"{v}_s{s}" / "weights.parquet") for s in seeds_trained}
              for v in sampling}
    manipulation = manipulation_check(frames, first["a"], first["b"])
    result |= {"temperature_control": control, "configured_primary": list(c.primary), "task": task, "power": power,
               "manipulation": manipulation}
    write_json(io.result_out, result)
    write_json(io.metrics, flat_metrics(result))
    logs, weights = run_logs(io.runs_dir, frames, seeds_trained)
    setup = {"models": {k: str(v) for k, v in models.items()}, "eval prompts": len(df), "seeds": c.seeds,
             "samples per prompt": c.samples_per_prompt,
             "sampler": f"temperature {c.temperature}, top-p {c.top_p}, max {c.max_new_tokens} new tokens",
             "bootstrap draws": c.n_boot, "reward model": rm_summary(io.rm_dir),
             "held-out split": heldout_wording({s for srcs in df["srcs"] for s in srcs}, p.sft.source, left_out)}
    lead = [manipulation_section(manipulation, first["a"], first["b"]),
            ordering_section(control, list(c.primary), primary),
            power_section(power, first, first["b"], "sft") if power else "## Power\n\nOne run per variant: no MDE.",
            equal_reward_section(result["equal_reward"], [m for m, x in control["metrics"].items() if x["passes"]],
                                 METRIC_BY_NAME)]
    extra = [task_section(task, "sft", task["copy_probe"], task["prompt_gain"]),
             "## Adversarial track\n\nSee [adversarial.md](adversarial.md)."]
    md = write_report(result, samples, logs, weights, io.report, io.fig_dir, setup, extra_sections=extra,
                      lead_sections=lead)
    print("eval: " + "\n".join(line for line in md.splitlines() if line.startswith("**") and " vs " in line))
    shutil.rmtree(io.scratch_dir, ignore_errors=True)  # done: the next run samples afresh


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
