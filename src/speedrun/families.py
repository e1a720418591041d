"""The declared families of density-versus-uniform comparisons across committed experiments (reports/experiments/).

    python -m speedrun.families            # print the index's family tables
    python -m speedrun.families --write    # replace them in reports/experiments/README.md

A family is a set of tests read together, with one correction across all of them: declared in
reports/experiments/families.yaml (name, correction, members as experiment folder + comparison key), never
inferred from results. The task family is Holm-corrected over every member's primary test as committed so far
(adding an experiment re-adjusts every member); the closed chat-track family is listed with the calls each
experiment made on its own (Holm within the experiment only), which is what the family's reader must discount.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml

from speedrun import kept
from speedrun.typer_app import new_app, run_app
from speedrun.common import write_text
from speedrun.eval.stats import ALPHA, holm

ROOT = Path("reports/experiments")
START, END = "<!-- families: python -m speedrun.families --write -->", "<!-- /families -->"
MARK = {"matched": "matched ", "same_temperature": "at T = 1 "}  # a task member's reading, where not the gap
VERDICT = {1: "diversity-raising", -1: "diversity-lowering", 0: "no call"}
app = new_app()


def _ci(v: float, lo: float, hi: float, digits: int = 3) -> str:
    return f"{v:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def chat_rows(root: Path, members: list[dict]) -> list[str]:
    """One row per chat-track member: its primaries' Δ [95% CI] and the call its own Holm made."""
    rows = ["| experiment | comparison | first primary: Δ [95% CI] | its own call (Holm within it) |",
            "|---|---|---|---|"]
    for m in members:
        if not m.get("primary"):
            raise SystemExit(f"{root / 'families.yaml'}: chat member {m['experiment']} names no primary (a list)")
        primary = m["primary"]
        r = kept.read_json(root / m["experiment"] / "metrics/diversity.json")[m["comparison"]]
        p0 = primary[0]
        calls = [f"{p} {VERDICT[int(r['verdict'][p])]}" for p in primary if int(r["verdict"][p])] or ["no call"]
        rows.append(f"| [{m['experiment']}]({m['experiment']}) | {m['comparison']} | {p0} "
                    f"{_ci(r['delta'][p0], r['ci_low'][p0], r['ci_high'][p0])} | {', '.join(calls)} |")
    return rows


def task_rows(root: Path, members: list[dict]) -> list[str]:
    """One row per task-track member: Δ on its primary (the frontier gap, or coverage at equal pass@1: matched)
    [95% CI], MDE, unadjusted p and Holm p over the whole family."""
    results = {}
    for m in members:
        path = root / m["experiment"] / "metrics/task.json"  # absent while the plan is committed and the run is not
        r = kept.read_json(path) if kept.exists(path) else None
        comp = r["comparisons"][m["comparison"]] if r else None
        reading = m.get("reading", comp.get("primary", "gap") if comp else "gap")  # a plan may fix another reading
        results[(m["experiment"], m["comparison"])] = comp and comp[reading] | {"reading": reading}
    adjusted = holm({f"{e}/{c}": g["p"] for (e, c), g in results.items() if g})
    rows = ["| experiment | comparison | Δ coverage beyond the frontier (at equal pass@1 or T = 1 where marked) "
            "[95% CI] | "
            "MDE (of the collapse) | p | family Holm p |", "|---|---|---|---:|---:|---:|"]
    for (e, c), g in results.items():
        if g is None:  # a run over upstream models is pooled (and read) only when every one is in
            subs = len(kept.glob(root / e, "sft_*/metrics/task.json"))
            state = f"running: {subs} upstream models kept, not pooled or read yet" if subs else "planned, not run yet"
            rows.append(f"| [{e}]({e}) | {c} | {state} | | | |")
            continue
        p = adjusted[f"{e}/{c}"]
        rows.append(f"| [{e}]({e}) | {c} | {MARK.get(g['reading'], '')}"
                    f"{_ci(g['value'], g['ci_low'], g['ci_high'])} | {g['mde']:.3f} "
                    f"({g['mde'] / g['collapse']:.0%}) | {g['p']:.3f} | {p:.3f}{' **called**' if p <= ALPHA else ''} |")
    return rows


def render(root: Path = ROOT) -> str:
    """The markdown of every declared family, in the order of families.yaml."""
    spec = yaml.safe_load((root / "families.yaml").read_text())
    lines = [START]
    for name, fam in spec.items():
        lines += ["", f"**{name}** ({fam['correction']}): {fam['about']}", ""]
        lines += (task_rows if fam["kind"] == "task" else chat_rows)(root, fam["members"])
    return "\n".join(lines + ["", END])


@app.command(help=__doc__.splitlines()[0])
def command(write: Annotated[bool, typer.Option(
        "--write", help="replace the family tables in reports/experiments/README.md")] = False) -> None:
    """Print the family tables, or with `write` replace them in reports/experiments/README.md."""
    text = render()
    if not write:
        print(text)
        return
    readme = ROOT / "README.md"
    old = readme.read_text()
    if START not in old or END not in old:
        raise SystemExit(f"{readme}: no '{START}' ... '{END}' section to replace")
    write_text(readme, old[:old.index(START)] + text + old[old.index(END) + len(END):])


def main(argv: list[str] | None = None) -> None:
    """`python -m speedrun.families` (argv: default sys.argv[1:]): returns on success, exits non-zero otherwise."""
    run_app(app, argv, "python -m speedrun.families")


if __name__ == "__main__":
    main()
