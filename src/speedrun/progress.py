"""Progress of long loops: on a terminal a tqdm bar with rate and ETA (line logs printed above it); off a
terminal (DVC, CI, pipes) no bar, only the loops' line logs, as they always were."""
from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    def __init__(self, total: int, desc: str, initial: int = 0, unit: str = "step", enabled: bool | None = None):
        on = sys.stderr.isatty() if enabled is None else enabled
        self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, leave=False,
                        file=sys.stderr) if on else None

    def update(self, n: int = 1, **postfix: float | str) -> None:
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(n)

    def log(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
