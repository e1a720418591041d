"""Can the gold task be learned at this scale? Fine-tunes a checkpoint on the gold task's training conversations only
(optionally with questions about made-up modules, where only copying a listed name pays) and prints the held-out
pass@1 and the copy probe every --every steps.

    python analysis/gold_learnability.py --init outs/pretrain --steps 500 [--synthetic 20000]
Needs outs/tokenizer and data/corpus/objects.parquet (`dvc repro pretrain`). Nothing is written.
"""
import random
from pathlib import Path

import torch
import typer

from speedrun.typer_app import new_app

from speedrun import params
from speedrun import tokenizer as tokenizer_lib
from speedrun.common import use_bf16
from speedrun.data.docstrings import load_objects
from speedrun.data.gold import TEMPLATES, answer_text, check, conversations, distractor_pool, gold_items
from speedrun.engine import completion_texts, generate
from speedrun.probe import copy_probe, merged_tokens
from speedrun.train.checkpoint import load_model
from speedrun.train.data import pad_conversations
from speedrun.train.loop import autocast


def made_up(n: int, seed: int) -> list[list[dict]]:
    """Gold-task questions about invented modules and names: nothing to recall, only the listed names to copy."""
    rng = random.Random(seed)

    def word(lo: int, hi: int) -> str:
        return "".join(rng.choice("bcdfghjklmnprstvwz") + rng.choice("aeiou") for _ in range(rng.randint(lo, hi)))

    def member() -> str:
        parts = [word(1, 3) for _ in range(rng.randint(1, 2))]
        return "_".join(parts) if rng.random() < 0.5 else "".join(p.capitalize() for p in parts)

    out = []
    for _ in range(n):
        kind, module = rng.choice(sorted(TEMPLATES)), word(2, 4)
        right = [f"{module}.{member()}" for _ in range(rng.randint(2, 4))]
        names = right + [f"{word(2, 4)}.{member()}" for _ in range(2)]
        rng.shuffle(names)
        q = rng.choice(TEMPLATES[kind]).format(module=module, names=", ".join(answer_text(x) for x in names))
        out.append([{"role": "user", "content": q}, {"role": "assistant", "content": answer_text(rng.choice(right))}])
    return out


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, rows: list, pad_id: int, bf16: bool) -> float:
    """One AdamW step on a batch of rendered conversations (loss on assistant tokens); the loss."""
    model.train()
    x, y = pad_conversations(rows, 256, pad_id)
    with autocast("cpu", bf16):
        loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


app = new_app()


@app.command(help=__doc__)
def main(init: Path = typer.Option(Path("outs/pretrain"), help="checkpoint to fine-tune"),
         steps: int = typer.Option(500),
         every: int = typer.Option(100),
         lr: float = typer.Option(3e-3),
         batch: int = typer.Option(32),
         per_item: int = typer.Option(32, help="questions per training item"),
         synthetic: int = typer.Option(0, help="made-up-module questions added"),
         samples: int = typer.Option(8, help="answers per held-out item"),
         threads: int = typer.Option(2)) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    p = params.load()
    tok = tokenizer_lib.load("outs/tokenizer")
    items = gold_items(load_objects(Path("data/corpus/objects.parquet")), p.corpus.val_frac, p.prompts.eval_frac)
    convs = conversations(items, "train", per_item, p.seed) + made_up(synthetic, 1)
    train = [tok.render_conversation(c) for c in convs]
    held = [i for i in items if i.split == "eval"]
    prompts = [tok.render_prompt([{"role": "user", "content": i.prompt(distractor_pool(items))}]) for i in held]
    model, _ = load_model(init, "cpu", tok.digest)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    rng, bf16 = random.Random(0), use_bf16(p.compute.dtype, "cpu")
    print(f"{len(train)} training conversations ({synthetic} made up), {len(held)} held-out items, "
          f"{'bf16' if bf16 else 'fp32'}")
    for step in range(1, steps + 1):
        loss = train_step(model, opt, [train[rng.randrange(len(train))] for _ in range(batch)], tok.bos_id, bf16)
        if step % every == 0:
            model.eval()
            g = torch.Generator().manual_seed(0)
            out = generate(model, prompts, samples, 16, temperature=1.0, stop_id=tok.assistant_end_id,
                           pad_id=tok.bos_id, generator=g)
            texts = completion_texts(out, tok)
            right = sum(check(held[r // samples], t) is not None for r, t in enumerate(texts))
            probe = copy_probe(model, *merged_tokens(tok), p.seed, "cpu")
            print(f"step {step}: train loss {loss:.3f}, held-out pass@1 {right / len(texts):.3f}, "
                  f"copy gain {probe['gain']:+.2f} nats/token, e.g. {texts[:3]}", flush=True)


if __name__ == "__main__":
    app()
