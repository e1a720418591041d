"""Sampling on SmolLM2-135M-Instruct with its bottom blocks frozen, under bf16 autocast, as a GRPO step samples: the
frozen blocks' Linear weights cast by autocast at every call (fp32 held; autocast caches casts of trainable weights
only) against held in bf16 for the whole loop (speedrun.trunk.frozen_linears_in, what the trainer does). Rounds
alternate the two in one process, so machine noise hits them alike; the first call of each is a warm-up, left out.
Checks that both draw the same tokens.

    python bench/frozen_cast.py --rounds 3 --frozen 26 --prompts 8 --samples 8 --new-tokens 48
Needs the SmolLM2 wheel (fetched into $SPEEDRUN_CACHE once). Ends with one line: the ratio of tokens/s."""
from __future__ import annotations

import statistics
import time

import torch
import typer

from speedrun.engine import generate
from speedrun.pretrained import load_base
from speedrun.trunk import freeze_trunk, frozen_linears_in
from speedrun.typer_app import new_app

app = new_app()


@app.command(help=__doc__)
def main(rounds: int = typer.Option(3, help="rounds of both settings"),
         frozen: int = typer.Option(26, help="bottom blocks frozen (SmolLM2 has 30)"),
         prompts: int = typer.Option(8, help="prompts per call"),
         samples: int = typer.Option(8, help="samples per prompt"),
         new_tokens: int = typer.Option(48, help="new tokens per sample (no stop token: every row runs them all)"),
         threads: int = typer.Option(2, help="torch CPU threads")) -> None:
    torch.set_num_threads(threads)
    ck, source = load_base("smollm2-135m", "base")
    model = ck.model().float().eval()
    freeze_trunk(model, frozen)
    tok = ck.tokenizer
    texts = [f"Question {i}: what does the function number {i} in the standard library do, in a sentence?"
             for i in range(prompts)]
    ids = [tok.encode(t) for t in texts]
    uniforms = torch.rand(prompts * samples, new_tokens, generator=torch.Generator().manual_seed(0))
    tokens = prompts * samples * new_tokens

    def call(held: bool) -> tuple[float, torch.Tensor]:
        t0 = time.perf_counter()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            with frozen_linears_in(model, torch.bfloat16 if held else None):
                s = generate(model, ids, samples, new_tokens, stop_id=None, pad_id=0, uniforms=uniforms)
        return time.perf_counter() - t0, s.tokens

    names = {False: "autocast casts the frozen weights per call", True: "frozen weights held in bf16"}
    seen: dict[bool, list[float]] = {False: [], True: []}
    drawn = {}
    for held in (False, True):
        drawn[held] = call(held)[1]  # warm-up
    same = torch.equal(drawn[False], drawn[True])
    for r in range(rounds):
        for held in ((False, True) if r % 2 == 0 else (True, False)):
            secs, _ = call(held)
            seen[held].append(tokens / secs)
            print(f"round {r + 1} {names[held]}: {tokens / secs:,.0f} tokens/s ({secs:.2f} s)", flush=True)
    print(f"{source}, {frozen} of {len(model.blocks)} blocks frozen, {prompts} x {samples} x {new_tokens} tokens, "
          f"{threads} threads; same tokens drawn: {same}")
    med = {h: statistics.median(v) for h, v in seen.items()}
    print(f"held / per-call cast: {med[True] / med[False]:.2f}x tokens/s (medians {med[True]:,.0f} and "
          f"{med[False]:,.0f}; ranges {min(seen[True]):,.0f}-{max(seen[True]):,.0f} and "
          f"{min(seen[False]):,.0f}-{max(seen[False]):,.0f})")


if __name__ == "__main__":
    app()
