"""Stage adv_eval: every cycle's discriminator and policy on held-out text -> adversarial.json + a report section.
It reads exactly the cycles of params.yaml (adversarial.cycles), not whatever cycle dirs outs/adv holds."""
import pandas as pd
import torch

from speedrun import tokenizer as tokenizer_lib
from speedrun.adversarial import data as adv
from speedrun.adversarial import evaluate as ev
from speedrun.adversarial.reward import complete, disc_inputs, score
from speedrun.common import pick_device, read_json, stable_seed, write_json
from speedrun.eval.diversity import distinct_n
from speedrun.reward.discriminator import load_discriminator
from speedrun.train import data
from speedrun.train.checkpoint import load_model
from speedrun.params import plain
from speedrun.stage import run_stage

READS = ("seed", "beta", "model.seq_len", "compute.device", "adversarial.cycles", "adversarial.seq_len",
         "adversarial.temperature", "adversarial.eval")
PATHS = {"adv_dir": "outs/adv", "tokens_dir": "data/tokens", "tokenizer_dir": "outs/tokenizer",
         "metrics": "reports/metrics/adversarial.json", "out_md": "reports/adversarial.md",
         "fig_dir": "reports/figures"}


def main(p, io) -> None:
    a, c = p.adversarial, p.adversarial.eval
    cycles = ev.ordered_cycles(plain(a.cycles))
    seq_len, temperature, seed = a.seq_len, a.temperature, p.seed
    adv_dir, samples_shown = io.adv_dir, c.samples_shown
    device = pick_device(p.compute.device)
    tok = tokenizer_lib.load(io.tokenizer_dir)
    stream = data.read_tokens(io.tokens_dir / "val.bin", tok.digest)
    win = data.windows(stream, seq_len)
    pool, idx = adv.prompt_pool(win, c.prompts, seed, "adv_eval")
    starts = torch.tensor([len(prefix) - 1 for prefix in pool])
    seqs = {ev.NATURAL: (win[idx, 1:].long(), starts)}  # the true continuations
    bpb_win = data.windows(stream, p.model.seq_len)[:c.bpb_windows]
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
                          for pid, (s, st) in [*((q, seqs[q]) for q in policies), (ev.NATURAL, seqs[ev.NATURAL])]}
        disc_metrics[key] = read_json(adv_dir / f"cycle_{key}" / "disc" / "metrics.json")
        grpo_metrics[key] = read_json(adv_dir / f"cycle_{key}" / "policy" / "metrics.json")
        logs[key] = pd.read_csv(adv_dir / f"cycle_{key}" / "policy" / "log.csv")
    result = {"setup": {"seq_len": seq_len, "prompts": c.prompts, "temperature": temperature, "beta": p.beta,
                        "bpb_seq_len": p.model.seq_len, "bpb_windows": len(bpb_win), "seed": seed},
              "bpb_bound": c.bpb_bound, "policies": policies, "crossplay": crossplay,
              "cycles": ev.cycle_rows(cycles, disc_metrics, grpo_metrics, crossplay, policies, c.bpb_bound)}
    write_json(io.metrics, result)
    ev.write_section(result, samples, logs, io.out_md, io.fig_dir)
    for key, row in result["cycles"].items():
        print(f"adv_eval: cycle {key}: disc AUC {row['disc']['auc_pure']}, held-out reward {row['reward_before']:.3f} "
              f"-> {row['reward_after']:.3f}, val bpb {row['val_bpb_before']:.4f} -> {row['val_bpb_after']:.4f}")


if __name__ == "__main__":
    run_stage(main, __doc__, READS, PATHS)
