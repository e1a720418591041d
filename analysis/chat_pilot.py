"""The SmolLM2 chat pilots' readings (reports/experiments/chat-smollm2-pilot, -2, -3 and -4, their plans'
checks and readings in code, written before any output of the evaluation was read): the checks first (the RM's
held-out accuracy by kind where the pilot kept it, the manipulation of density and the oracle against baseline, the
dose, the positive control's own manipulation, the temperature control), then each comparison as the range over the
instruments that pass, at the same temperature and at an equal reward, reward and the quality checks, each arm's KL,
and the power of density − baseline for the full design. No calls (a pilot). The second pilot's plan adds to the
dose the RM reward's gain beyond shuffled's (2b) and reads the RM (0); the first pilot's plan had neither. The third
adds a bar on the RM's held-out echo pairs to (0) and check (5), no template in the RM arms'
answers (printed last, with the per-model figures it reads); the fourth, the same bar on the nonanswer and template
pairs (the RM gate of reports/experiments/chat-smollm2-rm-end), and post hoc sections added after its reading.

    python analysis/chat_pilot.py reports/experiments/chat-smollm2-pilot-3
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from speedrun import kept
from speedrun.eval import stats
from speedrun.eval.compare import METRIC_BY_NAME
from speedrun.eval.controls import MIN_GROUP_TV, manipulation_check, power_table
from speedrun.typer_app import new_app, run_app

ARMS = ("baseline", "density", "shuffled", "balanced", "distinct")
PAIRS = (("baseline", "shuffled"), ("distinct", "baseline"), ("density", "baseline"), ("balanced", "baseline"))
DOSE_KL = 0.3
DOSE_GAIN = 0.5  # the second pilot's bar: baseline's RM reward gain (end - start) beyond shuffled's, every seed
ECHO_ACC = 0.9  # the third pilot's bars: the RM on held-out echo pairs, and no template in any RM-arm run (5)
MAX_ONE_WORD, MAX_OPENING = 0.2, 0.5
app = new_app()


def arm_of(run: dict) -> str:
    return run.get("arm", run.get("variant"))  # the pilots kept before the stage's --variant became --arm say variant


def _ci(d: dict, fmt: str = "{:+.4f}") -> str:
    return f"{fmt.format(d['value'])} [{fmt.format(d['ci_low'])}, {fmt.format(d['ci_high'])}]"


def _signed(d: dict, name: str) -> dict:
    """A same-temperature Δ signed so that > 0 reads more diverse (the equal-reward gaps are signed so already)."""
    s = -1.0 if METRIC_BY_NAME[name].good == "lower" else 1.0
    lo, hi = sorted((s * d["ci_low"], s * d["ci_high"]))
    return {"value": s * d["value"], "ci_low": lo, "ci_high": hi}


def asked_name(prompt: str) -> str:
    """The object a prompt asks about: its first backticked span ("" when it has none)."""
    return (re.findall(r"`([^`]+)`", prompt) or [""])[0]


def cut_name(text: str, name: list[str]) -> str:
    """The answer's words (the instruments' count) without each run of the name's words."""
    from speedrun.eval.diversity import words
    w, out, i = words(text), [], 0
    while i < len(w):
        if name and w[i:i + len(name)] == name:
            i += len(name)
            continue
        out.append(w[i])
        i += 1
    return " ".join(out)


def rm_check(rm: dict | None) -> list[str]:
    """(0) The RM's held-out accuracy by kind beside the base's likelihood and word overlap (the second pilot's bar:
    above 0.5 and above the base's likelihood on the hard pairs, whose two sides are references that end)."""
    if rm is None:
        return ["- (0) the RM: not kept with this pilot"]
    kinds = rm["by_kind"]
    cells = "; ".join(f"{k} {v['acc']:.3f} (likelihood {v['sft_logprob_acc']:.3f}, word overlap "
                      f"{v['baseline_acc']:.3f}, {v['pairs']} pairs)" for k, v in kinds.items())
    hard = kinds.get("hard")
    ok = hard is not None and hard["acc"] > max(0.5, hard["sft_logprob_acc"])
    out = [f"- (0) the RM's held-out accuracy by kind: {cells}: {'passes' if ok else 'FAILS'} (hard above 0.5 and "
           "above the base's likelihood)"]
    for k in ("echo", "nonanswer", "template"):  # the third pilot's bar (echo), the fourth's (the RM gate's probes)
        if k in kinds:
            ok = kinds[k]["acc"] >= ECHO_ACC
            out.append(f"- (0) {k} pairs {kinds[k]['acc']:.3f}: {'passes' if ok else 'FAILS'} (bar {ECHO_ACC})")
    return out


def dose(runs: dict) -> tuple[list[int], list[float], list[float]]:
    """baseline's seeds, its KL at the end per seed, and its RM reward gain (end - start) beyond shuffled's per seed."""
    seeds = sorted(r["seed"] for r in runs.values() if arm_of(r) == "baseline")
    gain = lambda r: r["reward_end"] - r["reward_start"]  # noqa: E731
    return (seeds, [runs[f"baseline_s{s}"]["kl_end"] for s in seeds],
            [gain(runs[f"baseline_s{s}"]) - gain(runs[f"shuffled_s{s}"]) for s in seeds])


def checks(result: dict, runs: dict, weights, rm: dict | None = None) -> list[str]:
    """The plan's checks (0)-(4), in its order."""
    frames = {v: {int(r.rsplit("_s", 1)[1]): f.drop(columns="run").reset_index(drop=True)
                  for r, f in weights[weights["run"].str.startswith(f"{v}_s")].groupby("run")} for v in ARMS}
    out = ["Checks (read first):", "", *rm_check(rm)]
    for arm in ("density", "balanced"):
        m = manipulation_check(frames, arm, "baseline")
        out.append(f"- (1) {arm} against baseline: TV over modules {m['group_tv']:.3f} (bar {MIN_GROUP_TV}), over "
                   f"prompts {m['prompt_tv']:.3f}: {'passes' if m['group_tv'] >= MIN_GROUP_TV else 'FAILS'}")
    seeds, kl, beyond = dose(runs)
    above = [runs[f"baseline_s{s}"]["reward_end"] > runs[f"shuffled_s{s}"]["reward_end"] for s in seeds]
    out.append(f"- (2) the dose: baseline's KL at the end {', '.join(f'{k:.3f}' for k in kl)} (bar {DOSE_KL} in every "
               f"seed: {'passes' if min(kl) >= DOSE_KL else 'FAILS'}); its RM reward at the end above shuffled's in "
               f"{sum(above)} of {len(seeds)} seeds ({'passes' if all(above) else 'FAILS'})")
    out.append(f"- (2b) baseline's RM reward gain beyond shuffled's, per seed: "
               f"{', '.join(f'{b:+.2f}' for b in beyond)} (bar {DOSE_GAIN} in every seed: "
               f"{'passes' if min(beyond) >= DOSE_GAIN else 'FAILS'})")
    d = [(runs[f"distinct_s{s}"]["distinctness_end"], runs[f"baseline_s{s}"]["distinctness_end"]) for s in seeds]
    pairs = ", ".join(f"{a:.3f}/{b:.3f}" for a, b in d)
    out.append(f"- (3) distinct's distinctness at the end against baseline's: {pairs} "
               f"({'passes' if all(a > b for a, b in d) else 'FAILS'}: above in every seed)")
    control = result["temperature_control"]["metrics"]
    ok = [m for m, x in control.items() if x["passes"]]
    out.append(f"- (4) the temperature control passes {len(ok)} of {len(control)} instruments: {', '.join(ok)}; fails: "
               + ", ".join(f"{m} (rho {x['rho']:.2f})" for m, x in control.items() if not x["passes"]))
    return out


def readings(result: dict) -> list[str]:
    """Each comparison over the instruments the temperature control passes: the range, and how many intervals
    exclude 0 either way, at the same temperature and at an equal reward (> 0: a more diverse)."""
    ok = [m for m, x in result["temperature_control"]["metrics"].items() if x["passes"]]
    by_pair = {(c["a"], c["b"]): c for c in result["comparisons"]}
    er = result.get("equal_reward", {}).get("comparisons", {})
    out = ["", "| comparison (> 0: the first more diverse) | reading | range over passing instruments | "
               "intervals above 0 / below 0 | each |", "|---|---|---|---|---|"]
    for a, b in PAIRS:
        for label, cells in (("same temperature", {m: _signed(by_pair[(a, b)]["delta"][m], m) for m in ok
                                                   if m in by_pair[(a, b)]["delta"]}),
                             ("equal reward", {m: er[f"{a} - {b}"][m] for m in ok if m in er.get(f"{a} - {b}", {})})):
            if not cells:
                out.append(f"| {a} − {b} | {label} | none read | | |")
                continue
            v = [c["value"] for c in cells.values()]
            up, down = sum(c["ci_low"] > 0 for c in cells.values()), sum(c["ci_high"] < 0 for c in cells.values())
            each = "; ".join(f"{m} {_ci(c)}" for m, c in cells.items())
            out.append(f"| {a} − {b} | {label} | {min(v):+.4f} to {max(v):+.4f} | {up} / {down} | {each} |")
    return out


def outcomes(result: dict, runs: dict) -> list[str]:
    """Reward, the quality checks not from the RM, KL, and the power of density − baseline."""
    out = ["", "Reward and quality, each arm against baseline (same temperature):", ""]
    by_pair = {(c["a"], c["b"]): c for c in result["comparisons"]}
    task = {(c["a"], c["b"]): c["delta"] for c in result.get("task", {}).get("comparisons", [])}
    for a, b in PAIRS:
        d = by_pair[(a, b)]["delta"]
        cells = [f"{m} {_ci(d[m])}" for m in ("reward", "ref_loglik") if m in d]
        cells += [f"gold {k} {_ci(v)}" for k, v in task.get((a, b), {}).items() if k == "pass@1"]
        out.append(f"- {a} − {b}: " + ", ".join(cells))
    out += ["", "KL at the end and the RM's reward (start -> end), per run:", ""]
    for arm in ARMS:
        rs = sorted((r for r in runs.values() if arm_of(r) == arm), key=lambda r: r["seed"])
        out.append(f"- {arm}: KL " + ", ".join(f"{r['kl_end']:.3f}" for r in rs) + "; reward "
                   + ", ".join(f"{r['reward_start']:+.2f} -> {r['reward_end']:+.2f}" for r in rs)
                   + f"; mean KL {np.mean([r['kl_end'] for r in rs]):.3f}")
    power = power_table(result, by_pair[("density", "baseline")], "baseline")
    out += ["", "Power of density − baseline (the report's method; collapse = baseline − SFT), per primary:", ""]
    for name, p in power.items():
        share = "no collapse to take a share of" if p["mde_share"] is None else f"{p['mde_share']:.0%} of it"
        out.append(f"- {name}: collapse {p['collapse']:+.4f}, MDE {p['mde']:.4f} at {p['runs']} seeds ({share}); "
                   f"seeds per arm for 30%: {p['runs_for_30pct']}, for 50%: {p['runs_for_50pct']}")
    # the plans' words: an MDE of 30% of reading 1 (baseline − shuffled), where reading 1 excludes 0
    d, r1 = by_pair[("density", "baseline")], by_pair[("baseline", "shuffled")]["delta"]
    out += ["", "Seeds per arm for an MDE of 30% of reading 1, baseline − shuffled (the plans' words):", ""]
    for name in power:
        x, target = d["delta"][name], 0.3 * abs(r1[name]["value"])
        need = stats.runs_needed(x["between_var"], x["prompt_var"], len(d["runs_a"]), target, max(1, len(power)))
        out.append(f"- {name}: reading 1 {_ci(_signed(r1[name], name))} (> 0: baseline more diverse), 30% of it "
                   f"{target:.4f}: {need} seeds per arm (None: over {stats.MAX_RUNS})")
    return out


def post_hoc(result: dict, samples) -> list[str]:
    """Added after the fourth pilot's reading, at its referee's asking (no planned figure changes): each
    same-temperature interval as a share of the SFT model's range over the control temperatures (> 0: the first more
    diverse; a bound below 0 is the most narrowing left open), the MDEs of density − baseline likewise, each arm
    against the SFT model, answers under five of the instruments' words, and distinct-2 with the asked name cut out."""
    from speedrun.eval.diversity import distinct_n, words
    control = {m: x for m, x in result["temperature_control"]["metrics"].items() if x["passes"]}
    span = {m: abs(x["values"][-1] - x["values"][0]) for m, x in control.items()}
    by_pair = {(c["a"], c["b"]): c for c in result["comparisons"]}
    out = ["", "Post hoc: each interval as a share of the SFT model's range from the coldest to the hottest control "
               "temperature (same temperature, > 0: the first more diverse):", ""]
    for a, b in PAIRS:
        d = {m: _signed(by_pair[(a, b)]["delta"][m], m) for m in control if m in by_pair[(a, b)]["delta"]}
        out.append(f"- {a} − {b}: " + "; ".join(f"{m} [{x['ci_low'] / span[m]:+.0%}, {x['ci_high'] / span[m]:+.0%}]"
                                                  for m, x in d.items()))
    power = power_table(result, by_pair[("density", "baseline")], "baseline")
    out.append("- MDE of density − baseline at its seeds as a share of that range: " + ", ".join(
        f"{m} {p['mde']:.4f} ({p['mde'] / span[m]:.0%})" for m, p in power.items() if m in span))
    out += ["", "Post hoc: each arm against the SFT model, same temperature (> 0: the arm more diverse):", ""]
    for arm in ARMS:
        d = {m: _signed(result["vs_reference"][arm][m], m) for m in control if m in result["vs_reference"][arm]}
        out.append(f"- {arm}: " + "; ".join(f"{m} {_ci(x, '{:+.3f}')}" for m, x in d.items()))
    names = samples["prompt"].map(lambda q: words(asked_name(q)))
    cut = [cut_name(t, n) for n, t in zip(names, samples["text"])]
    first = lambda ts: [" ".join(words(t)[:5]) for t in ts]  # noqa: E731  the _first instruments' window
    out += ["", "Post hoc, per model: answers under five words (the instruments' count); distinct-2 of the first five "
                "words and of the whole answer, as is -> with the asked name cut out; word entropy (bits):", ""]
    for model, g in samples.assign(cut=cut).groupby("model", sort=False):
        short = np.mean([len(words(t)) < 5 for t in g["text"]])
        out.append(f"- {model}: under five words {short:.2f}; first five {distinct_n(first(g['text']), 2):.3f} -> "
                   f"{distinct_n(first(g['cut']), 2):.3f}; whole {distinct_n(g['text'], 2):.3f} -> "
                   f"{distinct_n(g['cut'], 2):.3f}; word entropy {result['values'][model]['word_entropy']:.2f}")
    return out


def described(runs: dict, samples, cut_at: int, base: str) -> list[str]:
    """The second pilot's descriptions (no intervals): each arm's share of answers cut at the token limit at the end
    of training (the runs' logs), and the RM's standardised reward of the evaluation's answers that end against
    those cut, per model kind (a response is cut when it re-encodes to cut_at tokens or more in the base's
    tokenizer: the evaluation keeps text, not ids)."""
    from speedrun.pretrained import load_base
    tok = load_base(base, "base")[0].tokenizer
    out = ["", "Described, not read (no intervals):", ""]
    for arm in ARMS:
        rs = sorted((r for r in runs.values() if arm_of(r) == arm), key=lambda r: r["seed"])
        out.append(f"- {arm}: share cut at the end of training, per seed "
                   + ", ".join(f"{r['truncated_frac_end']:.2f}" for r in rs))
    cut = samples["text"].map(lambda t: len(tok.encode(t)) >= cut_at)
    arm = samples["model"].str.replace(r"^grpo_", "", regex=True).str.replace(r"_s\d+$", "", regex=True)
    out.append("")
    for name, g in samples.assign(cut=cut, arm=arm).groupby("arm", sort=False):
        ended, cuts = g.loc[~g["cut"], "reward"], g.loc[g["cut"], "reward"]
        fmt = lambda x: f"{x.mean():+.2f} (n {len(x)})" if len(x) else "none"  # noqa: E731
        out.append(f"- {name}: evaluation answers cut {g['cut'].mean():.2f}; the RM's reward of those that end "
                   f"{fmt(ended)}, of those cut {fmt(cuts)}")
    return out


def templates(samples, planned: bool) -> list[str]:
    """Per model, words per response, the share of responses that are one word (the asked object's name alone, in
    backticks), and the most common opening (the first two words, the asked object's name written X) with its share:
    post hoc in the second pilot (found reading its samples), planned in the third, whose check (5) bars them in
    every run of the RM arms."""
    out = ["", ("Described (planned), and check (5)" if planned else "Post hoc (not in the plan)")
           + ": what the answers became, per model", ""]
    fails = []
    for model, g in samples.groupby("model", sort=False):
        names = g["prompt"].map(asked_name)
        words = g["text"].str.split()
        opening = [" ".join(w[:2]).replace(q, "X") if q else " ".join(w[:2]) for w, q in zip(words, names)]
        top = max(set(opening), key=lambda o: (opening.count(o), o))
        n = words.str.len()
        one, share = (n == 1).mean(), opening.count(top) / len(opening)
        out.append(f"- {model}: {n.mean():.1f} words, one-word answers {one:.2f}, most common opening "
                   f"{top!r} {share:.2f}")
        if model.startswith("grpo_") and not model.startswith("grpo_shuffled_") and (one > MAX_ONE_WORD or
                                                                                   share > MAX_OPENING):
            fails.append(model)
    if planned:
        out += ["", f"- (5) no template (one-word answers at most {MAX_ONE_WORD}, the top opening at most "
                    f"{MAX_OPENING}, in every RM-arm run): " + (f"FAILS in {', '.join(fails)}" if fails else "passes")]
    return out


def form(samples) -> list[str]:
    """The fourth pilot's planned descriptions (what the gate's screen showed, post hoc there): per model, the share
    of answers that name the asked object, that hold a backtick, and that end in ".", "!" or "?"."""
    out = ["", "Described (planned in the fourth pilot): the answers' form, per model", ""]
    for model, g in samples.groupby("model", sort=False):
        names = g["prompt"].map(asked_name)
        named = [bool(q) and q in t for q, t in zip(names, g["text"])]
        text = g["text"].str.rstrip()
        out.append(f"- {model}: names the asked object {sum(named) / len(named):.2f}, a backtick "
                   f"{text.str.contains('`').mean():.2f}, ends in . ! ? {text.str[-1:].isin(list('.!?')).mean():.2f}")
    return out


@app.command(help=__doc__.splitlines()[0])
def main(root: Annotated[Path, typer.Argument(help="the kept pilot: result.json, weights.parquet, metrics/")]) -> None:
    result = kept.read_json(root / "result.json")
    runs = kept.read_json(root / "metrics/grpo.json")
    weights = kept.read_parquet(root / "weights.parquet")
    rm = kept.read_json(root / "metrics/rm.json") if kept.exists(root / "metrics/rm.json") else None
    lines = [f"{root.name}: {len(runs)} GRPO runs", "", *checks(result, runs, weights, rm), *readings(result),
             *outcomes(result, runs)]
    if rm is not None:  # the second pilot's plan names these descriptions; the first's did not
        samples = kept.read_parquet(root / "samples.parquet")
        planned = "echo" in rm["by_kind"]  # the third pilot's RM, which its plan's check (5) goes with
        lines += described(runs, samples, 48, "smollm2-135m") + templates(samples, planned)
        if "nonanswer" in rm["by_kind"]:  # the fourth pilot's RM
            lines += form(samples) + post_hoc(result, samples)
    print("\n".join(lines))


if __name__ == "__main__":
    run_app(app, None, "analysis/chat_pilot.py")
