"""Training loop: resume after SIGKILL, DDP equivalence, NaN guard, data sharding."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import REPO, run_module, sets, train_config
from speedrun.common import use_bf16
from speedrun.train.data import StepSampler, pad_conversations, sft_batch_fn


def pretrain_args(root, out, *extra):
    return ["--tokens-dir", str(root / "tokens"), "--tokenizer-dir", str(root / "tokenizer"), *sets(
            "model.depth=1", "model.head_dim=32", "model.seq_len=32", "pretrain.batch_size=4",
            "pretrain.warmup_steps=2", "pretrain.eval_windows=4", "pretrain.patience=0"),
            "--out-dir", str(out / "model"),
            "--metrics", str(out / "metrics.json"), "--scratch-dir", str(out / "scratch"), *extra]


def test_sampler_shards_partition_the_batch():
    s = StepSampler(10, 4, 0, seed=1, salt="x")
    whole = s.items(7, 0, 1)[0]
    assert sorted(s.items(7, 0, 2)[0] + s.items(7, 1, 2)[0]) == sorted(whole)
    assert s.items(7, 0, 1)[0] == whole and len(set(sum((s.items(k, 0, 1)[0] for k in range(5)), []))) == 10


def test_pad_conversations_targets_only_assistant_tokens():
    x, y = pad_conversations([([1, 2, 3, 4], [0, 0, 1, 1]), ([5, 6], [0, 1])], 16, pad_id=0)
    assert x.tolist() == [[1, 2, 3], [5, 0, 0]]
    assert y.tolist() == [[-1, 3, 4], [6, -1, -1]]


def test_length_recut_sft_batches_keep_the_step_gradient():
    g = torch.Generator().manual_seed(0)
    rendered = [(torch.randint(1, 50, (n,), generator=g).tolist(), [0] * 3 + [1] * (n - 3))
                for n in torch.randint(5, 40, (24,), generator=g).tolist()]
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 50))

    def grad(micro_tokens):
        model.zero_grad()
        micro = sft_batch_fn(rendered, StepSampler(24, 12, 0, seed=0, salt="t"), 32, 0, micro_tokens)(3, 0, 1)
        n = sum(int((y != -1).sum()) for _, y in micro)
        for x, y in micro:  # the loop's normalisation: summed token losses over the step's target count
            (torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-1,
                                               reduction="sum") / n).backward()
        return micro, torch.cat([p.grad.flatten() for p in model.parameters()])

    (whole, g0), (recut, g1) = grad(0), grad(64)
    assert len(whole) == 1 and len(recut) > 1
    assert all(x.numel() <= 64 or len(x) == 1 for x, _ in recut)
    assert sum(x.numel() for x, _ in recut) < whole[0][0].numel()  # less padding
    assert torch.allclose(g0, g1, atol=1e-6)


def kill_after_first_save(args: list[str], resume: Path) -> Path:
    """Start a pretrain run and SIGKILL it as soon as its first resume file appears."""
    proc = subprocess.Popen([sys.executable, "-m", "stages.pretrain", *args], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.time() + 120
    while not resume.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return resume


# numerics are compared per dtype, never under compute.dtype auto (fp32 on one CPU, bf16 on another)
HAS_BF16 = use_bf16("auto", "cpu")
DTYPES = ["fp32", pytest.param("bf16", marks=pytest.mark.skipif(not HAS_BF16, reason="this CPU has no "
                                                                "AVX512-BF16/AMX: bf16 would be emulated, not tested"))]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_resume_after_sigkill_matches_uninterrupted_run(tiny_corpus, tmp_path, dtype):
    steps = sets("pretrain.steps=40", "pretrain.save_every=4", "pretrain.eval_every=8", f"compute.dtype={dtype}")
    run_module("stages.pretrain", *pretrain_args(tiny_corpus, tmp_path / "straight", *steps))

    args = pretrain_args(tiny_corpus, tmp_path / "killed", *steps)
    resume = kill_after_first_save(args, tmp_path / "killed/scratch/resume.pt")
    assert resume.exists() and not (tmp_path / "killed/model/model.pt").exists(), "kill came too late to test resume"

    out = run_module("stages.pretrain", *args)
    assert "resumed from" in out
    a = torch.load(tmp_path / "straight/model/model.pt", weights_only=True)
    b = torch.load(tmp_path / "killed/model/model.pt", weights_only=True)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert not resume.exists()  # a finished run leaves no resume state behind


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_ddp_two_processes_match_one(tiny_corpus, tmp_path, dtype):
    steps = sets("pretrain.steps=3", "pretrain.eval_every=3", "pretrain.save_every=0", f"compute.dtype={dtype}")
    run_module("stages.pretrain", *pretrain_args(tiny_corpus, tmp_path / "one", *steps))
    run_module("stages.pretrain", *pretrain_args(tiny_corpus, tmp_path / "two", *steps, "-S", "compute.nproc=2"))
    a = torch.load(tmp_path / "one/model/model.pt", weights_only=True)
    b = torch.load(tmp_path / "two/model/model.pt", weights_only=True)
    # the same global gradient, summed in another order: fp32 rounding, or bf16's 8-bit mantissa (eps 2^-8 ~ 0.004)
    # on the matmul inputs, which moves 3 steps' weights by about that much
    atol = 1e-5 if dtype == "fp32" else 1e-2
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol), (k, (a[k] - b[k]).abs().max())


def _map_worker(rank: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    from speedrun.train.distributed import Dist, map_jobs
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    got = map_jobs(lambda job: (job, rank, torch.arange(job)), list(range(5)), Dist(rank, 2, "cpu"))
    torch.save([(job, ran, t) for job, ran, t in got], f"{out}.{rank}")
    dist.destroy_process_group()


def test_map_jobs_shares_the_jobs_and_gives_every_rank_every_result(tmp_path):
    """The evaluation's sampling under torchrun: job i runs on rank i % 2 only, every rank gets all, in job order."""
    import torch.multiprocessing as mp

    from speedrun.train.distributed import Dist, map_jobs
    mp.spawn(_map_worker, args=(str(tmp_path / "init"), str(tmp_path / "out")), nprocs=2, join=True)
    for r in range(2):
        got = torch.load(tmp_path / f"out.{r}", weights_only=True)
        assert [(job, ran) for job, ran, _ in got] == [(0, 0), (1, 1), (2, 0), (3, 1), (4, 0)]
        assert all(torch.equal(t, torch.arange(job)) for job, _, t in got)
    assert map_jobs(lambda job: job * 2, [3, 1, 2], Dist(0, 1, "cpu")) == [6, 2, 4]


def test_resume_file_holds_no_copy_of_the_best_weights(tmp_path):
    """The best-by-eval weights stay out of the resume file: nothing more when they are the model's, else one
    best_<step>.pt written once per new best; loading restores them either way, and clearing leaves nothing."""
    from speedrun.train.checkpoint import clear_resume, load_resume, save_resume
    path = tmp_path / "scratch/resume.pt"
    w = {str(s): {"w": torch.full((3,), float(s))} for s in range(4, 17, 4)}
    state = lambda step: {"fingerprint": "f", "model": w[str(step)], "step": step}  # noqa: E731
    assert save_resume(path, state(8), w["8"], 8, None) is None  # saved at the eval that chose it
    assert sorted(f.name for f in path.parent.iterdir()) == ["resume.pt"] and "best_state" not in torch.load(path)
    assert torch.equal(load_resume(path, "f")["best_state"]["w"], w["8"]["w"])
    assert save_resume(path, state(12), w["8"], 8, None) == 8
    best = path.with_name("best_8.pt")
    stamp = best.stat().st_mtime_ns
    assert save_resume(path, state(16), w["8"], 8, 8) == 8 and best.stat().st_mtime_ns == stamp  # written once
    got = load_resume(path, "f")
    assert got["step"] == 16 and torch.equal(got["best_state"]["w"], w["8"]["w"])
    assert torch.equal(got["model"]["w"], w["16"]["w"]) and load_resume(path, "other settings") is None
    assert save_resume(path, state(16), w["16"], 16, 8) is None and not best.exists()  # a new best: the old one goes
    save_resume(path, state(16), w["12"], 12, None)
    path.with_name("best_12.pt").unlink()
    with pytest.raises(FileNotFoundError, match="best_12.pt, which is missing"):
        load_resume(path, "f")
    clear_resume(path)
    assert list(path.parent.iterdir()) == []


@pytest.mark.slow
def test_a_changed_setting_never_resumes_the_old_run(tiny_corpus, tmp_path):
    """Kill a run, change a setting (one the old fingerprint left out: the data's max length would do), rerun:
    it trains from the start under the new value, not from the old run's state."""
    args = pretrain_args(tiny_corpus, tmp_path / "killed", *sets("pretrain.steps=40", "pretrain.save_every=4",
                                                                 "pretrain.eval_every=8", "compute.dtype=fp32"))
    resume = kill_after_first_save(args, tmp_path / "killed/scratch/resume.pt")
    assert resume.exists(), "kill came too late to test resume"
    out = run_module("stages.pretrain", *args, "-S", "pretrain.eval_windows=3")
    assert "resumed from" not in out
    # a corrupt resume file names itself and what to do
    resume.parent.mkdir(parents=True, exist_ok=True)
    resume.write_bytes(b"not a checkpoint")
    res = subprocess.run([sys.executable, "-m", "stages.pretrain", *args], cwd=REPO, capture_output=True, text=True)
    assert res.returncode != 0 and str(resume) in res.stderr and "Delete it" in res.stderr
    assert "Traceback" not in res.stderr, res.stderr  # a user's failure: one line


def test_nan_loss_stops_training(tmp_path):
    from speedrun.model import GPT, GPTConfig
    from speedrun.train.distributed import Dist
    from speedrun.train.loop import train

    model = GPT(GPTConfig(vocab_size=16, depth=1, head_dim=32, seq_len=8))
    batch = lambda step, rank, world: [(torch.zeros(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long))]  # noqa: E731
    calls = []

    def nan_after_two(m, x, y):
        calls.append(1)
        return m(x, y, reduction="sum") * (float("nan") if len(calls) > 2 else 1.0)

    with pytest.raises(FloatingPointError, match="loss is nan at step 2"):
        train(model, train_config(steps=5, eval_every=100), batch, lambda m: {"val_loss": 1.0}, Dist(0, 1, "cpu"),
              scratch=tmp_path, loss_fn=nan_after_two)


def test_a_batch_without_targets_stops_training_naming_the_cut(tmp_path):
    """A step whose rows all end before their first target (a chat template longer than the length cut) has no loss
    to divide: one line saying so, not a ZeroDivisionError."""
    from speedrun.common import UserError
    from speedrun.model import GPT, GPTConfig
    from speedrun.train.distributed import Dist
    from speedrun.train.loop import train

    model = GPT(GPTConfig(vocab_size=16, depth=1, head_dim=32, seq_len=8))
    batch = lambda step, rank, world: [(torch.zeros(2, 8, dtype=torch.long), torch.full((2, 8), -1))]  # noqa: E731
    with pytest.raises(UserError, match="sft step 0: no target token in the batch .* raise the stage's max_len"):
        train(model, train_config(steps=5, eval_every=100), batch, lambda m: {"val_loss": 1.0}, Dist(0, 1, "cpu"),
              scratch=tmp_path, name="sft")


def test_use_bf16_explicit_and_auto(monkeypatch):
    from speedrun.common import use_bf16
    assert use_bf16("fp32", "cpu") is False and use_bf16("bf16", "cpu") is True
    with pytest.raises(ValueError, match="fp16"):
        use_bf16("fp16", "cpu")
    # auto on a CPU: bf16 only with native bf16 units, never emulated (far slower than fp32)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert use_bf16("auto", "cpu") is False
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert use_bf16("auto", "cpu") is True


MMAPPED = """
import ctypes, sys, torch
from speedrun.common import keep_freed_memory
class MallInfo2(ctypes.Structure):  # glibc >= 2.33
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                                "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
before = libc.mallinfo2().hblkhd  # bytes in blocks glibc mapped on their own (returned to the OS on free)
x = torch.zeros(2048, 4096)  # 32 MB: the logits of a sampling batch
print(applied, libc.mallinfo2().hblkhd - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(__import__("ctypes").CDLL(None), "mallinfo2"),
                    reason="glibc's mallopt and mallinfo2")
def test_stages_serve_large_tensors_from_the_heap_they_keep():
    """The mechanism (the page faults it saves are measured by bench/page_faults.py): after keep_freed_memory, which
    run_stage calls, a 32 MB tensor comes from the heap glibc keeps, not from a mapping of its own that glibc would
    unmap on free and fault in afresh next time."""
    out = {mode: subprocess.run([sys.executable, "-c", MMAPPED, mode], capture_output=True, text=True, check=True,
                                cwd=REPO).stdout.split() for mode in ("default", "keep")}
    assert out["keep"][0] == "True" and out["default"][0] == "False"
    assert int(out["default"][1]) >= 32 * 2**20 and int(out["keep"][1]) == 0, out


def test_muon_takes_the_block_matrices_and_resumes_exactly(tmp_path):
    from speedrun.common import torch_load
    from speedrun.model import GPT, GPTConfig
    from speedrun.train.loop import make_optimizer

    def fresh():
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=64, depth=2, head_dim=32, seq_len=16))
        return model, make_optimizer(model, train_config(steps=3, lr=1e-2, optimizer="muon"))

    def step(model, opt, i):
        x = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(i))
        model(x, x).backward()
        opt.step()
        opt.zero_grad()

    model, opt = fresh()
    muon_ids = {id(p) for g in opt.optimizers[0].param_groups for p in g["params"]}
    assert {n for n, p in model.named_parameters() if id(p) in muon_ids} == {
        n for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2}
    assert isinstance(opt.optimizers[0], torch.optim.Muon) and isinstance(opt.optimizers[1], torch.optim.AdamW)
    for i in range(3):
        step(model, opt, i)
    straight = {k: v.clone() for k, v in model.state_dict().items()}

    model, opt = fresh()
    for i in range(2):
        step(model, opt, i)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / "resume.pt")
    model, opt = fresh()
    state = torch_load(tmp_path / "resume.pt")  # weights_only: the combined state holds no pickled code
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    step(model, opt, 2)
    assert all(torch.equal(straight[k], v) for k, v in model.state_dict().items())
    name = "blocks.0.attn.c_proj.weight"
    assert not torch.equal(straight[name], fresh()[0].state_dict()[name])


@pytest.mark.slow
def test_compiled_training_is_byte_identical_across_runs_and_close_to_eager(tiny_corpus, tmp_path):
    """compute.compile: two compiled runs, the first compiling from an empty inductor cache and the second from
    its cache, write the same bytes; the weights agree with the eager run's up to float rounding (fp32)."""
    steps = sets("pretrain.steps=4", "pretrain.eval_every=4", "pretrain.save_every=0", "compute.dtype=fp32")
    run_module("stages.pretrain", *pretrain_args(tiny_corpus, tmp_path / "eager", *steps))
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    for run in ("cold", "warm"):
        run_module("stages.pretrain", *pretrain_args(tiny_corpus, tmp_path / run, *steps, "-S", "compute.compile=true"),
                   env=env)
    cold, warm = ((tmp_path / run / "model/model.pt").read_bytes() for run in ("cold", "warm"))
    assert cold == warm
    a = torch.load(tmp_path / "eager/model/model.pt", weights_only=True)
    b = torch.load(tmp_path / "cold/model/model.pt", weights_only=True)
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5), (k, (a[k] - b[k]).abs().max())


def test_token_files_hold_the_bos_separated_stream(tiny_corpus, tmp_path):
    import pandas as pd

    from speedrun import tokenizer as tokenizer_lib
    from speedrun.common import write_json
    from speedrun.train.data import read_tokens, windows, write_tokens
    tok = tokenizer_lib.load(tiny_corpus / "tokenizer")
    texts = pd.read_parquet(tiny_corpus / "corpus/train.parquet")["text"].tolist()[:50]
    want = [t for doc in texts for t in [tok.bos_id, *tok.encode(doc)]]
    write_json(tmp_path / "meta.json", {"tokenizer": tok.digest})
    assert write_tokens(tmp_path / "a.bin", texts, tok) == len(want)
    got = read_tokens(tmp_path / "a.bin", tok.digest)
    assert got.dtype == torch.int32 and got.tolist() == want
    write_tokens(tmp_path / "empty.bin", [], tok)
    assert read_tokens(tmp_path / "empty.bin", tok.digest).numel() == 0
    # windows are a view of the stream: row i is tokens [i * T, (i + 1) * T], one token shared with the next row
    win = windows(got, 16)
    assert win.shape == ((len(want) - 1) // 16, 17) and win[3].tolist() == want[48:65]
    # a file packed by another tokenizer, or cut mid-token, is refused with its path
    with pytest.raises(ValueError, match="a.bin: packed by tokenizer .* not by the one loaded"):
        read_tokens(tmp_path / "a.bin", "another")
    (tmp_path / "cut.bin").write_bytes((tmp_path / "a.bin").read_bytes()[:-2])
    with pytest.raises(ValueError, match="cut.bin: .* not a whole number of int32 tokens"):
        read_tokens(tmp_path / "cut.bin", tok.digest)


def test_post_training_lengths_follow_the_model_context_unless_set(tmp_path):
    from speedrun.model import GPT, GPTConfig
    from speedrun.train.checkpoint import context_length, save_model
    model = GPT(GPTConfig(vocab_size=64, depth=1, n_embd=32, head_dim=16, seq_len=1024))
    save_model(tmp_path, model.state_dict(), model.config, {})
    assert context_length(0, tmp_path, key="sft.max_len") == 1024
    assert context_length(0, tmp_path, 48, "grpo.train.max_prompt_len") == 976  # room for the completion
    assert context_length(128, tmp_path, 48) == 128  # a value set is kept
    with pytest.raises(ValueError, match="eval.max_prompt_len 0: the model's context .1024 tokens.* leaves 0: set"):
        context_length(0, tmp_path, 1024, "eval.max_prompt_len")
