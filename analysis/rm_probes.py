"""The readings of the SmolLM2 chat track's RM gates, reports/experiments/chat-smollm2-rm-probes (RMs v0, v1, v2)
and chat-smollm2-rm-end (--rms e1,e2) (each README is its plan, this code its rules, committed before each run): per
RM the on-policy pairs it trained on and its held-out accuracy by kind against the bars (hard above 0.5 and the base's
likelihood; echo, nonanswer and template at least 0.9); then, where a screen ran, its dose (baseline's KL and RM reward
gain beyond shuffled's, every seed) and check 5 with the figures it reads (pilot 3's, analysis/chat_pilot.py), words
per answer and the share of each run's completions cut at the budget. No diversity interval is read.

    python analysis/rm_probes.py reports/experiments/chat-smollm2-rm-probes
    python analysis/rm_probes.py reports/experiments/chat-smollm2-rm-probes --passes v2   # exit 0 iff v2 passes
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from chat_pilot import DOSE_GAIN, DOSE_KL, dose, templates  # analysis/ is the script's folder, so on sys.path
from speedrun import kept
from speedrun.typer_app import new_app, run_app

RMS = ("v0", "v1", "v2")
PROBE_ACC = 0.9  # pilot 3's echo bar, for every kind the RM must reject
PROBES = ("echo", "nonanswer", "template")
app = new_app()


def bars(rm: dict) -> tuple[bool, list[str]]:
    """(passes, one line per bar) for an RM's metrics."""
    kinds = rm["by_kind"]
    hard = kinds["hard"]
    ok = hard["acc"] > max(0.5, hard["sft_logprob_acc"])
    lines = [f"hard {hard['acc']:.3f} (likelihood {hard['sft_logprob_acc']:.3f}, word overlap "
             f"{hard['baseline_acc']:.3f}, {hard['pairs']} pairs): " + ("passes" if ok else "FAILS")]
    for k in PROBES:
        v = kinds.get(k)
        good = v is not None and v["acc"] >= PROBE_ACC
        ok &= good
        lines.append(f"{k} " + (f"{v['acc']:.3f} ({v['pairs']} pairs, margin {v['margin']:+.2f})" if v else "absent")
                     + (": passes" if good else ": FAILS"))
    return ok, lines


def rm_lines(root: Path, rms: tuple[str, ...] = RMS) -> list[str]:
    out = []
    for v in rms:
        if not kept.exists(root / v / "rm.json"):
            out.append(f"{v}: not run")
            continue
        rm, on = kept.read_json(root / v / "rm.json"), kept.read_json(root / v / "onpolicy.json")
        ok, lines = bars(rm)
        others = ", ".join(f"{k} {d['acc']:.3f}" for k, d in rm["by_kind"].items() if k not in ("hard", *PROBES))
        out += [f"{v}: {'PASSES' if ok else 'fails'}; trained on {rm['train_kinds']}; on-policy pairs "
                f"{on['pairs']} of {on['samples']} samples (skipped {on['skipped']}), kept ones cut at the budget "
                f"{on['truncated_frac']:.2f}, {on['mean_sample_tokens']:.1f} tokens on average",
                *(f"  - {line}" for line in lines), f"  - other kinds: {others}"]
    return out


def screen_lines(root: Path) -> list[str]:
    runs = kept.read_json(root / "metrics/grpo.json")
    out = ["", f"screen (the RM of {kept.read_text(root / 'screened.txt').strip()}): {len(runs)} GRPO runs", ""]
    _, kl, gain = dose(runs)
    out.append(f"- dose: baseline's KL at the end {', '.join(f'{x:.3f}' for x in kl)} (bar {DOSE_KL}); RM reward "
               f"gain beyond shuffled's {', '.join(f'{x:+.2f}' for x in gain)} (bar {DOSE_GAIN}): "
               + ("passes" if min(kl) >= DOSE_KL and min(gain) >= DOSE_GAIN else "FAILS"))
    samples = kept.read_parquet(root / "samples.parquet")
    words = samples["text"].str.split().str.len()
    for model, n in words.groupby(samples["model"], sort=False):
        out.append(f"- {model}: {n.mean():.1f} words per answer, under five words {(n < 5).mean():.2f}")
    out.append("- described: completions cut at the budget at the end of training, per run: "
               + ", ".join(f"{k} {r['truncated_frac_end']:.2f}" for k, r in sorted(runs.items())))
    return out + templates(samples, planned=True)


@app.command(help=__doc__.splitlines()[0])
def main(root: Annotated[Path, typer.Argument(help="the kept experiment: one folder per RM and the screen's files")],
         rms: Annotated[str, typer.Option(help="the RMs' folders, comma-separated")] = ",".join(RMS),
         passes: Annotated[str, typer.Option(help="only say (by the exit code) whether this RM passes its bars")] = ""
         ) -> None:
    if passes:
        ok, lines = bars(kept.read_json(root / passes / "rm.json"))
        print(f"{passes}: " + "; ".join(lines))
        raise typer.Exit(0 if ok else 1)
    lines = rm_lines(root, tuple(rms.split(",")))
    if kept.exists(root / "metrics/grpo.json"):
        lines += screen_lines(root)
    print("\n".join(lines))


if __name__ == "__main__":
    run_app(app, None, "analysis/rm_probes.py")
