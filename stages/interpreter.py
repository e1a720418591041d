"""Stage interpreter (always runs, ~0.5 s): data/interpreter.json, the Python version and a digest of the stdlib
files the corpus stage reads. The corpus stage depends on it, so another Python reruns the corpus (and then only
the stages its changed outputs feed); the same Python leaves the file, and so every stage, as it was."""
from pathlib import Path

import typer

from speedrun.data.stdlib import write_fingerprint


def main(out: Path = typer.Option(Path("data/interpreter.json"), help="fingerprint JSON")) -> None:
    fp = write_fingerprint(out)
    print(f"interpreter: {fp['implementation']} {fp['python']}, {fp['stdlib_files']} stdlib files, "
          f"digest {fp['stdlib_digest']}")


if __name__ == "__main__":
    typer.run(main)
