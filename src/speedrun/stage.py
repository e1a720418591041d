"""The command line of a stage: `speedrun <stage> [--arm A --seed S | --cycle C] [-S key=value ...]` (Typer).

A stage declares READS (the params.yaml keys it reads: its dvc.yaml `params:`, `{arm}`-style placeholders filled
from its ids) and PATHS (its files, defaulting to the DVC layout). Run by hand with no options it does what
`dvc repro` does; `-S` overrides a key as `dvc exp run -S` does; `--help` lists every key it reads, by section, with
its help and value. Every key is checked before any work (speedrun.params)."""
from __future__ import annotations

import ast
import inspect
import os
import shutil
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional

import typer

from speedrun import params as params_lib
from speedrun.common import die_with_parent, keep_freed_memory
from speedrun.params import Params
from speedrun.typer_app import new_app, run_app

def check_ids(run_ids: dict[str, Any], p: Params, reads: tuple[str, ...] = ()) -> None:
    """A run id becomes part of output paths: letters, digits, '_' and '-' only; and an entry of the section the stage
    reads it from (`grpo.variants.{arm}` in READS: --arm names an entry of grpo.variants)."""
    for name, value in run_ids.items():
        if isinstance(value, str) and not params_lib.ID.fullmatch(value):
            sys.exit(f"error: --{name} {params_lib.cut(value)!r}: letters, digits, '_' and '-' only (it becomes an "
                     f"output path)")
        for section in (r.removesuffix(f".{{{name}}}") for r in reads if r.endswith(f".{{{name}}}")):
            if str(value) not in (known := params_lib.value_at(p, section)):
                sys.exit(f"error: --{name} {params_lib.cut(value)!r}: not one of {section} ({', '.join(known)})")


def stage_spec(path: Path) -> SimpleNamespace:
    """A stage module's docstring, READS, PATHS and IDS read from its source, not run: what a stage that only installs
    a result needs, without the imports (torch) of its training code."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    names = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
             if isinstance(t, ast.Name) and t.id in ("READS", "PATHS", "IDS")}
    ids = {ast.literal_eval(k): {"str": str, "int": int}[v.id] for k, v in zip(names["IDS"].keys, names["IDS"].values)
           } if "IDS" in names else None
    return SimpleNamespace(__name__=f"stages.{path.stem}", __file__=str(path), __doc__=ast.get_docstring(tree, False),
                           READS=ast.literal_eval(names["READS"]), PATHS=ast.literal_eval(names["PATHS"]), IDS=ids)


def reads_for(reads: tuple[str, ...], ids: dict[str, Any]) -> list[str]:
    return [r.format(**ids) for r in reads]


def describe(reads: list[str], p: Params, width: int | None = None) -> str:
    """The keys a stage reads, grouped by section: `key = value` and its help, wrapped at the terminal's width."""
    width = width or max(60, min(shutil.get_terminal_size((100, 24)).columns, 120))
    lines, section = [], None
    for r in reads:
        for k, f in ((k, f) for k, f in params_lib.leaves(Params) if k == r or k.startswith(r + ".")):
            head = k.rsplit(".", 1)[0] if "." in k else "(top level)"
            if head != section:
                lines.append(f"  [{head}]")
                section = head
            value = params_lib.cut(repr(params_lib.plain(params_lib.value_at(p, k))), 200)
            lines.append("    " + textwrap.shorten(f"{k} = {value}", width - 4, placeholder=" …"))
            lines += textwrap.wrap(f.metadata["help"], width, initial_indent=" " * 8, subsequent_indent=" " * 8)
    return "\n".join(lines)


BY_HAND = Path("scratch/by_hand")
TRACKED_OUTS = ("metrics", "report", "out_md", "fig_dir")  # the PATHS a stage writes under git-tracked reports/


def by_hand(args: dict[str, Any], paths: dict[str, str | list | None], ctx: typer.Context) -> None:
    """Run by hand (not by DVC, which sets DVC_STAGE), a stage writes its git-tracked reports under scratch/by_hand/
    unless the user names the file: a try-out never rewrites a committed metric."""
    if "DVC_STAGE" in os.environ:
        return
    for name, default in paths.items():
        given = getattr(ctx.get_parameter_source(name), "name", "") not in ("DEFAULT", "")
        if name in TRACKED_OUTS and str(default).startswith("reports/") and not given:
            args[name] = BY_HAND / args[name]
            print(f"by hand: --{name.replace('_', '-')} {args[name]} (pass --{name.replace('_', '-')} {default} to "
                  "write the tracked file)", flush=True)


def _signature(ids: dict[str, type], paths: dict[str, str | list | None]) -> inspect.Signature:
    """The stage command's options as a Python signature, which Typer turns into its command line."""
    kw = inspect.Parameter.KEYWORD_ONLY
    opts = [inspect.Parameter("ctx", kw, annotation=typer.Context)]
    opts += [inspect.Parameter(n, kw, annotation=t, default=typer.Option(..., f"--{n}", help="run id (a DVC foreach "
                              "or matrix key)")) for n, t in ids.items()]
    opts.append(inspect.Parameter("set", kw, annotation=list[str], default=typer.Option(
        [], "-S", "--set", metavar="KEY=VALUE",
        help="override a params.yaml key, as dvc exp run -S does (repeatable)")))
    opts.append(inspect.Parameter("params", kw, annotation=Optional[Path], default=typer.Option(
        None, "--params", help="params file (default: ./params.yaml)")))
    for name, default in paths.items():  # a list: several files (--pairs a.parquet --pairs b.parquet)
        many = isinstance(default, list)
        opts.append(inspect.Parameter(name, kw, annotation=list[Path] if many else Optional[Path], default=typer.Option(
            [Path(d) for d in default] if many else (Path(default) if default else None),
            f"--{name.replace('_', '-')}", show_default=False,
            help=f"default: {' '.join(default) if many else default or 'from params.yaml'}"
                 + (" (repeat the option for several files)" if many else ""))))
    return inspect.Signature(opts)


def stage_command(main: Callable[..., None], reads: tuple[str, ...], paths: dict[str, str | list | None],
                  ids: dict[str, type] | None = None) -> Callable[..., None]:
    """The Typer callback of a stage: load and check params.yaml (+ -S overrides), fill the paths, call main."""
    ids = ids or {}

    def command(ctx: typer.Context, **args: Any) -> None:
        run_ids = {name: args.pop(name) for name in ids}
        try:
            p = params_lib.load(args.pop("params"), args.pop("set"))
        except params_lib.ParamsError as e:
            sys.exit(f"error: {e}")
        check_ids(run_ids, p, reads)
        by_hand(args, paths, ctx)
        keep_freed_memory()  # large CPU tensors reuse freed memory instead of faulting in fresh pages
        as_path = lambda v: Path(str(v).format(**run_ids)) if v is not None else None  # noqa: E731
        io = SimpleNamespace(**{k: [as_path(x) for x in v] if isinstance(v, list) else as_path(v)
                                for k, v in args.items()})
        main(params_lib.StageView(p, reads_for(reads, run_ids)), io, **run_ids)

    command.__signature__ = _signature(ids, paths)
    command.__annotations__ = {q.name: q.annotation for q in command.__signature__.parameters.values()}
    return command


def run_stage(main: Callable[..., None], doc: str | None, reads: tuple[str, ...], paths: dict[str, str | list | None],
              ids: dict[str, type] | None = None, argv: list[str] | None = None, name: str | None = None) -> None:
    """Run one stage's command line (argv, default sys.argv[1:]); `--help` adds the params.yaml keys it reads."""
    if argv is None:  # a process of its own (`python -m stages.<name>`): it ends with what started it
        die_with_parent()
    argv = sys.argv[1:] if argv is None else list(argv)
    name = name or (main.__module__.rsplit(".", 1)[-1])
    app = new_app()
    app.command(name=name, help=doc)(stage_command(main, reads, paths, ids))
    run_app(app, argv, f"speedrun {name}")
    if "-h" in argv or "--help" in argv:
        try:
            p = params_lib.load(None)
        except (params_lib.ParamsError, FileNotFoundError) as e:
            sys.exit(f"\nerror: {params_lib.cut(str(e), 600)} (fix it to see the params.yaml keys this stage reads)")
        shown = [r.split(".{")[0] for r in reads]  # grpo.variants.{arm} -> grpo.variants
        print("\nparams.yaml keys read (committed value, help):\n" + describe(shown, p))
