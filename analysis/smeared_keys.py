"""Does a one-layer copying circuit make the gold task learnable? Smeared keys (Olsson et al. 2022): each attention
key mixes in the previous position's key by a learned per-head weight, so one layer can find "the token after the
last time this token appeared" and copy it, the circuit induction heads otherwise build from two layers.

Pretrains with smeared keys (the pipeline's pretrain stage and params) unless --init is given, then fine-tunes like
analysis/gold_learnability.py on the gold task's training conversations mixed with made-up-module questions (only
copying a listed name pays there), and prints every --every steps: the training loss, the copy-probe gain, and
held-out pass@1, sampled (temperature 1) and greedy, on the real eval items and on fresh made-up questions.

    python analysis/smeared_keys.py --steps 400                                  # smeared keys
    python analysis/smeared_keys.py --no-smear --init outs/pretrain --steps 400  # the same fine-tune, plain attention
The smear patches the library's attention for full forwards only (no KV cache), so answers are drawn by full
forwards, one prompt's samples per batch (no padding): exact, slow. Writes only under --scratch.
Needs outs/tokenizer and data/corpus (`dvc repro pretrain`).
"""
from typing import Optional
import random
import runpy
import sys
from pathlib import Path

import torch
import torch.nn as nn
import typer

from speedrun.typer_app import new_app

from speedrun import model as model_lib
from speedrun import params
from speedrun import tokenizer as tokenizer_lib
from speedrun.data.docstrings import load_objects
from speedrun.data.gold import _NAME, check, conversations, distractor_pool, extract, gold_items
from speedrun.probe import copy_probe, merged_tokens
from speedrun.train.checkpoint import load_model

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]  # analysis/ and the stages package
from gold_learnability import made_up, train_step  # noqa: E402


def smear_keys() -> None:
    """Patch every attention layer: key_t <- a k_t + (1 - a) k_{t-1}, a = sigmoid(per-head parameter, init 0)."""
    attn, init, project = model_lib.CausalSelfAttention, model_lib.CausalSelfAttention.__init__, \
        model_lib.CausalSelfAttention.project

    def smeared_init(self, config, layer):
        init(self, config, layer)
        self.smear_logit = nn.Parameter(torch.zeros(config.n_head))

    def smeared_project(self, x, cos, sin):
        q, k, v = project(self, x, cos, sin)
        a = torch.sigmoid(self.smear_logit)[None, :, None, None]
        return q, a * k + (1 - a) * torch.cat([torch.zeros_like(k[:, :, :1]), k[:, :, :-1]], 2), v

    attn.__init__, attn.project = smeared_init, smeared_project


@torch.no_grad()
def answers(model: nn.Module, prompt: list[int], n: int, greedy: bool, end_id: int, g: torch.Generator,
            max_new: int = 16) -> list[list[int]]:
    """n completions of one prompt by full forwards (no cache, no padding)."""
    ids = torch.tensor([prompt] * n)
    done = torch.zeros(n, dtype=torch.bool)
    for _ in range(max_new):
        logits = model(ids)[:, -1]
        nxt = logits.argmax(-1) if greedy else torch.multinomial(logits.softmax(-1), 1, generator=g).squeeze(-1)
        ids = torch.cat([ids, torch.where(done, end_id, nxt)[:, None]], 1)
        done |= nxt == end_id
        if bool(done.all()):
            break
    return [[t for t in row[len(prompt):].tolist() if t != end_id] for row in ids]


def made_up_right(question: str, text: str) -> bool:
    """A made-up question's answer is right when it names a listed name of the asked module."""
    module = question.split("`")[1]
    return extract(text) in [n for n in _NAME.findall(question) if n.startswith(module + ".")]


app = new_app()


@app.command(help=__doc__)
def main(smear: bool = typer.Option(True, "--smear/--no-smear", help="smeared keys (else the library's attention)"),
         init: Optional[Path] = typer.Option(None, help="checkpoint to fine-tune (default: pretrain one with the "
                                             "patch)"),
         steps: int = typer.Option(400),
         every: int = typer.Option(100),
         lr: float = typer.Option(3e-3),
         batch: int = typer.Option(32),
         made_up_share: float = typer.Option(0.5, help="made-up questions' share"),
         samples: int = typer.Option(4, help="sampled answers per held-out question"),
         scratch: Path = typer.Option(Path("/tmp/smeared_keys")),
         threads: int = typer.Option(2)) -> None:
    torch.set_num_threads(threads)
    if smear:
        smear_keys()
    if init is None:
        init = scratch / "pretrain"
        sys.argv = ["stages.pretrain", "--out-dir", str(init), "--metrics", str(scratch / "pretrain.json"),
                    "--scratch-dir", str(scratch / "pretrain_scratch")]
        runpy.run_module("stages.pretrain", run_name="__main__")
    torch.manual_seed(0)
    p = params.load()
    tok = tokenizer_lib.load("outs/tokenizer")
    items = gold_items(load_objects(Path("data/corpus/objects.parquet")), p.corpus.val_frac, p.prompts.eval_frac)
    gold = [tok.render_conversation(c) for c in conversations(items, "train", p.sft.gold_per_item, p.seed)]
    synthetic = [tok.render_conversation(c) for c in made_up(20000, 1)]
    held, pool = [i for i in items if i.split == "eval"], distractor_pool(items)
    real = [(tok.render_prompt([{"role": "user", "content": i.prompt(pool)}]),
             lambda t, i=i: check(i, t) is not None) for i in held]
    fresh = [(tok.render_prompt(c[:1]), lambda t, q=c[0]["content"]: made_up_right(q, t)) for c in made_up(30, 2)]
    model, _ = load_model(init, "cpu", tok.digest)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    rng = random.Random(0)
    print(f"{'smeared keys' if smear else 'plain attention'} from {init}: {len(gold)} gold conversations, "
          f"made-up share {made_up_share}, {len(held)} held-out items, lr {lr}, batch {batch}", flush=True)
    for step in range(1, steps + 1):
        rows = [synthetic[rng.randrange(len(synthetic))] if rng.random() < made_up_share
                else gold[rng.randrange(len(gold))] for _ in range(batch)]
        loss = train_step(model, opt, rows, tok.bos_id, False)
        if step % every:
            continue
        model.eval()
        g = torch.Generator().manual_seed(0)
        line = [f"step {step}: loss {loss:.3f}",
                f"copy gain {copy_probe(model, *merged_tokens(tok), p.seed, 'cpu')['gain']:+.2f}"]
        examples = []
        for name, questions in (("real", real), ("made-up", fresh)):
            for greedy in (False, True):
                texts = [(ok, tok.decode(a)) for prompt, ok in questions
                         for a in answers(model, prompt, 1 if greedy else samples, greedy, tok.assistant_end_id, g)]
                line.append(f"{name} pass@1 {'greedy' if greedy else 'T=1'} "
                            f"{sum(ok(t) for ok, t in texts) / len(texts):.3f}")
                if greedy:
                    examples.append(f"{name} greedy e.g. {[t for _, t in texts[:4]]}")
        print(", ".join(line) + "\n  " + "\n  ".join(examples), flush=True)


if __name__ == "__main__":
    app()
