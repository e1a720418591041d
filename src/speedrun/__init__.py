"""speedrun: a small, reproducible LLM post-training lab run as a DVC pipeline.

Started from a checkout of the lab (a folder holding dvc.yaml and src/speedrun/: the repository, or the copy that
`dvc exp run --queue` or `--temp` runs an experiment in), the package's modules come from that checkout's src/,
whichever tree the editable install names: a stage runs the code DVC hashed for it, however it was started
(`speedrun <stage>`, `python -m stages.<stage>`, a queue worker). Import plumbing only: it changes no output."""
from pathlib import Path as _Path


def _own_checkout() -> _Path | None:
    """The working directory's src/speedrun when it is a checkout of the lab other than this package's own."""
    try:
        own = _Path.cwd() / "src" / "speedrun"
    except FileNotFoundError:  # the working directory was removed
        return None
    if (own / "__init__.py").is_file() and (own.parents[1] / "dvc.yaml").is_file():
        own = own.resolve()
        return own if own != _Path(__file__).resolve().parent else None
    return None


if (_checkout := _own_checkout()) is not None:
    __path__[:] = [str(_checkout)]  # noqa: F821  (every speedrun.* submodule is found here from now on)
