"""Stage flags, each declared once. A stage's `main` lists its flags as typed parameters without defaults and is
decorated with `@stage_flags()`; every parameter becomes a Typer option whose default is

1. the value the stage's dvc.yaml cmd passes (`--lr ${pretrain.lr}` -> params.yaml's pretrain.lr, `--out-dir
   outs/sft` -> outs/sft), so `python -m stages.<name>` with no flags runs what `dvc repro` runs;
2. else the stage's own default (per-run values dvc.yaml fills from a foreach/matrix item: `seed`, `out_dir`, ...);
3. else FLAGS's, the one default of a knob params.yaml does not hold;

and whose help is FLAGS's. --help documents every knob (tests/test_params.py).
"""
from __future__ import annotations

import functools
import inspect
import re
import shlex
import typing
from pathlib import Path
from typing import Any, Callable

import typer
import yaml

from speedrun.common import DTYPE_HELP
from speedrun.params import param_default, repo_file

NONE = object()  # FLAGS default of a knob that only dvc.yaml or its stage can give (else the flag is required)
PER_RUN = re.compile(r"\$\{(item|key)\b")  # a foreach/matrix value: no single default

# name: (default where neither dvc.yaml nor the stage gives one, help)
FLAGS: dict[str, tuple[Any, str]] = {
    # where things are
    "corpus_dir": (Path("data/corpus"), "train.parquet / val.parquet of the corpus stage"),
    "objects": (Path("data/corpus/objects.parquet"), "the corpus stage's stdlib object table (embedded sources)"),
    "interpreter": (Path("data/interpreter.json"), "the interpreter pin (git-tracked): rewritten when this "
                                                   "Python's stdlib differs"),
    "tokenizer_dir": (Path("outs/tokenizer"), "trained tokenizer"),
    "init_dir": (NONE, "checkpoint to start from (adversarial: policy i-1)"),
    "sft_dir": (Path("outs/sft"), "the SFT model: policy init, KL reference, sampler"),
    "rm_dir": (Path("outs/rm"), "reward model"),
    "runs_dir": (Path("outs/grpo"), "GRPO runs, one dir <variant>_s<seed> each"),
    "adv_dir": (Path("outs/adv"), "cycle_<i>/disc and cycle_<i>/policy of every cycle"),
    "data_dir": (NONE, "adv_data output of this cycle: train/val.parquet, stats.json"),
    "disc_dir": (NONE, "this cycle's discriminator (frozen)"),
    "pairs": (NONE, "preference pairs parquet (train_rm: repeat the option to train on several files as one)"),
    "prompts": (NONE, "GRPO/eval: the deduplicated prompts parquet | adversarial: how many natural prefixes"),
    "params": (Path("params.yaml"), "params file holding grpo.variants and grpo.seeds"),
    "out_dir": (NONE, "output directory"),
    "metrics": (NONE, "metrics JSON"),
    "scratch_dir": (NONE, "resume state (not a DVC out)"),
    "samples_out": (Path("outs/eval/samples.parquet"), "every sampled response"),
    "result_out": (Path("outs/eval/result.json"), "the full comparison (intervals, verdicts)"),
    "report": (Path("reports/report.md"), "markdown report"),
    "out_md": (Path("reports/adversarial.md"), "markdown section"),
    "fig_dir": (Path("reports/figures"), "figures (png)"),
    # data sources
    "source": (NONE, "embedded (the stdlib object table) | hf (a Hugging Face dataset)"),
    "val_frac": (NONE, "val share of split units (modules / docs); embedded SFT and pairs use the corpus split"),
    "hf_path": (NONE, "hub id, or a local dir in the hub layout (corpus: also a .parquet/.jsonl file)"),
    "hf_name": (NONE, "dataset config name ('' = none)"),
    "hf_split": ("train", "split to stream"),
    "hf_val_split": ("test", "split to stream for validation"),
    "text_column": (NONE, "column holding the document text"),
    "max_docs": (NONE, "documents to read at most (hf: rows streamed; embedded: an even stride of objects)"),
    "max_rows": (NONE, "hf: rows to stream per split"),
    "max_chars": (50_000_000, "train on at most this many characters of the train split"),
    "per_object": (NONE, "embedded: question templates per object (0 = all)"),
    "only": (NONE, "read just these sources, comma-separated: hh, uf, se, embedded"),
    "no_hh": (False, "skip Anthropic/hh-rlhf"),
    "no_uf": (False, "skip HuggingFaceH4/ultrafeedback_binarized"),
    "no_se": (False, "skip HuggingFaceH4/stack-exchange-preferences"),
    "no_embedded": (False, "skip the embedded stdlib-docstring pairs"),
    "hh_path": (NONE, "hub id or a local dir mirroring the hub layout"),
    "uf_path": (NONE, "hub id or a local dir mirroring the hub layout"),
    "se_path": (NONE, "hub id or a local dir mirroring the hub layout"),
    "se_data_dir": (None, "one stack exchange site, e.g. data/apple.stackexchange.com (default: all)"),
    "limit_per_source": (NONE, "rows read per source, taken in turn from each of its splits (0 = all); streamed"),
    "se_max_pairs_per_question": (NONE, "answer pairs kept per stack exchange question, widest pm_score gap first"),
    "embedded_hard_frac": (NONE, "fraction of embedded pairs whose negative comes from the same module"),
    "embedded_negatives": (NONE, "embedded pairs per object: its answer against this many distinct negatives"),
    "eval_frac": (NONE, "fraction of prompts held out for the diversity eval (stable hash of prompt_id); "
                        "never trained on"),
    "near_dup_threshold": (NONE, "word-shingle Jaccard at or above which prompts merge into the earliest"),
    "shingle_size": (NONE, "words per shingle for near-duplicate detection"),
    "vocab_size": (NONE, "total vocabulary size, special tokens included"),
    # model
    "depth": (NONE, "transformer blocks; width = 64 * depth unless --width"),
    "width": (0, "model width (0 = 64 * depth)"),
    "head_dim": (NONE, "attention head dimension"),
    "seq_len": (NONE, "tokens per window (adversarial: N, natural prefix + generated tokens)"),
    "max_len": (NONE, "examples are cut to this many tokens (RM: keeping the response's last)"),
    # optimizer schedule (train.loop.TrainConfig)
    "steps": (NONE, "optimizer steps (at most)"),
    "batch_size": (NONE, "examples per optimizer step, all processes together (adv_data: rows per engine call)"),
    "micro_batch": (0, "examples per forward per process (0 = the whole share)"),
    "micro_tokens": (NONE, "re-cut micro-batches by length to at most this many padded tokens (same gradient, "
                           "less padding; 0 = off)"),
    "lr": (NONE, "peak learning rate"),
    "optimizer": (NONE, "adamw, or muon: Muon on the transformer blocks' matrices, AdamW on embeddings, head and "
                        "vectors (one lr for both)"),
    "weight_decay": (0.0, "weight decay on matrices"),
    "warmup_steps": (NONE, "linear warmup steps"),
    "final_lr_frac": (0.1, "lr at the last step as a fraction of the peak"),
    "grad_clip": (1.0, "max gradient norm"),
    "eval_every": (NONE, "steps between val evaluations"),
    "eval_windows": (NONE, "val windows per evaluation"),
    "eval_convs": (NONE, "val conversations per evaluation"),
    "eval_pairs": (NONE, "val pairs per periodic evaluation, evenly spaced (0 = all); the final metrics score "
                         "every val pair"),
    "patience": (NONE, "evals (adversarial GRPO: steps) without improvement before stopping (0 = off)"),
    "min_delta": (NONE, "improvement of the monitored value that resets patience"),
    "save_every": (NONE, "steps between scratch (resume) checkpoints; 0 = off"),
    # reward models
    "pool": (NONE, "last: the head reads the last token | mean: the mean of per-token scores over the response"),
    "train_kinds": (NONE, "comma list of the pair kinds trained on (sft_sample, hard, random, hh, uf, se) or all; "
                          "every kind of the eval split is scored, only these pick the best checkpoint"),
    "train_last_blocks": (NONE, "trunk blocks trained with the head, from the top (0 = head only / frozen trunk)"),
    "head": (NONE, "token (per-token BCE, the mean estimates K/N) | pooled (last token, two-way)"),
    "cycle": (NONE, "cycle id (the key in adversarial.cycles)"),
    "train_rows": (NONE, "train windows (K uniform in [0, N])"),
    "val_rows": (NONE, "val windows (K uniform in [0, N])"),
    "val_pure_rows": (NONE, "extra val windows, half pure natural, half pure generated (AUC)"),
    # sampling
    "max_new_tokens": (NONE, "completion token budget"),
    "max_prompt_len": (128, "prompts are cut to their last N tokens"),
    "temperature": (NONE, "sampling temperature (the same for every model it samples)"),
    "top_k": (0, "top-k sampling (0 = off)"),
    "top_p": (NONE, "nucleus sampling mass (1 = off)"),
    "samples_per_prompt": (NONE, "completions sampled per prompt (eval: per prompt and seed; on-policy: 0 = none)"),
    "batch_prompts": (NONE, "prompts per engine call (K rows each)"),
    # GRPO
    "variant": ("density", "variant name in --params' grpo.variants (its prompt sampling)"),
    "sampling": ("", "density (∝ kNN distance^alpha) | uniform; empty = the variant's"),
    "prompts_per_step": (NONE, "B: prompts drawn per step"),
    "group_size": (NONE, "G: completions sampled per prompt"),
    "beta": (NONE, "KL coefficient (k3 estimator) against the reference policy"),
    "clip_eps": (NONE, "PPO-style ratio clip"),
    "inner_updates": (1, "mu: gradient passes over each sampled batch"),
    "adv_scale": (NONE, "group | batch | none (Dr. GRPO)"),
    "truncated": (NONE, "completions that hit --max-new-tokens without the stop token: keep (in the loss) | mask "
                        "(out of the loss; they still count in their group's advantages)"),
    "density_k": (NONE, "neighbours for the density estimate"),
    "density_alpha": (NONE, "weight ∝ distance^alpha"),
    "density_max_ratio": (NONE, "max/min weight ratio after clipping"),
    "density_pooling": (NONE, "prompt embedding: idf-weighted (template tokens shared by most prompts weigh ~0) "
                              "or plain mean of the hidden states"),
    "reward": (NONE, "prob: mean P(natural) of the completion | logit: mean log D/(1-D)"),
    "reward_threshold": (NONE, "stop when a step's mean P(natural) reaches this"),
    # evaluation
    "comparisons": (NONE, "comma list of a:b variant pairs, a - b tested over the training seeds"),
    "primary": (NONE, "comma list: primary outcomes (Holm)"),
    "reward_margin": (NONE, "non-inferiority margin of the reward (standardised RM units)"),
    "max_prompts": (NONE, "held-out prompts used (the first N by prompt_id; 0 = all)"),
    "seeds": (NONE, "sampling seeds"),
    "n_boot": (NONE, "bootstrap draws for the intervals"),
    "bpb_seq_len": (NONE, "window length of the val bits-per-byte"),
    "bpb_windows": (NONE, "val windows of the bits-per-byte (the first ones, as pretrain)"),
    "bpb_bound": (NONE, "allowed val bpb increase per cycle (the KL anchor's job)"),
    "samples_shown": (2, "sample completions per policy in the markdown"),
    # run
    "seed": (NONE, "seed of what the stage draws (init, data order, sampling)"),
    "device": (NONE, "auto | cpu | cuda"),
    "dtype": (NONE, DTYPE_HELP),
    "nproc": (NONE, "processes (torchrun) for DDP; 1 = plain python"),
}


@functools.lru_cache(maxsize=None)
def _stage_cmds(path: str) -> dict[str, str]:
    """{module: cmd} of every dvc.yaml stage that runs `python -m stages.<module>` (foreach/matrix: their `do`)."""
    cmds = {}
    for stage in yaml.safe_load(Path(path).read_text())["stages"].values():
        cmd = " ".join(stage.get("do", stage)["cmd"].split())
        if (m := re.search(r"python -m stages\.(\w+)", cmd)):
            cmds[m.group(1)] = cmd[m.end():]
    return cmds


def cmd_values(module: str) -> dict[str, Any]:
    """{parameter: value} of the flags dvc.yaml's cmd passes stages.<module>: `${key}` read from params.yaml, a
    repeated flag as a list, a flag without a value as True; per-run values (${item...}, ${key}) left out."""
    cmds = _stage_cmds(str(repo_file("dvc.yaml")))
    if module not in cmds:
        raise KeyError(f"dvc.yaml: no stage runs `python -m stages.{module}`")
    values: dict[str, Any] = {}
    tokens = shlex.split(cmds[module])
    for i, token in enumerate(tokens):
        if not token.startswith("--"):
            continue
        name = token[2:].replace("-", "_")
        value: Any = tokens[i + 1] if i + 1 < len(tokens) and not tokens[i + 1].startswith("--") else True
        if isinstance(value, str) and PER_RUN.search(value):
            continue
        if isinstance(value, str) and (m := re.fullmatch(r"\$\{([\w.]+)\}", value)):
            value = param_default(m.group(1))
        if name in values:  # a repeated flag: a list option
            values[name] = (values[name] if isinstance(values[name], list) else [values[name]]) + [value]
        else:
            values[name] = value
    return values


def _typed(annotation: Any, value: Any) -> Any:
    """A value from dvc.yaml's cmd as the parameter's type (paths stay Path, lists stay lists)."""
    if value is None or value is NONE:
        return value
    origin = typing.get_origin(annotation)
    if origin is list:
        item = typing.get_args(annotation)[0]
        return [_typed(item, v) for v in (value if isinstance(value, list) else [value])]
    if origin is typing.Union:  # Optional[X]
        return _typed(next(a for a in typing.get_args(annotation) if a is not type(None)), value)
    return annotation(value) if annotation in (Path, int, float, str) and isinstance(value, str) else value


def stage_flags(**stage_defaults: Any) -> Callable[[Callable], Callable]:
    """Give a stage's main(...) its Typer options (defaults and help as the module docstring says)."""
    def decorate(main: Callable) -> Callable:
        module = Path(inspect.getfile(main)).stem
        hints = typing.get_type_hints(main)
        from_cmd = cmd_values(module)
        parameters = []
        for p in inspect.signature(main).parameters.values():
            if hints.get(p.name) is typer.Context:
                parameters.append(p)
                continue
            if p.name not in FLAGS:
                raise KeyError(f"stages/{module}.py: flag {p.name!r} has no entry in speedrun.cli.FLAGS (its help)")
            default, help_text = FLAGS[p.name]
            default = from_cmd.get(p.name, stage_defaults.get(p.name, default))
            default = ... if default is NONE else _typed(hints[p.name], default)  # ...: Typer's "required"
            names = [f"--{p.name.replace('_', '-')}"] if hints[p.name] is bool else []  # a switch, not --x/--no-x
            parameters.append(p.replace(default=typer.Option(default, *names, help=help_text)))
        unknown = set(stage_defaults) - {p.name for p in parameters}
        if unknown:
            raise KeyError(f"stages/{module}.py: defaults for flags it does not have: {sorted(unknown)}")
        main.__signature__ = inspect.signature(main).replace(parameters=parameters)
        return main
    return decorate
