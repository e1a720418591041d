"""Stage adv_eval: every cycle's discriminator and policy on held-out text -> adversarial.json + a report section.

The cycles come from DVC's unpacking of `${adversarial.cycles}` into `--1.prev 0 --1.init outs/pretrain ...`
(extra arguments after the flags), so the stage reads exactly the cycles of params.yaml, not stale dirs.
"""
from pathlib import Path

import pandas as pd
import torch
import typer

from speedrun import tokenizer as tokenizer_lib
from speedrun.adversarial import data as adv
from speedrun.adversarial import evaluate as ev
from speedrun.adversarial.reward import complete, disc_inputs, score
from speedrun.common import pick_device, read_json, stable_seed, write_json
from speedrun.eval.diversity import distinct_n
from speedrun.reward.discriminator import load_discriminator
from speedrun.train import data
from speedrun.train.checkpoint import load_model
from speedrun.cli import stage_flags

app = typer.Typer(add_completion=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@stage_flags()
def main(ctx: typer.Context, adv_dir: Path, corpus_dir: Path, tokenizer_dir: Path, seq_len: int, prompts: int,
         temperature: float, bpb_seq_len: int, bpb_windows: int, bpb_bound: float, beta: float, samples_shown: int,
         seed: int, device: str, metrics: Path, out_md: Path, fig_dir: Path) -> None:
    """Extra arguments: the cycles, --<cycle>.prev <int> --<cycle>.init <policy dir> per cycle."""
    cycles = ev.parse_cycles(ctx.args)
    if not cycles:
        raise typer.BadParameter("no cycles given: pass --<cycle>.prev <int> --<cycle>.init <dir> per cycle")
    device = pick_device(device)
    tok = tokenizer_lib.load(tokenizer_dir)
    val_texts = pd.read_parquet(corpus_dir / "val.parquet")["text"].tolist()
    win = adv.corpus_windows(val_texts, tok, seq_len)
    pool, idx = adv.prompt_pool(win, prompts, seed, "adv_eval")
    starts = torch.tensor([len(p) - 1 for p in pool])
    seqs = {ev.NATURAL: (win[idx, 1:], starts)}  # the true continuations
    bpb_win = data.windows(data.pack_documents(val_texts, tok), bpb_seq_len)[:bpb_windows]
    tbytes = data.token_bytes(tok)

    policies, samples = {}, {}
    for pid, pdir in ev.policy_dirs(cycles, adv_dir).items():
        model, _ = load_model(pdir, device, tok.digest)
        comp = complete(model, pool, seq_len, stable_seed(seed, "adv_eval", "sample"), temperature, pad_id=tok.bos_id)
        s, st = disc_inputs(pool, comp, seq_len)  # the same prefixes and random numbers for every policy
        seqs[pid] = (s, st)
        texts = [tok.decode(s[r, st[r]:].tolist()) for r in range(len(s))]
        policies[pid] = {"dir": str(pdir), "val_bpb": round(data.bits_per_byte(model, bpb_win, tbytes, 16, device), 5),
                         "distinct_1": round(distinct_n(texts, 1), 5), "distinct_2": round(distinct_n(texts, 2), 5)}
        samples[f"policy {pid}"] = [tok.decode(s[r, :st[r]].tolist()) + " ⟶ " + texts[r]
                                    for r in range(samples_shown)]
        print(f"adv_eval: policy {pid} ({pdir}): val bpb {policies[pid]['val_bpb']:.4f}, "
              f"distinct-2 {policies[pid]['distinct_2']:.3f}")
    samples[ev.NATURAL] = [tok.decode(seqs[ev.NATURAL][0][r, :starts[r]].tolist()) + " ⟶ "
                           + tok.decode(seqs[ev.NATURAL][0][r, starts[r]:].tolist()) for r in range(samples_shown)]

    crossplay, disc_metrics, grpo_metrics, logs = {}, {}, {}, {}
    for key in cycles:
        disc, _ = load_discriminator(adv_dir / f"cycle_{key}" / "disc", device, tok.digest)
        crossplay[key] = {pid: round(float(score(disc, s, st, "prob").mean()), 5)
                          for pid, (s, st) in [*((p, seqs[p]) for p in policies), (ev.NATURAL, seqs[ev.NATURAL])]}
        disc_metrics[key] = read_json(adv_dir / f"cycle_{key}" / "disc" / "metrics.json")
        grpo_metrics[key] = read_json(adv_dir / f"cycle_{key}" / "policy" / "metrics.json")
        logs[key] = pd.read_csv(adv_dir / f"cycle_{key}" / "policy" / "log.csv")
    result = {"setup": {"seq_len": seq_len, "prompts": prompts, "temperature": temperature, "beta": beta,
                        "bpb_seq_len": bpb_seq_len, "bpb_windows": len(bpb_win), "seed": seed},
              "bpb_bound": bpb_bound, "policies": policies, "crossplay": crossplay,
              "cycles": ev.cycle_rows(cycles, disc_metrics, grpo_metrics, crossplay, policies, bpb_bound)}
    write_json(metrics, result)
    ev.write_section(result, samples, logs, out_md, fig_dir)
    for key, c in result["cycles"].items():
        print(f"adv_eval: cycle {key}: disc AUC {c['disc']['auc_pure']}, held-out reward {c['reward_before']:.3f} -> "
              f"{c['reward_after']:.3f}, val bpb {c['val_bpb_before']:.4f} -> {c['val_bpb_after']:.4f}")


if __name__ == "__main__":
    app()
