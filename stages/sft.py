"""Stage sft: fine-tune the pretrained GPT on chat conversations, loss on assistant tokens only."""
from pathlib import Path

import typer

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import pick_device, use_bf16, seed_everything, write_json
from speedrun.data import sft as sft_data
from speedrun.train import data, distributed
from speedrun.train.checkpoint import load_model, save_model
from speedrun.train.loop import TrainConfig, train
from speedrun.train.outputs import sample_texts, throughput, write_logs
from speedrun.params import from_options
from speedrun.cli import stage_flags


@stage_flags(micro_tokens=2048, scratch_dir=Path("scratch/sft"))
def main(init_dir: Path, tokenizer_dir: Path, source: str, val_frac: float, per_object: int, hf_path: str,
         hf_name: str, hf_split: str, hf_val_split: str, max_rows: int, max_len: int, steps: int, batch_size: int,
         micro_batch: int, micro_tokens: int, lr: float, optimizer: str, weight_decay: float, warmup_steps: int,
         final_lr_frac: float, grad_clip: float, eval_every: int, eval_convs: int, patience: int, min_delta: float,
         save_every: int, scratch_dir: Path, seed: int, device: str, dtype: str, nproc: int, objects: Path,
         out_dir: Path, metrics: Path) -> None:
    distributed.maybe_relaunch(nproc, "stages.sft")
    d = distributed.setup(pick_device(device))
    tok = tokenizer_lib.load(tokenizer_dir)
    skipped: dict[str, int] = {}
    if source == "embedded":
        convs = sft_data.embedded_conversations(objects, val_frac, seed, per_object, skipped)
    elif source == "hf":
        train_convs, skipped = sft_data.hf_conversations(hf_path, hf_name or None, hf_split, max_rows)
        val_convs, val_skipped = sft_data.hf_conversations(hf_path, hf_name or None, hf_val_split, eval_convs)
        convs = {"train": train_convs, "val": val_convs}
        skipped = {**skipped, **{f"val_{k}": v for k, v in val_skipped.items()}}
    else:
        raise typer.BadParameter(f"--source must be embedded or hf, not {source!r}")
    rendered = {s: [tok.render_conversation(c) for c in cs] for s, cs in convs.items()}
    val = rendered["val"][:eval_convs]
    seed_everything(seed)
    model, meta = load_model(init_dir, d.device, tok.digest)
    model.train()
    cfg = from_options(TrainConfig, locals(), bf16=use_bf16(dtype, d.device), monitor="val_loss")
    sampler = data.StepSampler(len(rendered["train"]), batch_size, micro_batch, seed, "sft")
    if d.is_main:
        print(f"sft: {len(rendered['train'])} train / {len(rendered['val'])} val conversations "
              f"(skipped {skipped}), {d.world} process(es) on {d.device} in {'bf16' if cfg.bf16 else 'fp32'}")
    result = train(model, cfg, data.sft_batch_fn(rendered["train"], sampler, max_len, tok.bos_id, micro_tokens),
                   lambda m: {"val_loss": data.masked_loss(m, val, max_len, tok.bos_id, 32, d.device)}, d,
                   scratch=scratch_dir, fingerprint=f"sft|{tok.digest}|{meta}|{source}|{seed}|{batch_size}",
                   name="sft")
    if d.is_main:
        model.load_state_dict(result.best_state)
        m = {"val_loss": round(result.best_eval["val_loss"], 5), "val_loss_before": round(result.evals[0]["val_loss"], 5),
             "steps": result.steps_done, "stopped_early": result.stopped_early, "tokens_seen": result.tokens,
             "train_conversations": len(rendered["train"]), "skipped": skipped,
             **throughput(result, model.estimate_flops())}
        save_model(out_dir, result.best_state, model.config,
                   {"tokenizer": tok.digest, "step": result.steps_done, "val_loss": m["val_loss"], "init": str(init_dir)})
        write_logs(out_dir, result)
        write_json(metrics, m)
        prompts = [tok.render_prompt(c[:-1]) for c in convs["val"][:3]]
        for text, conv in zip(sample_texts(model, tok, prompts, 48, d.device, seed, tok.assistant_end_id), convs["val"]):
            print("sample:", text.replace("\n", "\\n"), "| reference:", conv[-1]["content"][:120])
        print(f"sft: val loss {m['val_loss_before']:.3f} (pretrained) -> {m['val_loss']:.3f} after {m['steps']} steps")
    distributed.teardown()


if __name__ == "__main__":
    typer.run(main)
