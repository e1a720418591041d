"""Progress of long loops: on a terminal a tqdm bar with rate and ETA (line logs printed above it); off a
terminal (DVC, CI, pipes) no bar, only the loops' line logs, as they always were. A loop without line logs of its
own (a k-NN over blocks) asks for `every` seconds: off a terminal it then prints its count, rate and time left that
often, so a long stage never runs silent."""
from __future__ import annotations

import sys
import time

from tqdm import tqdm


class Progress:
    def __init__(self, total: int, desc: str, initial: int = 0, unit: str = "step", enabled: bool | None = None,
                 every: float = 0.0):
        on = sys.stderr.isatty() if enabled is None else enabled
        self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, leave=False,
                        file=sys.stderr) if on else None
        self.total, self.desc, self.unit, self.every = total, desc, unit, every  # every: 0 = no heartbeat lines
        self.done, self.start = initial, time.monotonic()
        self.last = self.start

    def update(self, n: int = 1, **postfix: float | str) -> None:
        self.done += n
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(n)
        elif self.every > 0 and (now := time.monotonic()) - self.last >= self.every:
            self.last = now
            print(self.heartbeat(now), flush=True)

    def heartbeat(self, now: float) -> str:
        """`desc: done/total unit(s) (share), elapsed, about the time left` at the rate so far."""
        spent = now - self.start
        left = spent / max(self.done, 1) * (self.total - self.done)
        return (f"{self.desc}: {self.done:,}/{self.total:,} {self.unit}s ({self.done / max(self.total, 1):.0%}), "
                f"{spent / 60:.1f} min, about {left / 60:.1f} min left")

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
