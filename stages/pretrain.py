"""Stage pretrain: a GPT trained on the packed corpus; val bits-per-byte, early stopping, resume, DDP."""
from pathlib import Path

import pandas as pd
import torch
import typer

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import seed_everything, pick_device, DTYPE_HELP, use_bf16, write_json
from speedrun.model import GPT, GPTConfig
from speedrun.train import data, distributed
from speedrun.train.checkpoint import save_model
from speedrun.train.loop import TrainConfig, train
from speedrun.train.outputs import sample_texts, throughput, write_logs
from speedrun.params import from_options, param_default


def main(
    corpus_dir: Path = typer.Option(Path("data/corpus"), help="train.parquet / val.parquet"),
    tokenizer_dir: Path = typer.Option(Path("outs/tokenizer"), help="trained tokenizer"),
    depth: int = typer.Option(param_default("model.depth"),
                              help="transformer blocks; width = 64 * depth unless --width"),
    width: int = typer.Option(0, help="model width (0 = 64 * depth)"),
    head_dim: int = typer.Option(param_default("model.head_dim"), help="attention head dimension"),
    seq_len: int = typer.Option(param_default("model.seq_len"), help="context length of the training windows"),
    steps: int = typer.Option(param_default("pretrain.steps"), help="optimizer steps (at most)"),
    batch_size: int = typer.Option(param_default("pretrain.batch_size"),
                                   help="windows per optimizer step, all processes together"),
    micro_batch: int = typer.Option(0, help="windows per forward per process (0 = the whole share)"),
    lr: float = typer.Option(param_default("pretrain.lr"), help="peak learning rate"),
    optimizer: str = typer.Option(param_default("pretrain.optimizer"),
                                  help="adamw, or muon: Muon on the transformer blocks' matrices, "
                                       "AdamW on embeddings, head and vectors (one lr for both)"),
    weight_decay: float = typer.Option(0.0, help="weight decay on matrices"),
    warmup_steps: int = typer.Option(param_default("pretrain.warmup_steps"), help="linear warmup steps"),
    final_lr_frac: float = typer.Option(0.1, help="lr at the last step as a fraction of the peak"),
    grad_clip: float = typer.Option(1.0, help="max gradient norm"),
    eval_every: int = typer.Option(param_default("pretrain.eval_every"), help="steps between val evaluations"),
    eval_windows: int = typer.Option(param_default("pretrain.eval_windows"), help="val windows per evaluation"),
    patience: int = typer.Option(param_default("pretrain.patience"),
                                 help="evals without improvement before stopping (0 = off)"),
    min_delta: float = typer.Option(param_default("pretrain.min_delta"),
                                    help="improvement in val bpb that resets patience"),
    save_every: int = typer.Option(param_default("pretrain.save_every"),
                                   help="steps between scratch (resume) checkpoints; 0 = off"),
    scratch_dir: Path = typer.Option(Path("scratch/pretrain"), help="resume state (not a DVC out)"),
    seed: int = typer.Option(param_default("seed"), help="seed of init and data order"),
    device: str = typer.Option(param_default("compute.device"), help="auto | cpu | cuda"),
    dtype: str = typer.Option(param_default("compute.dtype"), help=DTYPE_HELP),
    nproc: int = typer.Option(param_default("compute.nproc"), help="processes (torchrun) for DDP; 1 = plain python"),
    out_dir: Path = typer.Option(Path("outs/pretrain"), help="model.pt, meta.json, log.csv, eval.csv"),
    metrics: Path = typer.Option(Path("reports/metrics/pretrain.json"), help="metrics JSON"),
) -> None:
    distributed.maybe_relaunch(nproc, "stages.pretrain")
    d = distributed.setup(pick_device(device))
    tok = tokenizer_lib.load(tokenizer_dir)
    train_win = data.windows(data.pack_documents(pd.read_parquet(corpus_dir / "train.parquet")["text"].tolist(),
                                                 tok), seq_len)
    val_win = data.windows(data.pack_documents(pd.read_parquet(corpus_dir / "val.parquet")["text"].tolist(),
                                               tok), seq_len)[:eval_windows]
    tbytes = data.token_bytes(tok)
    seed_everything(seed)
    config = GPTConfig(vocab_size=tok.vocab_size, depth=depth, n_embd=width, head_dim=head_dim, seq_len=seq_len)
    model = GPT(config).to(d.device)
    cfg = from_options(TrainConfig, locals(), bf16=use_bf16(dtype, d.device), monitor="val_bpb")
    sampler = data.StepSampler(len(train_win), batch_size, micro_batch, seed, "pretrain")
    if d.is_main:
        print(f"pretrain: {model.num_params() / 1e6:.2f}M params, {len(train_win)} train windows of {seq_len}, "
              f"{len(val_win)} val windows, {d.world} process(es) on {d.device} in {'bf16' if cfg.bf16 else 'fp32'}")
    result = train(model, cfg, data.lm_batch_fn(train_win, sampler),
                   lambda m: {"val_bpb": data.bits_per_byte(m, val_win, tbytes, 16, d.device)}, d,
                   scratch=scratch_dir, fingerprint=f"pretrain|{tok.digest}|{config}|{seed}|{batch_size}",
                   name="pretrain")
    if d.is_main:
        model.load_state_dict(result.best_state)
        m = {"val_bpb": round(result.best_eval["val_bpb"], 5), "steps": result.steps_done,
             "stopped_early": result.stopped_early, "tokens_seen": result.tokens,
             "params": model.num_params(), **throughput(result, model.estimate_flops())}
        save_model(out_dir, result.best_state, config,
                   {"tokenizer": tok.digest, "step": result.steps_done, "val_bpb": m["val_bpb"]})
        write_logs(out_dir, result)
        write_json(metrics, m)
        prompts = [[tok.bos_id] + tok.encode(p) for p in ["json.dumps(", "class ", "The "]]
        for text in sample_texts(model, tok, prompts, 32, d.device, seed):
            print("sample:", text.replace("\n", "\\n"))
        print(f"pretrain: val bpb {m['val_bpb']:.4f} after {m['steps']} steps, {m['tokens_per_s']:,.0f} tok/s")
    distributed.teardown()


if __name__ == "__main__":
    typer.run(main)
