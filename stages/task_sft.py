"""Stage task_sft: the task stage after chat SFT (nanochat's midtraining): the task track's base model (task_base:
the lab's chat model, or a pretrained checkpoint in its ChatML template) is fine-tuned on the task's train items
(every template, right answer and phrasing drawn at random), loss on the answer only -> outs/task_sft.
Reports the val items' pass@1 and coverage at temperature 1 (the eval items stay for task_eval)."""
import dataclasses

from speedrun import tokenizer as tokenizer_lib
from speedrun.common import files_digest, pick_device, seed_everything, use_bf16, write_json
from speedrun.data import task
from speedrun.eval.task_track import sample_answers, summary
from speedrun.stage import run_stage
from speedrun.train import data, distributed
from speedrun.train.checkpoint import context_length, load_model, save_model
from speedrun.train.loop import train
from speedrun.train.outputs import throughput, write_logs
from speedrun.trunk import freeze_trunk

READS = ("compute", "task.sft", "task.eval.samples", "task.eval.max_new_tokens")
PATHS = {"init_dir": "outs/task_base", "tokenizer_dir": "outs/task_base/tokenizer", "items": "data/task/items.parquet",
         "scratch_dir": "scratch/task_sft", "out_dir": "outs/task_sft", "metrics": "reports/metrics/task_sft.json"}


def main(p, io) -> None:
    distributed.maybe_relaunch(p.compute.nproc, "stages.task_sft")
    d = distributed.setup(pick_device(p.compute.device))
    c = dataclasses.replace(p.task.sft, max_len=context_length(p.task.sft.max_len, io.init_dir, key="task.sft.max_len"))
    tok = tokenizer_lib.load(io.tokenizer_dir)
    items = task.load_items(io.items)
    convs = {s: task.conversations(items, s, c.per_item, c.seed) for s in ("train", "val")}
    rendered = {s: [tok.render_conversation(conv) for conv in cs] for s, cs in convs.items()}
    val = rendered["val"][:c.eval_convs]
    seed_everything(c.seed)
    model, base = load_model(io.init_dir, d.device, tok.digest)
    freeze_trunk(model, c.frozen_blocks, "task.sft.frozen_blocks")
    model.train()
    cfg = dataclasses.replace(c, bf16=use_bf16(p.compute.dtype, d.device), compile=p.compute.compile,
                              monitor="val_loss")
    sampler = data.StepSampler(len(rendered["train"]), c.batch_size, c.micro_batch, c.seed, "task_sft")
    if d.is_main:
        print(f"task_sft: {len(rendered['train'])} train / {len(rendered['val'])} val conversations, {d.world} "
              f"process(es) on {d.device} in {'bf16' if cfg.bf16 else 'fp32'}")
    inputs = files_digest(io.init_dir / "model.pt", io.tokenizer_dir, io.items)
    result = train(model, cfg, data.sft_batch_fn(rendered["train"], sampler, c.max_len, tok.bos_id),
                   lambda m: {"val_loss": data.masked_loss(m, val, c.max_len, tok.bos_id, 64, d.device)}, d,
                   scratch=io.scratch_dir, fingerprint=f"task_sft|{p.digest()}|{inputs}", name="task_sft")
    if d.is_main:
        model.load_state_dict(result.best_state)
        val_items = [i for i in items if i.split == "val"]
        answers = sample_answers(model, "task_sft", tok, val_items, p.task.eval.samples, p.task.eval.max_new_tokens,
                                 1.0, c.seed, d.device)
        s = summary(answers, (1,))["all"]
        m = {"val_loss": round(result.best_eval["val_loss"], 5), "val_loss_before": round(result.evals[0]["val_loss"],
                                                                                          5),
             "steps": result.steps_done, "stopped_early": result.stopped_early, "tokens_seen": result.tokens,
             "train_conversations": len(rendered["train"]), "val_items": len(val_items),
             "val_pass@1": s["pass@1"], "val_coverage": s["coverage"], **throughput(result, model.estimate_flops())}
        save_model(io.out_dir, result.best_state, model.config,
                   {"tokenizer": tok.digest, "step": result.best_step, "val_loss": m["val_loss"],
                    "init": base.get("base", str(io.init_dir))})
        write_logs(io.out_dir, result)
        write_json(io.metrics, m)
        for text in answers["text"][:: p.task.eval.samples][:4]:
            print("sample:", text)
        print(f"task_sft: val loss {m['val_loss_before']:.3f} -> {m['val_loss']:.3f} after {m['steps']} steps; val "
              f"items pass@1 {m['val_pass@1']:.3f}, coverage@{p.task.eval.samples} {m['val_coverage']:.2f} at T=1")
    distributed.teardown()


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
