"""The task track's manipulation check and its markdown report (reports/task.md), from task_eval's result."""
from __future__ import annotations

from itertools import combinations

from speedrun.eval.task_track import BLIND_MARGIN, BLIND_RATIO

TV_BAR = 0.3  # the weights must move the cluster mix at least this far from uniform
SPREAD_FACTOR = 2.0  # realised mix between arms must differ by more than this many times the seed-to-seed spread
PARAPHRASE_BAR = 0.8  # a meaning embedding puts this share of the paraphrases beside their own cluster


def tv(a: dict[str, float], b: dict[str, float]) -> float:
    """Total variation between two share dicts."""
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def manipulation(metrics: dict[str, list[dict]], variants: dict[str, dict]) -> dict:
    """Per arm that does not sample uniformly, against the uniform arm with the same reward: TV of its weights' cluster
    shares from uniform, the mean TV of the realised draws between the arms (paired by seed), and the mean TV between
    seeds of one arm (the spread chance alone gives). Passes when the first is >= TV_BAR and the second is more than
    SPREAD_FACTOR x the third."""
    out = {}
    for arm, ms in metrics.items():
        if variants[arm]["sampling"] not in ("density", "balanced"):  # selection arms: the training table's spend
            continue
        base = next((a for a, v in variants.items() if v["sampling"] == "uniform" and v["reward"] ==
                     variants[arm]["reward"] and v.get("advantage", "group") == "group" and not v.get("clip_high")
                     and not v.get("entropy_bonus")), None)  # the plain arm: uniform draws, GRPO as is
        if base is None:
            out[arm] = {"against": None, "passed": None}
            continue
        w = tv(ms[0]["cluster_share_weights"], metrics[base][0]["cluster_share_weights"])
        between = [tv(a["cluster_share_draws"], b["cluster_share_draws"]) for a, b in zip(ms, metrics[base])]
        within = [tv(a["cluster_share_draws"], b["cluster_share_draws"])
                  for runs in (ms, metrics[base]) for a, b in combinations(runs, 2)]
        spread = sum(within) / len(within) if within else float("nan")
        mix = sum(between) / len(between)
        out[arm] = {"against": base, "weights_tv": round(w, 4), "draws_tv_between_arms": round(mix, 4),
                    "draws_tv_between_seeds": round(spread, 4), "shares_weights": ms[0]["cluster_share_weights"],
                    "text_neighbour_purity": ms[0].get("text_neighbour_purity"),
                    "paraphrase_purity": ms[0].get("paraphrase_purity"), "embedding": ms[0].get("embedding"),
                    "passed": bool(w >= TV_BAR and mix > SPREAD_FACTOR * spread)}
    return out


def collapse_verdict(gaps: dict[str, dict], control: str = "shuffled") -> str:
    """Collapse by the reward is the part of an arm's gap below the envelope that lies beyond the shuffled-reward
    arm's (GRPO's drift with a reward that carries no information): called only where the interval of the difference
    excludes 0, never because the control's own interval includes 0."""
    below = [a for a, g in gaps.items() if g["ci_high"] < 0 and a != control]
    if control not in gaps:
        return ("No shuffled-reward arm ran on this substrate: nothing separates collapse by the reward from drift by "
                "training alone, so no arm is called collapsed" + (f" (below the envelope: {', '.join(below)})."
                                                                   if below else "."))
    ctrl = gaps[control]
    called = [a for a, g in gaps.items() if g.get("collapsed")]
    lines = [f"The shuffled-reward arm (drift: GRPO updates that carry no information) lies at {ctrl['gap']:+.3f} "
             f"[{ctrl['ci_low']:+.3f}, {ctrl['ci_high']:+.3f}]"
             + (", below the envelope too." if ctrl["ci_high"] < 0 else ".")]
    if below:
        lines.append(f"Below the envelope (interval under 0): {', '.join(below)}.")
    if called:
        lines.append(f"**Collapsed by the reward** (gap beyond the shuffled arm's, interval of the difference under "
                     f"0): {', '.join(called)}.")
    else:
        lines.append("**No arm collapsed by its reward**: no arm's gap lies beyond the shuffled arm's with an "
                     "interval of the difference under 0 (a control whose own interval includes 0 calls nothing).")
    return " ".join(lines)


def rm_section(r: dict) -> list[str]:
    """The RLHF arm: what the reward model knows of the task, and its reward beside the gold checker's."""
    arms = [a for a, v in r["variants"].items() if v["reward"] == "rm"]
    if not arms:
        return []
    rm = r.get("rm")
    lines = ["", "## The RLHF way: the reward model as proxy, the checker as gold", ""]
    if not rm:
        return lines + ["The reward model scored no task pairs on its validation split: nothing says it knows the "
                        "task."]
    lines.append(f"Reward model on {rm['pairs']} held-out task pairs (val items; a right answer against a wrong one "
                 f"in the same phrasing): accuracy {rm['acc']:.3f}, margin {rm['margin']:.2f} (word-overlap "
                 f"baseline {rm['baseline_acc']:.3f}; the SFT model's own likelihood picks the right one "
                 f"{rm['sft_logprob_acc']:.3f}).")
    sft1 = r["sft"].get("1.0", next(iter(r["sft"].values())))["all"]["pass@1"]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    for arm in arms:
        t = r["training"][arm]
        a = r["arms"][arm]["mean"]["all"]
        lines.append(f"- {arm}: standardised RM reward on its train items {mean(t['reward_start']):+.2f} → "
                     f"{mean(t['reward_end']):+.2f}, gold pass there {mean(t['gold_pass_start']):.2f} → "
                     f"{mean(t['gold_pass_end']):.2f}; held-out gold pass@1 {a['pass@1']:.3f} (task SFT at T=1: "
                     f"{sft1:.3f}). A rising proxy with a flat or falling gold pass is over-optimisation of the reward "
                     "model.")
    return lines


def _ci(d: dict, digits: int = 3) -> str:
    return f"{d['value']:+.{digits}f} [{d['ci_low']:+.{digits}f}, {d['ci_high']:+.{digits}f}]"


def _primary(comps: dict) -> str:
    return next(iter(comps.values())).get("primary", "gap")


def _reading(g: dict) -> str:
    """Δ [CI] | Holm p (the primary only) | permutation p | MDE (share of the collapse) | seeds for the target."""
    share = f"{g['mde']:.3f} " + (f"({g['mde'] / g['collapse']:.0%})" if g["collapse"] > 0 else "(no collapse)")
    perm = g["permutation"]["p"]
    holm_p = f"{g['p_holm']:.3f}{' **called**' if g['called'] else ''}" if "p_holm" in g else "— (secondary)"
    return (f"{_ci(g)} | {holm_p} | {'—' if perm is None else f'{perm:.3f}'} | {share} | "
            f"{g['seeds_needed'] or '> 64'}")


READINGS = {"gap": "Δ frontier gap", "same_temperature": "Δ coverage, same temperature",
            "matched": "Δ coverage at equal pass@1", "matched_other": "Δ coverage at equal pass@1"}


def comparison_section(r: dict) -> list[str]:
    """Each task.eval.comparisons pair: the primary reading (Holm) with pass@1 non-inferiority, then every reading
    (frontier gap, same temperature, equal pass@1 at either arm's pass@1) and the effect as their range, per cluster."""
    comps = r.get("comparisons") or {}
    if not comps:
        return []
    primary = _primary(comps)
    name = READINGS[primary] + (f" at the {next(iter(comps.values()))['matched']['at']} arm's pass@1"
                                if primary == "matched" else "")
    lines = ["", "## Sampling arms against uniform (task.eval.comparisons)", "",
             f"Primary ({primary}): {name} over all held-out items (> 0 = the treatment keeps more right answers), "
             "Holm over the comparisons at 0.05; the interval counts seeds and items (stats.pooled_delta); MDE at 80% "
             "power and these seeds; collapse = the uniform arm's gap below the envelope. pass@1: non-inferior when "
             f"the interval's lower end lies above −margin, margin = {r['pass1_margin_share']:g} x the uniform arm's "
             "pass@1 gain over the SFT model at T=1.", "",
             f"| comparison | {name} [95% CI] | Holm p | permutation p | MDE (of collapse) | seeds/arm for MDE ≤ "
             f"{r['mde_share']:.0%} | pass@1 Δ [95% CI] | margin | pass@1 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for c in comps.values():
        p1 = c["pass@1"]
        lines.append(f"| {c['treatment']} − {c['control']} | {_reading(c[primary])} | {_ci(p1)} | "
                     f"{p1['margin']:.3f} | {p1['verdict']} |")
    failed = [a for a, m in r.get("manipulation", {}).items() if m.get("passed") is False
              and any(c["treatment"] == a for c in comps.values())]
    if failed:
        lines += ["", f"**The manipulation check failed for {', '.join(failed)}** (below): its sampler did not move "
                  "the cluster mix enough, so its comparison is shown and not read."]
    first = next(iter(comps.values()))
    keys = [k for k in READINGS if k in first]
    heads = [READINGS[k] + (f" at the {first[k]['at']}'s pass@1" if k.startswith("matched") else "") for k in keys]
    lines += ["", "Every reading of the same runs (the effect is their range, not the reading that suits): the gap is "
              "read against the SFT envelope at each run's own pass@1; the same-temperature Δ leaves any pass@1 "
              "difference in; the equal-pass@1 readings put each run on its own temperature curve "
              + (f"(T = {', '.join(f'{t:g}' for t in [r['arm_temperature'], *r['run_temperatures']])}; readings "
                 "past a curve's highest pass@1 are extended linearly, share shown)" if r["run_temperatures"] else
                 "(not read: task.eval.run_temperatures has only the GRPO temperature)") + ".", "",
              "| comparison | " + " | ".join(heads) + " | range |", "|---|" + "---:|" * (len(keys) + 1)]
    for c in comps.values():
        cells = [_ci(c[k]) + (f" ({c[k]['extended_share']:.0%} ext.)" if "extended_share" in c[k] else "")
                 for k in keys]
        lines.append(f"| {c['treatment']} − {c['control']} | " + " | ".join(cells)
                     + f" | {c['range']['low']:+.3f} to {c['range']['high']:+.3f} |")
    lines += ["", "Per cluster (the frontier gap, secondary, each cluster's own envelope, unadjusted; small clusters "
              "have wide intervals):",
              "", "| comparison | " + " | ".join(first["clusters"]) + " |", "|---|" + "---:|" * len(first["clusters"])]
    for c in comps.values():
        lines.append(f"| {c['treatment']} − {c['control']} | " + " | ".join(_ci(d, 2) for d in c["clusters"].values())
                     + " |")
    return lines


def curve_section(r: dict) -> list[str]:
    """Each arm's own pass@1-coverage curve (mean over seeds), where the runs were sampled at several temperatures."""
    curves = r.get("curves")
    if not curves:
        return []
    temps = list(next(iter(curves.values())))
    lines = ["", "## Each arm's own curve (mean over seeds: pass@1, coverage)", "",
             "| arm | " + " | ".join(f"T={t}" for t in temps) + " |", "|---|" + "---|" * len(temps)]
    for arm, c in curves.items():
        lines.append(f"| {arm} | " + " | ".join(f"{c[t]['pass@1']:.3f}, {c[t]['coverage']:.2f}" for t in temps)
                     + " |")
    return lines


def blind_section(r: dict) -> list[str]:
    """Per cluster: pass@1 against the prompt-blind baseline (answers to the cluster's other items); a cluster the
    GRPO arms train on should be read from the prompt there (task_track.BLIND_RATIO, BLIND_MARGIN)."""
    b = r.get("blind")
    if not b:
        return []
    rows = [(f"task SFT, T={b['temperature']}", b["sft"])] + [(arm, v) for arm, v in b["arms"].items()]
    clusters = list(b["sft"])
    lines = ["", "## Does the model read its prompt? (pass@1 against a prompt-blind baseline, per cluster)", "",
             "Blind = each item's checker applied to the answers given to the other items of its cluster: what a "
             f"model scores that ignores the prompt's bounds. A model reads a cluster when pass@1 ≥ {BLIND_RATIO:g}x "
             f"blind and ≥ blind + {BLIND_MARGIN:g} (**bold**: it does). GRPO trains on: "
             f"{', '.join(b['trained'])}.", "",
             "| model | " + " | ".join(clusters) + " |", "|---|" + "---:|" * len(clusters)]
    for name, v in rows:
        cells = [_blind_cell(v[c]) if c in v else "—" for c in clusters]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    unread = [c for c in b["trained"] if not b["sft"].get(c, {}).get("reads_prompt")]
    if unread:
        lines += ["", f"**The task SFT model does not read its prompt on {', '.join(unread)}**, where GRPO trains: "
                  "a coverage change there is not about the prompt's answers."]
    return lines


def _embedding_line(m: dict) -> str:
    """How the density embedding places prompts: its neighbours' cluster purity and the paraphrase test."""
    if m.get("text_neighbour_purity") is None:
        return ""
    line = (f" The {m.get('embedding') or 'text'} embedding's neighbours share their item's cluster "
            f"{m['text_neighbour_purity']:.0%} of the time")
    pp = m.get("paraphrase_purity")
    if pp is None:
        return line + "."
    return line + (f"; the hand-written paraphrases (data/paraphrases.py: no template word, no cluster noun) find a "
                   f"nearest train prompt of their own cluster {pp:.0%} of the time (bar {PARAPHRASE_BAR:.0%}: "
                   f"**{'by meaning' if pp >= PARAPHRASE_BAR else 'not by meaning'}**).")


def _blind_cell(c: dict) -> str:
    text = f"{c['pass@1']:.3f} vs {'—' if c['blind'] is None else format(c['blind'], '.3f')}"
    return f"**{text}**" if c["reads_prompt"] else text


def _row(name: str, s: dict, ks: list[str]) -> str:
    a = s["all"]
    return (f"| {name} | " + " | ".join(f"{a[k]:.3f}" for k in ks) + f" | {a['coverage']:.2f} | {a['entropy']:.2f} | "
            f"{a['top_phrasing_share']:.2f} |")


def semantic_section(r: dict) -> list[str]:
    """Semantic diversity of the answers (a sentence encoder), shown only where it orders the temperature control."""
    s = r.get("semantic")
    if not s:
        return []
    c = s["control"]
    lines = ["", "## Semantic diversity (a sentence encoder)", ""]
    if not c["passed"]:
        return lines + [f"all-MiniLM-L6-v2's mean pairwise cosine distance between an item's answers does not order "
                        f"the task SFT model's temperatures (Spearman {c['rho']:+.2f}, bar {c['bar']:g}): not shown."]
    lines += [f"Mean pairwise cosine distance between an item's answers, embedded by all-MiniLM-L6-v2 (mean over "
              f"items): it orders the task SFT model's temperatures (Spearman {c['rho']:+.2f}, bar {c['bar']:g}). "
              "It reads the wording and the value together: lower = answers that say the same thing.", "",
              "| model | all | " + " | ".join(r["clusters"]) + " |", "|---|" + "---:|" * (len(r["clusters"]) + 1)]
    rows = [(f"task SFT, T={t}", v) for t, v in s["sft"].items()]
    for arm, a in s["arms"].items():
        per_seed = ", ".join(f"{x['all']:.3f}" for x in a["runs"])
        rows.append((f"{arm} (mean of {len(a['runs'])} seeds; per seed {per_seed})", a["mean"]))
    for name, v in rows:
        lines.append(f"| {name} | {v['all']:.3f} | " + " | ".join(f"{v[k]:.3f}" if k in v else "—"
                                                                  for k in r["clusters"]) + " |")
    return lines


def report(r: dict) -> str:
    """The markdown: what the task is, the frontier check, the manipulation check, then per-cluster tables."""
    ks = [k for k in r["sft"][next(iter(r["sft"]))]["all"] if k.startswith("pass@")]
    n = r["samples"]
    what = ("An answer is right when its first backticked value is in the item's set (\"Name a whole number greater "
            f"than 12 and less than 19.\": 13-18). coverage = distinct right answers per item (of {n} samples)")
    if r.get("source") == "gsm8k":
        what = ("The items are GSM8K's test problems; an answer is right when its first backticked value is the "
                f"number after the reference's `####`. With one right answer per item, coverage@{n} is pass@{n}: "
                "the frontier check asks whether GRPO loses pass@k at large k below the SFT model sampled cooler")
    title = "GSM8K word problems" if r.get("source") == "gsm8k" else "a checkable task with many right answers"
    lines = [f"# Task track: {title}", "",
             f"{r['items']} held-out items (per cluster {r['clusters']}), never trained on by any post-training stage; "
             f"{n} answers per item and model. {what}; entropy = of the right answers (bits); top phrasing = share of "
             "responses in the model's most common wording (the value blanked).", "",
             "## Collapse or sharpening? (the SFT model's temperature frontier)", "",
             "| model | " + " | ".join(ks) + f" | coverage@{n} | entropy | top phrasing |",
             "|---|" + "---:|" * (len(ks) + 3)]
    off = r.get("off_envelope", [])
    for t, s in r["sft"].items():
        lines.append(_row(f"task SFT, T={t}" + (" (off the envelope)" if float(t) in off else ""), s, ks))
    for arm, a in r["arms"].items():
        lines.append(_row(f"{arm} (mean of {len(a['runs'])} seeds, T={r['arm_temperature']})",
                          {"all": {**a["mean"]["all"]}}, ks))
    lines += ["", "The frontier is the SFT model's envelope: at each pass@1, the best coverage it reaches at that "
              "pass@1 or higher, between the temperatures' points a monotone cubic in temperature (eval/envelope.py); "
              "temperatures worse on both axes than another drop out. Gap = arm coverage − envelope coverage at the "
              "arm's pass@1, mean over seeds, 95% interval over eval items (bootstrap) and seeds. An arm below the "
              "envelope may only have drifted: it has collapsed by its reward when its gap lies beyond the "
              "shuffled-reward arm's, the interval of the difference under 0:", "",
              "| arm | reward | gap [95% CI] | per seed | gap − shuffled arm's [95% CI] | collapsed by the reward |",
              "|---|---|---:|---|---:|---|"]
    for arm, g in r["frontier_gap"].items():
        c = g.get("minus_control")
        vs = f"{c['gap']:+.3f} [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]" if c else "—"
        lines.append(f"| {arm} | {r['variants'][arm]['reward']} | {g['gap']:+.3f} [{g['ci_low']:+.3f}, "
                     f"{g['ci_high']:+.3f}] | {', '.join(f'{x:+.2f}' for x in g['per_seed'])} | {vs} | "
                     f"{'**yes**' if g.get('collapsed') else ('no' if c else '—')} |")
    outside = {a: g["outside_frontier"] for a, g in r["frontier_gap"].items() if g.get("outside_frontier")}
    if outside:
        lines += ["", "Runs whose pass@1 lies above the SFT model's highest are compared with that end (add cooler "
                  "temperatures to task.eval.temperatures to reach them): " + "; ".join(
                      f"{a} ({', '.join(f'{x:.3f}' for x in v)})" for a, v in outside.items()) + "."]
    lines += ["", collapse_verdict(r["frontier_gap"])]
    lines += curve_section(r) + blind_section(r)
    lines += semantic_section(r)
    lines += comparison_section(r)
    lines += ["", "## Manipulation check (density from the prompt text only)", ""]
    for arm, m in r["manipulation"].items():
        if m["against"] is None:
            lines.append(f"- {arm}: no uniform arm with the same reward to compare with.")
            continue
        lines.append(f"- {arm} vs {m['against']}: the weights move the cluster mix TV {m['weights_tv']:.3f} from "
                     f"uniform (bar {TV_BAR}); realised draws differ between the arms by TV "
                     f"{m['draws_tv_between_arms']:.3f}, between seeds of one arm by {m['draws_tv_between_seeds']:.3f}"
                     f" (bar: {SPREAD_FACTOR:g}x); cluster shares of the weights {m['shares_weights']}. "
                     f"**{'Passed' if m['passed'] else 'Failed'}**." + _embedding_line(m))
    lines += ["", "## Per cluster", "", "| model | cluster | pass@1 | coverage | entropy |", "|---|---|---:|---:|---:|"]
    models = [(f"task SFT, T={t}", s) for t, s in r["sft"].items()] + [(arm, a["mean"]) for arm, a in
                                                                       r["arms"].items()]
    for name, s in models:
        for cluster in r["clusters"]:
            if cluster in s:
                c = s[cluster]
                lines.append(f"| {name} | {cluster} | {c['pass@1']:.3f} | {c['coverage']:.2f} | {c['entropy']:.2f} |")
    lines += ["", "## Training (train items, checker = gold)", "",
              "| arm | reward start → end, per seed | gold pass start → end, per seed | KL end | rollouts (groups "
              "trained), per seed |", "|---|---|---|---|---|"]
    for arm, t in r["training"].items():
        pairs = lambda a, b: ", ".join(f"{x:+.2f} → {y:+.2f}" for x, y in zip(t[a], t[b]))  # noqa: E731
        spent = ", ".join(f"{n:,} ({g:,})" for n, g in zip(t.get("rollouts", []), t.get("groups_trained", []))
                          if n is not None)  # runs before rollouts were counted: blank
        lines.append(f"| {arm} | {pairs('reward_start', 'reward_end')} | {pairs('gold_pass_start', 'gold_pass_end')} "
                     f"| {', '.join(f'{k:.3f}' for k in t['kl_end'])} | {spent} |")
    lines += rm_section(r)
    return "\n".join(lines) + "\n"
