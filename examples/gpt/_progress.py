"""Progress reporting on stderr: tqdm when it is installed and stderr is a terminal; otherwise
our own bar in a terminal, and in a log (stderr not a terminal: CI, the GPU machine) one plain
line per tenth of the run, so logs stay readable."""

from __future__ import annotations

import sys
import time


class _Bar:
    """A minimal bar: ``update(n, **postfix)``, ``close()``."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.n = total, desc, 0
        self.start = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.next_line = max(1, total // 10)
        self.postfix = ""

    def set_postfix(self, **values) -> None:
        self.postfix = " ".join(f"{k} {v}" for k, v in values.items())

    def update(self, n: int) -> None:
        self.n += n
        elapsed = time.perf_counter() - self.start
        rate = self.n / elapsed if elapsed > 0 else 0.0
        if self.tty:
            filled = int(30 * self.n / self.total)
            bar = "#" * filled + "." * (30 - filled)
            sys.stderr.write(f"\r{self.desc} [{bar}] {self.n}/{self.total} {rate:.1f} it/s {self.postfix}  ")
            sys.stderr.flush()
        elif self.n >= self.next_line or self.n == self.total:
            self.next_line += max(1, self.total // 10)
            sys.stderr.write(f"{self.desc} {self.n}/{self.total} {elapsed:.0f}s {self.postfix}\n")
            sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def progress(total: int, desc: str):
    """A bar over ``total`` steps with ``update(n)``, ``set_postfix(**kv)`` and ``close()``."""
    if sys.stderr.isatty():
        try:
            from tqdm import tqdm
        except ImportError:
            pass
        else:
            return tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True, leave=True)
    return _Bar(total, desc)
