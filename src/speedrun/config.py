"""Every knob of the pipeline: its type, its range and one line of help. params.yaml holds every value, once; this
file (and speedrun.config_tracks, the task and adversarial sections) mirrors its layout, a dataclass per section;
speedrun.params.Params is the whole file, and speedrun.params loads and checks it. Fields marked `derived`
are not knobs: the stage sets them from other knobs (bf16 from compute.dtype, a GRPO run's seed from its id)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal


def knob(help: str, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
         lt: float | None = None) -> Any:
    """A params.yaml key: no default here (params.yaml holds the value), a help line and an optional range."""
    return field(metadata={"help": help, "ge": ge, "gt": gt, "le": le, "lt": lt})


def derived(default: Any) -> Any:
    """A field the stage sets at run time, not read from params.yaml."""
    return field(default=default, metadata={"derived": True})


DTYPE_HELP = ("auto: bf16 autocast where the hardware has it (CUDA, CPUs with AVX512-BF16/AMX), else fp32 | fp32 | "
              "bf16")


@dataclass(frozen=True)
class ComputeConfig:
    nproc: int = knob(">1: training and GRPO stages run under torchrun --standalone --nproc_per_node N (DDP); "
                      "on-policy sampling and the evaluations share their prompts or models over the N processes", ge=1)
    device: Literal["auto", "cpu", "cuda"] = knob("where to run")
    dtype: Literal["auto", "fp32", "bf16"] = knob(DTYPE_HELP)
    compile: bool = knob("torch.compile the training steps' forward and backward (pretrain, SFT, reward models); "
                         "reruns stay byte-identical on one machine")
    decode: Literal["dynamic", "static", "compiled"] = knob(
        "GRPO sampling: dynamic (the cache grows, finished rows are dropped) | static (fixed shapes, every row kept) "
        "| compiled (static under torch.compile; a CUDA graph on GPU)")
    width_step: int = knob(
        "GRPO, on-policy sampling and evaluation pad prompt, completion and key widths to multiples of this and row "
        "counts to a ladder 1, 2, 3, 4, 6, 8, ... (masked), so a run meets a few dozen tensor shapes: a GPU builds "
        "an attention plan or a CUDA graph per new shape. 0 = auto (64 on CUDA; 1 on CPU, where padding only costs); "
        "1 = exact shapes",
        ge=0)
    run_threads: int = knob(
        "CPU threads of one GRPO run (nproc 1); the grpo and task_grpo stages run a track's runs side by side, "
        "cores // run_threads at a time. A run's fp32 bytes depend on its thread count, not on what runs beside it. "
        "0 = torch's default (every core) and one run at a time",
        ge=0)


@dataclass(frozen=True)
class CorpusConfig:
    source: Literal["embedded", "hf"] = knob("embedded: stdlib docstrings of this Python | hf: a Hugging Face dataset")
    val_frac: float = knob("val share of split units (modules / docs); embedded SFT and pairs use this split",
                           ge=0, lt=1)
    hf_path: str = knob("hf: hub id, or a local dir in the hub layout, or a .parquet/.jsonl file")
    hf_name: str = knob("hf: dataset config name ('' = none)")
    hf_split: str = knob("hf: split to stream")
    text_column: str = knob("hf: column holding the document text")
    max_docs: int = knob("documents to read at most (hf: rows streamed; embedded: an even stride of objects)", ge=1)
    hf_shuffle_buffer: int = knob("hf: rows are read through datasets' streaming shuffle, shards in an order drawn "
                                  "from the top-level seed and rows through a buffer of this many (0 = file order)",
                                  ge=0)


@dataclass(frozen=True)
class TokenizerConfig:
    vocab_size: int = knob("total vocabulary size, special tokens included", ge=260)
    max_chars: int = knob("train on at most this many characters of the train split", ge=1)


@dataclass(frozen=True)
class ModelConfig:
    depth: int = knob("transformer blocks", ge=1)
    width: int = knob("model width (0 = 64 * depth)", ge=0)
    head_dim: int = knob("attention head dimension", ge=1)
    seq_len: int = knob("tokens per pretraining window (the model's context)", ge=2)


FROZEN_BLOCKS = ("the model's bottom blocks left frozen with the token embedding (a tied head with it): only the "
                 "blocks above train (0 = every weight trains); speedrun.trunk")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The optimizer schedule of pretrain, SFT and the reward models (speedrun.train.loop)."""
    steps: int = knob("optimizer steps (at most)", ge=1)
    lr: float = knob("peak learning rate", gt=0)
    optimizer: Literal["adamw", "muon"] = knob("adamw, or muon: Muon on the blocks' matrices, AdamW on the rest")
    weight_decay: float = knob("weight decay on matrices", ge=0)
    warmup_steps: int = knob("linear warmup steps", ge=0)
    final_lr_frac: float = knob("lr at the last step as a fraction of the peak", ge=0, le=1)
    grad_clip: float = knob("max gradient norm", gt=0)
    eval_every: int = knob("steps between val evaluations", ge=1)
    patience: int = knob("evals without improvement before stopping (0 = off)", ge=0)
    min_delta: float = knob("improvement of the monitored value that resets patience", ge=0)
    save_every: int = knob("steps between scratch (resume) checkpoints (0 = off)", ge=0)
    bf16: bool = derived(False)  # from compute.dtype and the device
    compile: bool = derived(False)  # compute.compile
    monitor: str = derived("val_loss")  # the stage's eval metric for early stopping (lower is better)


@dataclass(frozen=True, kw_only=True)
class PretrainConfig(TrainConfig):
    batch_size: int = knob("windows per optimizer step, all processes together", ge=1)
    micro_batch: int = knob("windows per forward per process (0 = the whole share)", ge=0)
    eval_windows: int = knob("val windows per evaluation", ge=1)


@dataclass(frozen=True, kw_only=True)
class SFTConfig(TrainConfig):
    source: Literal["embedded", "hf"] = knob("embedded: questions about stdlib objects | hf: smoltalk-style messages")
    per_object: int = knob("embedded: question templates per object (0 = all)", ge=0)
    gold_per_item: int = knob("embedded: right answers trained per gold-task item of the train modules (0 = no "
                              "gold task in SFT)", ge=0)
    hf_path: str = knob("hf: hub id or a local dir in the hub layout")
    hf_name: str = knob("hf: dataset config name ('' = none)")
    hf_split: str = knob("hf: split to train on")
    hf_val_split: str = knob("hf: split to validate on")
    max_rows: int = knob("hf: rows to stream per split", ge=1)
    hf_shuffle_buffer: int = knob("hf: the train split is read through datasets' streaming shuffle, shards in an "
                                  "order drawn from the top-level seed and rows through a buffer of this many (0 = "
                                  "file order)", ge=0)
    max_len: int = knob("conversations are cut to this many tokens (0 = the model's context)", ge=0)
    batch_size: int = knob("conversations per optimizer step, all processes together", ge=1)
    micro_batch: int = knob("conversations per forward per process (0 = the whole share)", ge=0)
    micro_tokens: int = knob("re-cut micro-batches by length to at most this many padded tokens (0 = off)", ge=0)
    eval_convs: int = knob("val conversations per evaluation", ge=1)
    frozen_blocks: int = knob(FROZEN_BLOCKS, ge=0)
    steps: int = knob("optimizer steps (at most; 0 = the base as it came, evaluated and passed on)", ge=0)


@dataclass(frozen=True)
class PairsConfig:
    only: list[Literal["hh", "uf", "se", "embedded"]] = knob("the sources read, a YAML list of hh, uf, se, embedded "
                                                             "(-S 'pairs.only=[hh,uf,se]')")
    limit_per_source: int = knob("pairs kept per source at most, its rows read in turn from each of its splits (SE: "
                                 "from each site) (0 = all); streamed", ge=0)
    hh_path: str = knob("Anthropic/hh-rlhf: hub id or a local dir mirroring the hub layout")
    uf_path: str = knob("HuggingFaceH4/ultrafeedback_binarized: hub id or a local mirror")
    se_path: str = knob("HuggingFaceH4/stack-exchange-preferences: hub id or a local mirror")
    se_data_dir: str = knob("one stack exchange site, e.g. data/apple.stackexchange.com ('' = all)")
    se_max_pairs_per_question: int = knob("answer pairs kept per stack exchange question, widest pm_score gap "
                                          "first", ge=1)
    embedded_hard_frac: float = knob("share of embedded pairs whose negative comes from the same module", ge=0, le=1)
    embedded_negatives: int = knob("embedded pairs per object: its answer against this many other answers", ge=1)
    embedded_echo: bool = knob("embedded: one more pair per object, its answer against the asked name alone in "
                               "backticks (negative kind echo: an answer that restates the question)")
    embedded_probes: bool = knob("embedded: two more pairs per object, its answer against a content-free reply "
                                 "(kind nonanswer) and against a template naming it (kind template); val and eval "
                                 "objects draw from held-out lists (speedrun.data.pairs_embedded)")


@dataclass(frozen=True)
class PromptsConfig:
    eval_frac: float = knob("share held out of every post-training stage for the evaluation: of the pretrained "
                            "top-level modules (embedded), else of the prompts (stable hash)", ge=0, lt=1)
    near_dup_threshold: float = knob("word-shingle Jaccard at or above which prompts merge into the earliest",
                                     gt=0, le=1)
    shingle_size: int = knob("words per shingle for near-duplicate detection", ge=1)
    hub_clusters: int = knob("hub prompts (no module of their own) are grouped into this many k-means clusters of "
                             "their words embedding, the groups the manipulation check counts over (0 = by source)",
                             ge=0)


@dataclass(frozen=True)
class OnpolicyConfig:
    samples_per_prompt: int = knob("K SFT samples per prompt, each the rejected side of a pair (0 = none)", ge=0)
    max_new_tokens: int = knob("completion token budget", ge=1)
    temperature: float = knob("sampling temperature", gt=0)
    top_p: float = knob("nucleus sampling mass (1 = off)", gt=0, le=1)
    max_prompt_len: int = knob("a longer prompt keeps its chat header and its last tokens, as GRPO cuts it (0 = the "
                               "model's context less max_new_tokens)", ge=0)
    batch_prompts: int = knob("prompts per engine call (K rows each)", ge=1)
    keep_truncated: bool = knob("keep a sample that hit max_new_tokens without ending (false: skipped and counted, "
                                "so every rejected answer ends as the chosen one does)")


# the pair kinds a reward model can train on (data/pairs*.py, reward/onpolicy.py, data/task.py), and "all"
PairKind = Literal["sft_sample", "hard", "random", "echo", "nonanswer", "template", "hh", "uf", "se", "task", "all"]
# the diversity metrics a primary can name (speedrun.eval.compare.METRICS; tests/test_params.py keeps them in step)
DiversityMetric = Literal["distinct_1", "distinct_2", "distinct_3", "ead_1", "ead_2", "ead_3", "word_gini",
                          "self_bleu", "ead_1_first", "distinct_2_first", "self_bleu_first", "within_distinct_1",
                          "within_distinct_2", "within_distinct_3", "within_self_bleu", "within_vendi",
                          "within_semantic", "word_entropy", "across_semantic", "shared_4grams", "top_opening",
                          "rep_4"]


@dataclass(frozen=True, kw_only=True)
class RMConfig(TrainConfig):
    """The preference reward model (speedrun.reward.train_rm)."""
    train_kinds: list[PairKind] = knob("pair kinds trained on (sft_sample, hard, random, echo, nonanswer, template, "
                                       "hh, uf, se; task for task.rm), or [all]; every kind of the validation split "
                                       "is scored")
    pool: Literal["last", "mean"] = knob("last: the last token's score | mean: the mean per-token score of the "
                                         "response")
    read_end: bool = knob("true: the score reads each response's closing <|assistant_end|> | false: it is left out "
                          "on every side (pairs, GRPO samples, evaluation), so an answer cut at the token budget is "
                          "read as one that ended")
    train_last_blocks: int = knob("trunk blocks trained with the head, from the top (0 = head only)", ge=0)
    max_len: int = knob("prompt + response tokens (a longer prompt is cut to its header and end, leaving 16 to "
                        "the response; 0 = the model's context)", ge=0)
    batch_size: int = knob("pairs per optimizer step, all processes together", ge=1)
    micro_batch: int = knob("pairs per forward per process (0 = the whole share)", ge=0)
    micro_tokens: int = knob("re-cut micro-batches by length to at most this many padded tokens (0 = off)", ge=0)
    eval_pairs: int = knob("val pairs of the trained kinds per periodic eval, evenly spaced (0 = all); the final "
                           "metrics score every val pair", ge=0)


@dataclass(frozen=True, kw_only=True)
class GRPOConfig:
    """The GRPO loop shared by the preference and task tracks and the adversarial cycles (speedrun.rl.trainer): the
    knobs every track reads from params.yaml, then the fields a track or its stage sets. Those are None until set,
    and the trainer refuses to start with one unset: no placeholder value can pass for a setting."""
    steps: int = knob("GRPO steps (at most)", ge=1)
    prompts_per_step: int = knob("B: prompts drawn per step", ge=1)
    group_size: int = knob("G: completions sampled per prompt", ge=2)
    lr: float = knob("learning rate", gt=0)
    warmup_steps: int = knob("linear warmup steps", ge=0)
    clip_eps: float = knob("PPO-style ratio clip", gt=0)
    inner_updates: int = knob("mu: gradient passes over each sampled batch", ge=1)
    adv_scale: Literal["group", "batch", "none"] = knob("advantage scale: group std | batch std | none (Dr. GRPO)")
    grad_clip: float = knob("max gradient norm", gt=0)
    top_k: int = knob("top-k sampling (0 = off)", ge=0)
    top_p: float = knob("nucleus sampling mass (1 = off)", gt=0, le=1)
    # knobs of one track, set by the other: sampling and truncation (preference/task knobs; adversarial: its stage)
    temperature: float = derived(None)
    max_new_tokens: int = derived(None)
    truncated: str = derived(None)  # keep | mask: completions that hit max_new_tokens without the stop token
    # early stopping (adversarial knobs; the preference and task tracks run every step)
    reward_threshold: float = derived(None)  # stop once a step's mean reward reaches this
    patience: int = derived(None)  # stop after this many steps without the reward moving average improving (0 = off)
    min_delta: float = derived(None)
    # set by the stage for each run
    beta: float = derived(None)  # the top-level beta
    entropy_bonus: float = derived(None)  # eta: + eta * the policy's per-token entropy in the objective (a variant's)
    advantage: str = derived("group")  # group: GRPO's | passk: the pass@k advantage over pass_k-subsets (a task arm's)
    pass_k: int = derived(1)
    clip_high: float = derived(0.0)  # the ratio's upper clip 1 + clip_high (0 = 1 + clip_eps; a task arm's)
    select_rounds: int = derived(1)  # draws a prompt-selection arm may spend on one step (speedrun.rl.trainer.rollout)
    seed: int = derived(None)
    bf16: bool = derived(None)
    decode: str = derived(None)  # compute.decode: how generate() decodes
    warm_up: bool = derived(None)  # one dummy step per prompt width before step 0 (on CUDA: plans and graphs)
    frozen_blocks: int = derived(0)  # the policy's bottom blocks left frozen (grpo.train, task.train; speedrun.trunk)


@dataclass(frozen=True, kw_only=True)
class PromptGRPOConfig(GRPOConfig):
    """A GRPO run of the preference track (stage grpo)."""
    frozen_blocks: int = knob("the policy's bottom blocks left frozen with the token embedding (a tied head with it); "
                              "the policy and its reference share their activations, computed once a step (0 = every "
                              "weight trains); speedrun.trunk", ge=0)
    temperature: float = knob("sampling temperature", gt=0)
    max_new_tokens: int = knob("completion token budget", ge=1)
    max_prompt_len: int = knob("a longer prompt keeps its chat header and its last tokens (0 = the model's context "
                               "less max_new_tokens)", ge=0)
    truncated: Literal["keep", "mask"] = knob("completions that hit max_new_tokens without the stop token: keep (in "
                                              "the loss) | mask (out of the loss, still in their group's advantages)")
    pool: int = knob("train prompts GRPO draws from: a fixed random subset of this many, the same for every arm "
                     "(0 = all); smaller pools make prompts repeat within a run", ge=0)
    # no early stop: every arm and seed takes its steps, so the arms' budgets are equal
    reward_threshold: float = derived(math.inf)
    patience: int = derived(0)
    min_delta: float = derived(0.0)


@dataclass(frozen=True)
class DensityConfig:
    """Density-aware prompt weights (speedrun.rl.density): w ∝ (mean distance to the k nearest prompts)^alpha."""
    k: int = knob("neighbours for the density estimate", ge=1)
    alpha: float = knob("weight ∝ distance^alpha (0 = uniform)", ge=0)
    max_ratio: float = knob("max/min weight ratio after clipping", ge=1)
    embedding: Literal["words", "names", "minilm", "minilm_kind", "sft_idf", "sft_mean"] = knob(
        "words: tf-idf of the prompt's words and word pairs (lexical: text only) | names: the module/class path of the "
        "object a prompt asks about (metadata: prompts of one module are neighbours) | minilm: a sentence encoder's "
        "embedding of the prompt (all-MiniLM-L6-v2: by meaning) | minilm_kind: that beside the embedding of the prompt "
        "with its operands masked | sft_idf: idf-weighted mean of the SFT hidden states | sft_mean: their plain mean")
    max_prompts: int = knob(
        "the most train prompts the density weights take (0 = no limit): their k-NN's time grows as N^2 (539,200 "
        "prompts took about 227 minutes on a 2-core CPU, docs/LOG.md), so above it the stage stops before embedding, "
        "naming this knob; raise it (on an accelerator) or draw a pool (train.pool)", ge=0)


@dataclass(frozen=True)
class Variant:
    """One arm: how it draws prompts and what it is rewarded for (speedrun.rl.controls). Everything else is shared."""
    sampling: Literal["density", "uniform", "balanced"] = knob(
        "density: grpo.density weights | uniform | balanced: every module (prompt group) drawn equally often")
    reward: Literal["rm", "shuffled"] = knob("rm: the reward model | shuffled: its rewards permuted within each step "
                                             "(a reward with no information: the negative control)")
    tic_bonus: float = knob("lambda: added to the standardised reward of a completion holding grpo.controls.tic "
                            "(the planted-tic positive control; 0 = off)", ge=0)
    tic_scope: Literal["all", "dense"] = knob("prompts whose completions earn the tic bonus: all | dense: those of "
                                              "the grpo.controls.dense_modules largest modules (mechanism control)")
    entropy_bonus: float = knob("eta: + eta * the policy's per-token entropy in the GRPO objective (entropy "
                                "regularisation, a known mitigation of collapse; 0 = off)", ge=0)
    distinct_bonus: float = knob("mu: + mu * each completion's distinctness from the rest of its group (mean "
                                 "1 - Jaccard of word and bigram sets, rl.controls.distinctness) on the standardised "
                                 "reward (the diversity positive control, after DARLING; 0 = off)", ge=0)


@dataclass(frozen=True)
class ControlsConfig:
    tic: str = knob("the planted tic: a corpus-native string the tic bonus rewards and the evaluation counts "
                    "(share of responses holding it)")
    dense_modules: int = knob("tic_scope dense: the bonus is paid on prompts of this many largest modules", ge=1)


@dataclass(frozen=True)
class GRPOSection:
    seeds: list[int] = knob("GRPO training seeds: every variant is trained once per seed (policy sampling, prompt "
                            "draws)")
    run: list[str] = knob("the variants this run trains and evaluates (a control experiment adds its arms: "
                          "dvc exp run -S 'grpo.run=[...]')")
    variants: dict[str, Variant] = knob("every arm's definition: same SFT model, RM and budget")
    train: PromptGRPOConfig = knob("every run's GRPO settings")
    density: DensityConfig = knob("the density-aware weights")
    controls: ControlsConfig = knob("what the control arms plant")


@dataclass(frozen=True)
class GoldTaskConfig:
    """The chat track's gold-checked task: the docstring summary among distractors (speedrun.data.gold)."""
    samples: int = knob("answers per gold-task item and model (pass@k and coverage@k use all of them)", ge=2)
    max_new_tokens: int = knob("gold-task answer token budget", ge=1)
    margin: float = knob("non-inferiority margin of gold-task pass@1 (absolute share of right answers)", ge=0)


@dataclass(frozen=True)
class EvalConfig:
    comparisons: list[str] = knob("'a:b' pairs of grpo.run variants; the report tests a - b over the training seeds")
    primary: list[DiversityMetric] = knob("the primary diversity outcomes (Holm); the rest are secondary")
    match_words: int = knob("length-matched metrics (EAD-1, distinct-2, self-BLEU-4 with '_first'): each response's "
                            "first N words only (0 = not computed)", ge=0)
    reward_keep: float = knob("reward non-inferiority: a keeps at least this share of b's reward gain over SFT "
                              "(margin = (1 - keep) x b's gain, on the 95% interval)", ge=0, le=1)
    max_prompts: int = knob("held-out prompts used, the first N by prompt_id (0 = all)", ge=0)
    max_prompt_len: int = knob("a longer prompt keeps its chat header and its last tokens (0 = the model's context "
                               "less max_new_tokens)", ge=0)
    samples_per_prompt: int = knob("completions per prompt and sampling seed", ge=1)
    seeds: int = knob("sampling seeds", ge=1)
    max_new_tokens: int = knob("completion token budget", ge=1)
    temperature: float = knob("sampling temperature (the same for every model)", gt=0)
    top_p: float = knob("nucleus sampling mass (1 = off)", gt=0, le=1)
    n_boot: int = knob("bootstrap draws for the intervals", ge=1)
    control_temperatures: list[float] = knob("the SFT model is sampled at each: a primary metric must order them "
                                             "(Spearman >= 0.9) or it leaves the primary list", gt=0)
    gold: GoldTaskConfig = knob("the chat track's gold-checked task (not the task track: see task)")
