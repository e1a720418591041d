"""Running a Typer app in-process (a test, or another command's argv) as its command line would run it, without the
SystemExit(0) that Typer's standalone mode raises on success: speedrun's small command lines share this."""
from __future__ import annotations

import sys

import typer


def new_app(**settings) -> typer.Typer:
    """A one-command app: plain-text help (-h too), wrapped at 120 columns, tracebacks as Python prints them."""
    return typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False,
                       context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120, **settings})


def run_app(app: typer.Typer, argv: list[str] | None, prog_name: str) -> None:
    """Parse argv (default sys.argv[1:]) and run: returns on success, exits non-zero on a usage error (2, with
    Typer's message) or a non-zero exit code."""
    try:
        code = typer.main.get_command(app).main(argv, prog_name=prog_name, standalone_mode=False)
    except (typer.Exit, typer.Abort) as e:
        code = getattr(e, "exit_code", 1)
    except typer.exceptions.TyperException as e:  # typer >= 0.26 runs on its own click: its usage errors
        e.show()
        sys.exit(getattr(e, "exit_code", 2))
    if code:
        sys.exit(code)
