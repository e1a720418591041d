"""Stage pretrain: a GPT trained on the packed corpus; val bits-per-byte, early stopping, resume, DDP."""
from pathlib import Path

import pandas as pd
import typer

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import seed_everything, pick_device, use_bf16, write_json
from speedrun.model import GPT, GPTConfig
from speedrun.train import data, distributed
from speedrun.train.checkpoint import save_model
from speedrun.train.loop import TrainConfig, train
from speedrun.train.outputs import sample_texts, throughput, write_logs
from speedrun.params import from_options
from speedrun.cli import stage_flags


@stage_flags(scratch_dir=Path("scratch/pretrain"))
def main(corpus_dir: Path, tokenizer_dir: Path, depth: int, width: int, head_dim: int, seq_len: int, steps: int,
         batch_size: int, micro_batch: int, lr: float, optimizer: str, weight_decay: float, warmup_steps: int,
         final_lr_frac: float, grad_clip: float, eval_every: int, eval_windows: int, patience: int, min_delta: float,
         save_every: int, scratch_dir: Path, seed: int, device: str, dtype: str, nproc: int, out_dir: Path,
         metrics: Path) -> None:
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
