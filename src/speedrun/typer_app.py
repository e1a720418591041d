"""Running a Typer app in-process (a test, or another command's argv) as its command line would run it, without the
SystemExit(0) that Typer's standalone mode raises on success: speedrun's small command lines share this."""
from __future__ import annotations

import os
import sys

import typer

from speedrun.common import UserError

TRACEBACK_ENV = "SPEEDRUN_TRACEBACK"
FAILURE_HELP = (f"A failure you can fix (a file, a checkpoint, a setting) prints one line, 'error: ...', and exits 1; "
                f"{TRACEBACK_ENV}=1 prints its traceback too.")
FILE_ERRORS = (UserError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


class _App(typer.Typer):
    def command(self, *args, **kwargs):  # every command's --help ends with how failures print
        kwargs.setdefault("epilog", FAILURE_HELP)
        return super().command(*args, **kwargs)


def one_line(e: BaseException) -> str:
    """A user's failure as one line: an OS error's file and reason, else the message with its line breaks folded."""
    if isinstance(e, OSError) and e.filename is not None:
        return f"{e.filename}: {e.strerror or e}"
    return " ".join(str(e).split())


def new_app(**settings) -> typer.Typer:
    """A one-command app: plain-text help (-h too), wrapped at 120 columns, tracebacks as Python prints them."""
    return _App(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False,
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
    except FILE_ERRORS as e:  # what the user can fix: one line, not a traceback (unless asked for)
        if os.environ.get(TRACEBACK_ENV):
            raise
        sys.exit(f"error: {one_line(e)}")
    if code:
        sys.exit(code)
