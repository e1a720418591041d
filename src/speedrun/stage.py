"""The command line of a stage: `python -m stages.<name> [--variant V --seed S | --cycle C] [-S key=value ...]`.

A stage declares READS (the params.yaml keys it reads: its dvc.yaml `params:`, `{variant}`-style placeholders filled
from its ids) and PATHS (its files, defaulting to the DVC layout). Run by hand with no options it does what
`dvc repro` does; `-S` overrides a key as `dvc exp run -S` does; `--help` lists every key it reads with its help and
value. Every key is checked before any work (speedrun.params)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from speedrun import params as params_lib
from speedrun.common import keep_freed_memory
from speedrun.params import Params


# a run id names an entry of one of these sections
ID_SECTIONS = {"variant": "grpo.variants", "arm": "task.variants", "cycle": "adversarial.cycles"}


def check_ids(run_ids: dict[str, Any], p: Params) -> None:
    """A run id becomes part of output paths: letters, digits, '_' and '-' only, and an entry of its section."""
    for name, value in run_ids.items():
        if isinstance(value, str) and not params_lib.ID.fullmatch(value):
            sys.exit(f"error: --{name} {value!r}: letters, digits, '_' and '-' only (it becomes an output path)")
        if name in ID_SECTIONS and str(value) not in (known := params_lib.value_at(p, ID_SECTIONS[name])):
            sys.exit(f"error: --{name} {value!r}: not one of {ID_SECTIONS[name]} ({', '.join(known)})")


def reads_for(reads: tuple[str, ...], ids: dict[str, Any]) -> list[str]:
    return [r.format(**ids) for r in reads]


def describe(reads: list[str], p: Params) -> str:
    """One line per key the stage reads: key = value  help."""
    lines = []
    for r in reads:
        keys = [(k, f) for k, f in params_lib.leaves(Params) if k == r or k.startswith(r + ".")]
        for k, f in keys:
            lines.append(f"  {k} = {params_lib.plain(params_lib.value_at(p, k))!r}\n      {f.metadata['help']}")
    return "\n".join(lines)


def run_stage(main: Callable[..., None], doc: str | None, reads: tuple[str, ...], paths: dict[str, str | None],
              ids: dict[str, type] | None = None, argv: list[str] | None = None) -> None:
    """Parse the command line, load and check params.yaml (+ -S overrides), call main(p, io, **ids)."""
    ids = ids or {}
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     add_help=False)
    parser.add_argument("-h", "--help", action="store_true", help="show this help, with every params key read")
    for name, kind in ids.items():
        parser.add_argument(f"--{name}", type=kind, required=True, help="run id (of a foreach or of stages.runs)")
    parser.add_argument("-S", "--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a params.yaml key, as dvc exp run -S does (repeatable)")
    parser.add_argument("--params", type=Path, default=None, help="params file (default: ./params.yaml)")
    for name, default in paths.items():  # a list: several files (--pairs a.parquet b.parquet)
        parser.add_argument(f"--{name.replace('_', '-')}", type=Path, default=default,
                            nargs="+" if isinstance(default, list) else None,
                            help=f"default: {default}" if default else "default: from params.yaml")
    if "-h" in argv or "--help" in argv:
        parser.print_help()
        try:
            p = params_lib.load(None)
        except (params_lib.ParamsError, FileNotFoundError) as e:
            sys.exit(f"\nerror: {e} (fix it to see the params.yaml keys this stage reads)")
        shown = [r.split(".{")[0] for r in reads]  # grpo.variants.{variant} -> grpo.variants
        print("\nparams.yaml keys read (committed value, help):\n" + describe(shown, p))
        return
    args = vars(parser.parse_args(argv))
    run_ids = {name: args.pop(name) for name in ids}
    try:
        p = params_lib.load(args.pop("params"), args.pop("set"))
    except params_lib.ParamsError as e:
        sys.exit(f"error: {e}")
    args.pop("help")
    check_ids(run_ids, p)
    keep_freed_memory()  # large CPU tensors reuse freed memory instead of faulting in fresh pages
    as_path = lambda v: Path(str(v).format(**run_ids)) if v is not None else None  # noqa: E731
    io = SimpleNamespace(**{k: [as_path(x) for x in v] if isinstance(v, list) else as_path(v) for k, v in args.items()})
    main(params_lib.StageView(p, reads_for(reads, run_ids)), io, **run_ids)
