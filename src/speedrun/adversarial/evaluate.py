"""adv_eval: per-cycle metrics of the adversarial track, the cross-play table, figures and a markdown section.

Policy 0 is the init of the first cycle; policy i is cycle i's GRPO output. Every policy completes the same
held-out natural prefixes (val split, P uniform in [1, N/2], fixed seeds); every discriminator scores every
policy's completions and the true continuations ("natural"): the cross-play table. A cycle's held-out reward
before / after is its discriminator's score of policy prev / policy i. Figures use matplotlib's object API on
the Agg canvas at a fixed dpi without the Software tag, so a rerun writes byte-identical files.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from speedrun.common import write_bytes, write_text

DPI = 100
NATURAL = "natural"


def ordered_cycles(cycles: dict[str, dict]) -> dict[str, dict]:
    """adversarial.cycles (as plain dicts) in cycle order: "2" before "10"."""
    return dict(sorted(cycles.items(), key=lambda kv: (len(kv[0]), kv[0])))  # numeric order of digit strings


def policy_dirs(cycles: dict[str, dict], adv_dir: Path) -> dict[str, Path]:
    """{policy id: checkpoint dir}: each cycle's starting policy (its prev) and its GRPO output."""
    out: dict[str, Path] = {}
    for key, c in cycles.items():
        out.setdefault(str(c["prev"]), Path(c["init"]))  # policy 0 exists only as cycle 1's init
        out[key] = Path(adv_dir) / f"cycle_{key}" / "policy"
    return dict(sorted(out.items(), key=lambda kv: (len(kv[0]), kv[0])))


def cycle_rows(cycles: dict[str, dict], disc_metrics: dict[str, dict], grpo_metrics: dict[str, dict],
               crossplay: dict[str, dict[str, float]], policies: dict[str, dict], bpb_bound: float) -> dict[str, dict]:
    """The per-cycle block of adversarial.json."""
    out = {}
    for key, c in cycles.items():
        prev, d, g = str(c["prev"]), disc_metrics[key], grpo_metrics[key]
        before, after = policies[prev]["val_bpb"], policies[key]["val_bpb"]
        out[key] = {
            "prev": int(prev), "init": c["init"],
            "disc": {k: d.get(k) for k in ("head", "auc_pure", "mae_k_frac", "mae_k_frac_baseline",
                                           "switch_error_tokens", "token_accuracy", "steps", "stopped_early")},
            # the same discriminator scores both: did GRPO move the policy towards what it calls natural?
            "reward_before": crossplay[key][prev], "reward_after": crossplay[key][key],
            "reward_natural": crossplay[key][NATURAL],
            "grpo": {k: g.get(k) for k in ("reward_first", "reward_last", "steps", "stop_reason", "kl_last")},
            "val_bpb_before": before, "val_bpb_after": after, "val_bpb_delta": round(after - before, 5),
            "val_bpb_within_bound": bool(after - before <= bpb_bound),  # the KL anchor kept the language model
            "distinct_1": policies[key]["distinct_1"], "distinct_2": policies[key]["distinct_2"],
            "distinct_2_before": policies[prev]["distinct_2"],
        }
    return out


def _save(fig: Figure, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    write_bytes(path, buf.getvalue())


def plot_grpo(logs: dict[str, pd.DataFrame], path: Path) -> None:
    """Per cycle: the GRPO batch's mean reward and KL to policy prev, per step."""
    fig = Figure(figsize=(10, 3.4))
    ax_r, ax_k = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for key, log in logs.items():
        ax_r.plot(log["step"], log["reward_mean"], marker=".", label=f"cycle {key}")
        ax_k.plot(log["step"], log["kl"], marker=".", label=f"cycle {key}")
    ax_r.set(title="GRPO reward (batch mean P(natural))", xlabel="step", ylabel="reward")
    ax_k.set(title="KL to policy i-1 (k3, per token)", xlabel="step", ylabel="KL")
    ax_r.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def plot_crossplay(crossplay: dict[str, dict[str, float]], path: Path) -> None:
    """Heatmap: discriminator of cycle i (rows) scoring each policy's completions and natural text (columns)."""
    rows, cols = list(crossplay), list(next(iter(crossplay.values())))
    vals = np.array([[crossplay[r][c] for c in cols] for r in rows], dtype=float)
    fig = Figure(figsize=(1.3 * len(cols) + 2, 0.7 * len(rows) + 1.6))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(vals, vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(len(cols)), [c if c == NATURAL else f"policy {c}" for c in cols])
    ax.set_yticks(range(len(rows)), [f"disc {r}" for r in rows])
    for i in range(len(rows)):
        for j in range(len(cols)):
            ax.text(j, i, f"{vals[i, j]:.2f}", ha="center", va="center", color="w" if vals[i, j] < 0.6 else "k")
    ax.set_title("cross-play: mean P(natural) of completions")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    _save(fig, path)


def plot_cycles(result: dict, path: Path) -> None:
    """Val bits-per-byte per policy; discriminator AUC and MAE of K/N per cycle."""
    pol, cyc = result["policies"], result["cycles"]
    fig = Figure(figsize=(10, 3.4))
    ax = fig.add_subplot(1, 2, 1)
    ax.plot(range(len(pol)), [p["val_bpb"] for p in pol.values()], marker="o")
    ax.set_xticks(range(len(pol)), [f"policy {k}" for k in pol])
    ax.set(title="val bits per byte (held-out corpus)", ylabel="bpb")
    ax = fig.add_subplot(1, 2, 2)
    x = np.arange(len(cyc))
    # auc_pure is None when a split had no fully generated window: drawn as 0, the table says n/a
    ax.bar(x - 0.2, [c["disc"]["auc_pure"] or 0 for c in cyc.values()], 0.4, label="AUC pure nat. vs gen.")
    ax.bar(x + 0.2, [c["disc"]["mae_k_frac"] for c in cyc.values()], 0.4, label="MAE of K/N")
    ax.axhline(0.5, color="#7f7f7f", linestyle="--", linewidth=1, label="chance AUC")
    ax.set_xticks(x, [f"disc {k}" for k in cyc])
    ax.set(title="discriminators (val)", ylim=(0, 1))
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def _f(x, fmt: str = ".3f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _cell(text: str, limit: int = 300) -> str:
    text = text if len(text) <= limit else text[:limit] + "…"
    return text.replace("|", "\\|").replace("\n", " ⏎ ")  # one table cell: no pipe, no line break


def write_section(result: dict, samples: dict[str, list[str]], logs: dict[str, pd.DataFrame], out_md: Path,
                  fig_dir: Path) -> str:
    """reports/adversarial.md and its figures (adv_grpo.png, adv_crossplay.png, adv_cycles.png)."""
    out_md, fig_dir = Path(out_md), Path(fig_dir)
    rel = lambda name: Path(os.path.relpath(fig_dir / name, out_md.parent)).as_posix()  # noqa: E731
    plot_grpo(logs, fig_dir / "adv_grpo.png")
    plot_crossplay(result["crossplay"], fig_dir / "adv_crossplay.png")
    plot_cycles(result, fig_dir / "adv_cycles.png")
    s = result["setup"]
    lines = ["## Adversarial cycles (self-supervised reward)", "",
             f"Discriminator i learns which tokens of {s['seq_len']}-token windows policy i-1 generated; GRPO then "
             f"trains policy i to fool it (KL to policy i-1, beta {s['beta']}). Held-out: {s['prompts']} val-split "
             f"prefixes of 1..{s['seq_len'] // 2} tokens completed to {s['seq_len']}; val bpb on {s['bpb_windows']} "
             f"windows of {s['bpb_seq_len']} tokens; bound on the bpb increase per cycle: {result['bpb_bound']}.", "",
             "| cycle | disc AUC (pure) | MAE K/N (mean-guess) | switch err (tok) | held-out reward before → after "
             "(natural) | GRPO batch reward first → last | steps (stop) | val bpb before → after (Δ) "
             "| distinct-2 |",
             "|---|---:|---:|---:|---|---|---|---|---:|"]
    for key, c in result["cycles"].items():
        d, g = c["disc"], c["grpo"]
        ok = "✅" if c["val_bpb_within_bound"] else "❌"
        lines.append(f"| {key} | {_f(d['auc_pure'])} | {_f(d['mae_k_frac'])} ({_f(d['mae_k_frac_baseline'])}) | "
                     f"{_f(d['switch_error_tokens'], '.1f')} | {c['reward_before']:.3f} → {c['reward_after']:.3f} "
                     f"({c['reward_natural']:.3f}) | {_f(g['reward_first'])} → {_f(g['reward_last'])} | "
                     f"{g['steps']} ({g['stop_reason']}) | {c['val_bpb_before']:.4f} → {c['val_bpb_after']:.4f} "
                     f"({c['val_bpb_delta']:+.4f} {ok}) | {c['distinct_2_before']:.3f} → {c['distinct_2']:.3f} |")
    cols = list(next(iter(result["crossplay"].values())))
    header = " | ".join(c if c == NATURAL else f"policy {c}" for c in cols)
    lines += ["", "**Cross-play** (mean P(natural) of the completions; rows: discriminator of cycle i, trained "
              "against policy i-1):", "", f"| | {header} |", "|---|" + "---:|" * len(cols)]
    for r, row in result["crossplay"].items():
        lines.append(f"| disc {r} | " + " | ".join(f"{row[c]:.3f}" for c in cols) + " |")
    lines += ["", f"![GRPO reward and KL per step]({rel('adv_grpo.png')})", "",
              f"![cross-play]({rel('adv_crossplay.png')})", "",
              f"![val bpb per policy, discriminator metrics per cycle]({rel('adv_cycles.png')})", "",
              "**Samples** (held-out prefix ⟶ completion):", "",
              "| policy | sample |", "|---|---|"]
    for name, texts in samples.items():
        for t in texts:
            lines.append(f"| {name} | {_cell(t)} |")
    md = "\n".join(lines) + "\n"
    write_text(out_md, md)
    return md
