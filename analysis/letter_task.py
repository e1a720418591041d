"""Could a gold-checked task that needs neither recall nor copying reach pass@1 >= 0.3 at this scale? The candidate:
"Name a letter that comes after `d` and before `j` in the alphabet." (gaps of 3-8, so 2-7 right letters; a
uniformly random letter is right 17% of the time). Item = (first, last) letter pair; a quarter of the pairs are held
out by a stable hash, so a held-out question is a pair never trained on. Fine-tunes a checkpoint on the training
pairs' questions, alone or mixed into the embedded SFT conversations at a given share of each batch, and prints the
held-out pass@1 and coverage (distinct right letters per item) every --every steps, beside the chance rate.

    python analysis/letter_task.py --init outs/pretrain --steps 200 --batch 32 --share 1
    python analysis/letter_task.py --init outs/pretrain --steps 400 --batch 64 --share 0.3
Needs outs/tokenizer, outs/pretrain and data/corpus/objects.parquet (`dvc repro pretrain`). Nothing is written.
"""
import random
import re
import string
from pathlib import Path

import torch
import typer

from speedrun.typer_app import new_app
from gold_learnability import train_step  # analysis/ is the script's directory: on sys.path

from speedrun import params
from speedrun import tokenizer as tokenizer_lib
from speedrun.common import stable_unit, use_bf16
from speedrun.data.sft import embedded_conversations
from speedrun.engine import completion_texts, generate
from speedrun.train.checkpoint import load_model

LETTERS = string.ascii_lowercase
PAIRS = [(a, b) for a in range(26) for b in range(a + 3, min(a + 9, 26))]  # 2-7 letters strictly between
ANSWER = re.compile(r"`([a-z])`")


def question(a: int, b: int) -> str:
    return f"Name a letter that comes after `{LETTERS[a]}` and before `{LETTERS[b]}` in the alphabet."


app = new_app()


@app.command(help=__doc__)
def main(init: Path = typer.Option(Path("outs/pretrain"), help="checkpoint to fine-tune"),
         steps: int = typer.Option(200),
         every: int = typer.Option(50),
         lr: float = typer.Option(1e-3),
         batch: int = typer.Option(32),
         per_item: int = typer.Option(32, help="questions per training pair"),
         share: float = typer.Option(1.0, help="share of each batch drawn from the letter questions (rest: SFT)"),
         samples: int = typer.Option(8, help="answers per held-out pair"),
         threads: int = typer.Option(2)) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    p = params.load()
    tok = tokenizer_lib.load("outs/tokenizer")
    held = [pr for pr in PAIRS if stable_unit("letters", *map(str, pr)) < 0.25]
    rng = random.Random(0)
    task = [tok.render_conversation([{"role": "user", "content": question(a, b)},
                                     {"role": "assistant", "content": f"`{LETTERS[rng.randrange(a + 1, b)]}`"}])
            for a, b in PAIRS if (a, b) not in held for _ in range(per_item)]
    sft = [] if share >= 1 else [tok.render_conversation(c) for c in embedded_conversations(
        Path("data/corpus/objects.parquet"), p.corpus.val_frac, p.prompts.eval_frac, p.seed)["train"]]
    chance = sum((b - a - 1) / 26 for a, b in held) / len(held)
    prompts = [tok.render_prompt([{"role": "user", "content": question(a, b)}]) for a, b in held]
    model, _ = load_model(init, "cpu", tok.digest)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    bf16 = use_bf16(p.compute.dtype, "cpu")
    print(f"{len(task)} letter questions, {len(sft)} SFT conversations, share {share}, {len(held)} held-out pairs, "
          f"chance pass@1 {chance:.3f}, {'bf16' if bf16 else 'fp32'}")
    for step in range(1, steps + 1):
        rows = [task[rng.randrange(len(task))] if rng.random() < share else sft[rng.randrange(len(sft))]
                for _ in range(batch)]
        loss = train_step(model, opt, rows, tok.bos_id, bf16)
        if step % every == 0:
            model.eval()
            out = generate(model, prompts, samples, 6, temperature=1.0, stop_id=tok.assistant_end_id,
                           pad_id=tok.bos_id, generator=torch.Generator().manual_seed(0))
            right: set[tuple[int, str]] = set()
            n_right, texts = 0, completion_texts(out, tok)
            for r, text in enumerate(texts):
                a, b = held[r // samples]
                m = ANSWER.search(text)
                if m and a < LETTERS.index(m.group(1)) < b:
                    n_right += 1
                    right.add((r // samples, m.group(1)))
            print(f"step {step}: loss {loss:.3f}, held-out pass@1 {n_right / len(texts):.3f} (chance "
                  f"{chance:.3f}), coverage@{samples} {len(right) / len(held):.2f}", flush=True)


if __name__ == "__main__":
    app()
