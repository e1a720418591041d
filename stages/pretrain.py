"""Stage pretrain: a GPT trained on the packed corpus; val bits-per-byte, early stopping, resume, DDP."""
import dataclasses

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import files_digest, pick_device, seed_everything, use_bf16, write_json
from speedrun.model import GPT, GPTConfig
from speedrun.stage import run_stage
from speedrun.train import data, distributed
from speedrun.train.checkpoint import save_model
from speedrun.train.loop import train
from speedrun.probe import copy_gain
from speedrun.train.outputs import sample_texts, throughput, write_logs

READS = ("seed", "compute", "model", "pretrain")
PATHS = {"tokens_dir": "data/tokens", "tokenizer_dir": "outs/tokenizer", "scratch_dir": "scratch/pretrain",
         "out_dir": "outs/pretrain", "metrics": "reports/metrics/pretrain.json"}


def main(p, io) -> None:
    distributed.maybe_relaunch(p.compute.nproc, "stages.pretrain")
    d = distributed.setup(pick_device(p.compute.device))
    c, mc = p.pretrain, p.model
    tok = tokenizer_lib.load(io.tokenizer_dir)
    train_win = data.windows(data.read_tokens(io.tokens_dir / "train.bin", tok.digest), mc.seq_len)
    val_win = data.windows(data.read_tokens(io.tokens_dir / "val.bin", tok.digest), mc.seq_len)[:c.eval_windows]
    tbytes = data.token_bytes(tok)
    seed_everything(p.seed)
    config = GPTConfig(vocab_size=tok.vocab_size, depth=mc.depth, n_embd=mc.width, head_dim=mc.head_dim,
                       seq_len=mc.seq_len)
    model = GPT(config).to(d.device)
    cfg = dataclasses.replace(c, bf16=use_bf16(p.compute.dtype, d.device),
                              compile=p.compute.compile, monitor="val_bpb")
    sampler = data.StepSampler(len(train_win), c.batch_size, c.micro_batch, p.seed, "pretrain")
    if d.is_main:
        print(f"pretrain: {model.num_params() / 1e6:.2f}M params, {len(train_win)} train windows of {mc.seq_len}, "
              f"{len(val_win)} val windows, {d.world} process(es) on {d.device} in {'bf16' if cfg.bf16 else 'fp32'}")
    result = train(model, cfg, data.lm_batch_fn(train_win, sampler),
                   lambda m: {"val_bpb": data.bits_per_byte(m, val_win, tbytes, 16, d.device)}, d,
                   scratch=io.scratch_dir, name="pretrain",
                   fingerprint=f"pretrain|{p.digest()}|{files_digest(io.tokens_dir, io.tokenizer_dir)}")
    if d.is_main:
        model.load_state_dict(result.best_state)
        m = {"val_bpb": round(result.best_eval["val_bpb"], 5), "steps": result.steps_done,
             "stopped_early": result.stopped_early, "tokens_seen": result.tokens,
             "params": model.num_params(), **throughput(result, model.estimate_flops())}
        save_model(io.out_dir, result.best_state, config,
                   {"tokenizer": tok.digest, "step": result.best_step, "val_bpb": m["val_bpb"]})
        write_logs(io.out_dir, result)
        m["copy_gain"] = copy_gain(model, tok, p.seed, d.device)  # can it copy from its context? (outputs.py)
        write_json(io.metrics, m)
        prompts = [[tok.bos_id] + tok.encode(s) for s in ["json.dumps(", "class ", "The "]]
        for text in sample_texts(model, tok, prompts, 32, d.device, p.seed):
            print("sample:", text.replace("\n", "\\n"))
        print(f"pretrain: val bpb {m['val_bpb']:.4f} after {m['steps']} steps, {m['tokens_per_s']:,.0f} tok/s")
    distributed.teardown()


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
