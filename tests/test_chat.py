"""speedrun-chat: one-shot answers are deterministic per seed, several models answer side by side, the REPL keeps
a history through a pipe, and bad input (no checkpoint, another tokenizer, a prompt over the context) says why."""
import io
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from speedrun import chat
from speedrun import tokenizer as tokenizer_lib
from speedrun.model import GPT, GPTConfig
from speedrun.train.checkpoint import save_model


@pytest.fixture(scope="module")
def ckpts(tiny_corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    tok = tokenizer_lib.load(tiny_corpus / "tokenizer")
    config = GPTConfig(vocab_size=tok.vocab_size, depth=1, n_embd=32, head_dim=16, seq_len=48)
    for i, (name, meta) in enumerate([("sft", {"init": "pre"}), ("grpo", {"init": "sft"}), ("pre", {}),
                                      ("other_tok", {"init": "pre"})]):
        torch.manual_seed(i)
        model = GPT(config)
        torch.nn.init.normal_(model.lm_head.weight, std=1.0)  # a spread of next tokens, some of them the stop token
        digest = "0" * 16 if name == "other_tok" else tok.digest
        save_model(root / name, model.state_dict(), config, {"tokenizer": digest, **meta})
    return root, tok


def run_chat(tiny_corpus, *args, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "speedrun.chat", "--tokenizer-dir", str(tiny_corpus / "tokenizer"),
                           *args], cwd=REPO, input=stdin, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, _TYPER_STANDARD_TRACEBACK="1", COLUMNS="200"))


@pytest.mark.slow
def test_one_shot_is_deterministic_per_seed_and_models_answer_side_by_side(tiny_corpus, ckpts):
    root, tok = ckpts
    args = ["--model", str(root / "sft"), "--prompt", "What is the json module for?", "--max-tokens", "12"]
    a, b = run_chat(tiny_corpus, *args, "--seed", "3"), run_chat(tiny_corpus, *args, "--seed", "3")
    assert a.returncode == 0 and a.stdout == b.stdout and a.stdout.strip()
    assert run_chat(tiny_corpus, *args, "--seed", "4").stdout != a.stdout
    both = run_chat(tiny_corpus, *args, "--seed", "3", "--model", str(root / "grpo"))
    grpo = chat.reply(chat.load_bot(root / "grpo", tok, "cpu"), tok, "What is the json module for?", 12, 0.8, 0.95, 3)
    assert both.returncode == 0 and both.stdout == f"[{root / 'sft'}] {a.stdout}[{root / 'grpo'}] {grpo}\n"


def test_repl_through_a_pipe_keeps_the_history_until_reset(tiny_corpus, ckpts):
    root, tok = ckpts
    res = run_chat(tiny_corpus, "--model", str(root / "sft"), "--max-tokens", "6", "--seed", "1",
                   "--temperature", "1", "--top-p", "1", stdin="hello\nand then?\n/reset\nhello\n")
    assert res.returncode == 0, res.stderr
    bot = chat.load_bot(root / "sft", tok, "cpu")
    first = chat.reply(bot, tok, "hello", 6, 1.0, 1.0, seed=1)
    second = chat.reply(bot, tok, "and then?", 6, 1.0, 1.0, seed=1)
    # after /reset the same first turn gets the same answer again
    assert res.stdout == f"{first}\n{second}\n{first}\n"
    # a chat bot keeps both sides of every turn; the second prompt renders the first exchange
    assert bot.template == "chat" and [m["role"] for m in bot.history] == ["user", "assistant", "user", "assistant"]
    assert bot.history[1]["content"] == first


def test_streamed_pieces_add_up_to_the_answer_and_raw_models_continue_text(tiny_corpus, ckpts):
    root, tok = ckpts
    pieces = io.StringIO()
    bot = chat.load_bot(root / "pre", tok, "cpu")
    answer = chat.reply(bot, tok, "The json module", 10, 1.0, 1.0, seed=0, write=pieces.write)
    assert bot.template == "raw" and bot.history == [] and pieces.getvalue() == answer
    assert chat.load_bot(root / "pre", tok, "cpu", template="chat").template == "chat"


@pytest.mark.slow
def test_errors_name_the_problem(tiny_corpus, ckpts, tmp_path):
    root, _ = ckpts
    missing = run_chat(tiny_corpus, "--model", str(tmp_path / "nope"), "--prompt", "hi")
    assert missing.returncode != 0 and "not a checkpoint directory" in missing.stderr
    assert "Traceback" not in missing.stderr, missing.stderr  # a user's failure: one line
    other = run_chat(tiny_corpus, "--model", str(root / "other_tok"), "--prompt", "hi")
    assert other.returncode != 0 and "trained with tokenizer 0000000000000000" in other.stderr
    assert "Traceback" not in other.stderr, other.stderr  # a user's failure: one line
    import shutil
    shutil.copytree(root / "sft", tmp_path / "corrupt")
    (tmp_path / "corrupt" / "meta.json").write_text('{"config": ')
    corrupt = run_chat(tiny_corpus, "--model", str(tmp_path / "corrupt"), "--prompt", "hi")
    assert corrupt.returncode != 0 and f"{tmp_path / 'corrupt' / 'meta.json'}: not valid JSON" in corrupt.stderr
    assert "Traceback" not in corrupt.stderr, corrupt.stderr  # a user's failure: one line
    long = run_chat(tiny_corpus, "--model", str(root / "sft"), "--prompt", "word " * 200)
    assert long.returncode != 0 and "the model's context is 48" in long.stderr
    assert "Traceback" not in long.stderr, long.stderr  # a user's failure: one line
    # in the REPL a turn over the context is reported and the session goes on
    repl = run_chat(tiny_corpus, "--model", str(root / "sft"), "--max-tokens", "4", stdin="word " * 200 + "\nhi\n")
    assert repl.returncode == 0 and "error:" in repl.stderr and repl.stdout.strip()
