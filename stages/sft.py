"""Stage sft: fine-tune the chat track's base (stage base: the lab's pretrained GPT, or a pretrained checkpoint in its
ChatML template) on chat conversations, loss on assistant tokens only; sft.frozen_blocks leaves its bottom blocks as
they came, sft.steps 0 passes the base on as it came (evaluated)."""
import dataclasses

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import files_digest, pick_device, seed_everything, use_bf16, write_json
from speedrun.data import sft as sft_data
from speedrun.stage import run_stage
from speedrun.train import data, distributed
from speedrun.train.checkpoint import context_length, load_model, save_model
from speedrun.train.loop import train
from speedrun.probe import copy_gain
from speedrun.train.outputs import sample_texts, throughput, write_logs
from speedrun.trunk import freeze_trunk

READS = ("seed", "corpus.val_frac", "prompts.eval_frac", "compute", "sft")
PATHS = {"init_dir": "outs/base", "tokenizer_dir": "outs/base/tokenizer", "objects": "data/corpus/objects.parquet",
         "scratch_dir": "scratch/sft", "out_dir": "outs/sft", "metrics": "reports/metrics/sft.json"}


def main(p, io) -> None:
    distributed.maybe_relaunch(p.compute.nproc, "stages.sft")
    d = distributed.setup(pick_device(p.compute.device))
    c = dataclasses.replace(p.sft, max_len=context_length(p.sft.max_len, io.init_dir, key="sft.max_len"))
    tok = tokenizer_lib.load(io.tokenizer_dir)
    skipped: dict[str, int] = {}
    if c.source == "embedded":
        convs = sft_data.embedded_conversations(io.objects, p.corpus.val_frac, p.prompts.eval_frac, p.seed,
                                                c.per_object, c.gold_per_item, skipped)
    else:
        train_convs, skipped = sft_data.hf_conversations(c.hf_path, c.hf_name or None, c.hf_split, c.max_rows,
                                                         seed=p.seed, shuffle_buffer=c.hf_shuffle_buffer)
        val_convs, val_skipped = sft_data.hf_conversations(c.hf_path, c.hf_name or None, c.hf_val_split, c.eval_convs)
        convs = {"train": train_convs, "val": val_convs}
        skipped = {**skipped, **{f"val_{k}": v for k, v in val_skipped.items()}}
    rendered = {s: [tok.render_conversation(conv) for conv in cs] for s, cs in convs.items()}
    val = rendered["val"][:c.eval_convs]
    seed_everything(p.seed)
    model, base = load_model(io.init_dir, d.device, tok.digest)
    freeze_trunk(model, c.frozen_blocks, "sft.frozen_blocks")
    model.train()
    cfg = dataclasses.replace(c, bf16=use_bf16(p.compute.dtype, d.device),
                              compile=p.compute.compile, monitor="val_loss")
    sampler = data.StepSampler(len(rendered["train"]), c.batch_size, c.micro_batch, p.seed, "sft")
    if d.is_main:
        print(f"sft: {len(rendered['train'])} train / {len(rendered['val'])} val conversations "
              f"(skipped {skipped}), {d.world} process(es) on {d.device} in {'bf16' if cfg.bf16 else 'fp32'}")
        if cut := sum(not any(mask[1:c.max_len + 1]) for _, mask in rendered["train"]):
            print(f"sft: {cut} train conversations end at sft.max_len {c.max_len} before their answer: they teach "
                  "nothing (a longer sft.max_len keeps them)")
    inputs = files_digest(io.init_dir / "model.pt", io.tokenizer_dir, io.objects)
    result = train(model, cfg, data.sft_batch_fn(rendered["train"], sampler, c.max_len, tok.bos_id, c.micro_tokens),
                   lambda m: {"val_loss": data.masked_loss(m, val, c.max_len, tok.bos_id, 32, d.device)}, d,
                   scratch=io.scratch_dir, fingerprint=f"sft|{p.digest()}|{inputs}", name="sft")
    if d.is_main:
        model.load_state_dict(result.best_state)
        m = {"val_loss": round(result.best_eval["val_loss"], 5),
             "val_loss_before": round(result.evals[0]["val_loss"], 5), "steps": result.steps_done,
             "stopped_early": result.stopped_early, "tokens_seen": result.tokens,
             "source": c.source, "train_conversations": len(rendered["train"]), "skipped": skipped,
             **throughput(result, model.estimate_flops())}
        save_model(io.out_dir, result.best_state, model.config,
                   {"tokenizer": tok.digest, "step": result.best_step, "val_loss": m["val_loss"],
                    "init": base.get("base", str(io.init_dir))})
        write_logs(io.out_dir, result)
        m["copy_gain"] = copy_gain(model, tok, p.seed, d.device)  # can it copy from its context? (outputs.py)
        write_json(io.metrics, m)
        prompts = [tok.render_prompt(conv[:-1]) for conv in convs["val"][:3]]
        samples = sample_texts(model, tok, prompts, 48, d.device, p.seed, tok.assistant_end_id)
        for text, conv in zip(samples, convs["val"]):
            print("sample:", text.replace("\n", "\\n"), "| reference:", conv[-1]["content"][:120])
        print(f"sft: val loss {m['val_loss_before']:.3f} (the base) -> {m['val_loss']:.3f} after {m['steps']} steps")
    distributed.teardown()


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
