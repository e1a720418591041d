"""Talk to any checkpoint: `speedrun-chat --model outs/sft` (a REPL), or one-shot with --prompt, several --model
side by side. A tool for looking at models, not a pipeline stage, so it is a console script of the package rather
than a file in stages/ (which holds exactly the DVC stages).

Chat-tuned checkpoints (SFT, GRPO) answer through the chat template with their conversation history; a pretrained
or adversarial policy, trained on raw text only, continues the text it is given (--template overrides the guess).
Tokens are printed as they are sampled. Same seed, same prompt -> the same answer."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Callable, Literal, TextIO, get_args

import torch
import typer

from speedrun.typer_app import new_app, run_app
from speedrun import tokenizer as tokenizer_lib
from speedrun.common import UserError, pick_device, stable_seed
from speedrun.engine import generate
from speedrun.model import GPT
from speedrun.tokenizer import Tokenizer
from speedrun.train.checkpoint import load_model

Template = Literal["auto", "chat", "raw"]
TEMPLATES: tuple[str, ...] = get_args(Template)
app = new_app()


def guess_template(meta: dict) -> str:
    """raw for a pretrained model (no init) or an adversarial policy (a cycle: trained on raw text), else chat."""
    return "raw" if "init" not in meta or "cycle" in meta else "chat"


@dataclass
class Bot:
    """One checkpoint and its side of the conversation."""
    name: str
    model: GPT
    template: str
    history: list[dict] = field(default_factory=list)


def load_bot(ckpt_dir: Path, tok: Tokenizer, device: str, template: str = "auto") -> Bot:
    ckpt_dir = Path(ckpt_dir)
    if not (ckpt_dir / "meta.json").is_file() or not (ckpt_dir / "model.pt").is_file():
        raise FileNotFoundError(f"{ckpt_dir}: not a checkpoint directory (needs model.pt and meta.json)")
    if template not in TEMPLATES:
        raise ValueError(f"template must be one of {TEMPLATES}, not {template!r}")
    model, meta = load_model(ckpt_dir, device, tok.digest)  # refuses a checkpoint of another tokenizer
    return Bot(str(ckpt_dir), model, guess_template(meta) if template == "auto" else template)


def reply(bot: Bot, tok: Tokenizer, text: str, max_tokens: int, temperature: float, top_p: float, seed: int,
          write: Callable[[str], None] = lambda s: None) -> str:
    """The bot's answer to `text` (a user turn, or text to continue), streamed through `write` piece by piece;
    a chat bot keeps the turn and its answer in its history."""
    if bot.template == "chat":
        messages = bot.history + [{"role": "user", "content": text}]
        ids, stop = tok.render_prompt(messages), tok.assistant_end_id
    else:
        messages, ids, stop = [], [tok.bos_id] + tok.encode(text), None
    room = bot.model.config.seq_len - len(ids)
    if room < 1:
        raise UserError(f"{bot.name}: the prompt{' with its history' if bot.history else ''} is {len(ids)} tokens, "
                         f"the model's context is {bot.model.config.seq_len}" +
                         (": /reset the history" if bot.history else ""))
    out: list[int] = []
    shown = ""

    def on_token(rows: torch.Tensor, tokens: torch.Tensor) -> None:
        nonlocal shown
        out.extend(t for t in tokens.tolist() if t != stop)
        text_now = tok.decode(out)
        if not text_now.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            write(text_now[len(shown):])
            shown = text_now

    turn = len(bot.history) // 2
    g = torch.Generator(device=next(bot.model.parameters()).device).manual_seed(stable_seed(seed, "chat", turn))
    generate(bot.model, [ids], 1, min(max_tokens, room), temperature=temperature, top_p=top_p, stop_id=stop,
             pad_id=tok.bos_id, generator=g, on_token=on_token)
    answer = tok.decode(out)
    write(answer[len(shown):])
    if bot.template == "chat":
        bot.history = messages + [{"role": "assistant", "content": answer}]
    return answer


def ask_all(bots: list[Bot], tok: Tokenizer, text: str, out: TextIO, **kw) -> list[str]:
    """Every bot answers the same turn, one after the other, each under its name when there are several."""
    answers = []
    for bot in bots:
        if len(bots) > 1:
            out.write(f"[{bot.name}] ")
        answers.append(reply(bot, tok, text, write=lambda s: (out.write(s), out.flush()), **kw))
        out.write("\n")
    return answers


@app.command(help=__doc__.splitlines()[0])
def main(model: Annotated[list[Path], typer.Option(
             metavar="DIR", help="checkpoint directory (model.pt + meta.json); repeat it to answer side by side")],
         tokenizer_dir: Annotated[Path, typer.Option(
             metavar="DIR", help="the tokenizer the checkpoints were trained with")] = Path("outs/tokenizer"),
         prompt: Annotated[str | None, typer.Option(help="answer this once and exit (no REPL)")] = None,
         template: Annotated[Template, typer.Option(help="auto: chat for SFT/GRPO checkpoints, raw continuation "
                                                         "for pretrained and adversarial ones")] = "auto",
         max_tokens: Annotated[int, typer.Option(help="new tokens per answer at most (within the context)")] = 128,
         temperature: Annotated[float, typer.Option(help="sampling temperature (0 = greedy)")] = 0.8,
         top_p: Annotated[float, typer.Option(help="nucleus sampling mass (1 = off)")] = 0.95,
         seed: Annotated[int, typer.Option(
             help="sampling seed: the same seed and turns give the same answers")] = 0,
         device: Annotated[str, typer.Option(help="cpu | cuda | auto")] = "cpu") -> None:
    """Load the checkpoints, then answer `prompt` once or, without one, chat on stdin (a REPL)."""
    tok = tokenizer_lib.load(tokenizer_dir)
    try:
        bots = [load_bot(m, tok, pick_device(device), template) for m in model]
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    kw = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed)
    try:
        if prompt is not None:
            ask_all(bots, tok, prompt, sys.stdout, **kw)
            return
        interactive = sys.stdin.isatty()
        if interactive:
            print(f"chatting with {', '.join(f'{b.name} ({b.template})' for b in bots)}; /reset clears the history, "
                  "/quit or Ctrl-D ends")
        while True:
            if interactive:
                print("> ", end="", flush=True)
            line = sys.stdin.readline()
            if not line or line.strip() == "/quit":
                break
            if line.strip() == "/reset":
                for b in bots:
                    b.history = []
                continue
            if line.strip():
                try:
                    ask_all(bots, tok, line.rstrip("\n"), sys.stdout, **kw)
                except ValueError as e:  # e.g. the history outgrew the context: say so, keep the session
                    print(f"error: {e}", file=sys.stderr)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def cli(argv: list[str] | None = None) -> None:
    """speedrun-chat's command line (argv: default sys.argv[1:]): returns on success, exits non-zero otherwise."""
    run_app(app, argv, "speedrun-chat")


if __name__ == "__main__":
    cli()
