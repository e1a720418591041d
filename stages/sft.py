"""Stage sft: fine-tune the pretrained GPT on chat conversations, loss on assistant tokens only."""
from pathlib import Path

import torch
import typer

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import pick_device, DTYPE_HELP, use_bf16, seed_everything, write_json
from speedrun.data import sft as sft_data
from speedrun.train import data, distributed
from speedrun.train.checkpoint import load_model, save_model
from speedrun.train.loop import TrainConfig, train
from speedrun.train.outputs import sample_texts, throughput, write_logs
from speedrun.params import from_options, param_default


def main(
    init_dir: Path = typer.Option(Path("outs/pretrain"), help="checkpoint to start from"),
    tokenizer_dir: Path = typer.Option(Path("outs/tokenizer"), help="trained tokenizer"),
    source: str = typer.Option(param_default("sft.source"),
                               help="embedded (questions about stdlib objects) or hf (messages data)"),
    val_frac: float = typer.Option(param_default("corpus.val_frac"),
                                   help="embedded: val share of modules (same split as the corpus)"),
    per_object: int = typer.Option(param_default("sft.per_object"),
                                   help="embedded: question templates per object (0 = all)"),
    hf_path: str = typer.Option(param_default("sft.hf_path"), help="hub id or local dir in the hub layout"),
    hf_name: str = typer.Option(param_default("sft.hf_name"), help="dataset config name ('' = none)"),
    hf_split: str = typer.Option("train", help="split to stream for training"),
    hf_val_split: str = typer.Option("test", help="split to stream for validation"),
    max_rows: int = typer.Option(param_default("sft.max_rows"), help="hf: rows to stream per split"),
    max_len: int = typer.Option(param_default("sft.max_len"), help="conversations are cut to this many tokens"),
    steps: int = typer.Option(param_default("sft.steps"), help="optimizer steps (at most)"),
    batch_size: int = typer.Option(param_default("sft.batch_size"),
                                   help="conversations per optimizer step, all processes together"),
    micro_batch: int = typer.Option(0, help="conversations per forward per process (0 = the whole share)"),
    micro_tokens: int = typer.Option(2048, help="re-cut micro-batches by length to at most this many padded "
                                               "tokens (same gradient, less padding; 0 = off)"),
    lr: float = typer.Option(param_default("sft.lr"), help="peak learning rate"),
    optimizer: str = typer.Option(param_default("sft.optimizer"),
                                  help="adamw, or muon: Muon on the transformer blocks' matrices, "
                                       "AdamW on embeddings, head and vectors (one lr for both)"),
    weight_decay: float = typer.Option(0.0, help="weight decay on matrices"),
    warmup_steps: int = typer.Option(param_default("sft.warmup_steps"), help="linear warmup steps"),
    final_lr_frac: float = typer.Option(0.1, help="lr at the last step as a fraction of the peak"),
    grad_clip: float = typer.Option(1.0, help="max gradient norm"),
    eval_every: int = typer.Option(param_default("sft.eval_every"), help="steps between val evaluations"),
    eval_convs: int = typer.Option(param_default("sft.eval_convs"), help="val conversations per evaluation"),
    patience: int = typer.Option(param_default("sft.patience"),
                                 help="evals without improvement before stopping (0 = off)"),
    min_delta: float = typer.Option(param_default("sft.min_delta"),
                                    help="improvement in val loss that resets patience"),
    save_every: int = typer.Option(param_default("sft.save_every"),
                                   help="steps between scratch (resume) checkpoints; 0 = off"),
    scratch_dir: Path = typer.Option(Path("scratch/sft"), help="resume state (not a DVC out)"),
    seed: int = typer.Option(param_default("seed"), help="seed of data order and sampling"),
    device: str = typer.Option(param_default("compute.device"), help="auto | cpu | cuda"),
    dtype: str = typer.Option(param_default("compute.dtype"), help=DTYPE_HELP),
    nproc: int = typer.Option(param_default("compute.nproc"), help="processes (torchrun) for DDP; 1 = plain python"),
    objects: Path = typer.Option(Path("data/corpus/objects.parquet"), help="the corpus stage's object table "
                                                                           "(embedded conversations)"),
    out_dir: Path = typer.Option(Path("outs/sft"), help="model.pt, meta.json, log.csv, eval.csv"),
    metrics: Path = typer.Option(Path("reports/metrics/sft.json"), help="metrics JSON"),
) -> None:
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
