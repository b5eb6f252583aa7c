"""A download's progress: huggingface_hub's bar on a terminal, a plain line every so often in a log."""

from __future__ import annotations

import sys
import time

_EVERY_S = 10.0  # a log gets a line this often (and at 25/50/75/100%), never one per chunk


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class LineProgress:
    """The part of tqdm's interface huggingface_hub's http_get uses, written as lines a log keeps."""

    def __init__(self, *, total: int | None = None, initial: int = 0, desc: str = "", **_):
        self.total, self.n, self.desc = total, initial, desc
        self._last, self._quarter = time.monotonic(), self._quarters()
        self._line("resuming at" if initial else "starting")

    def _quarters(self) -> int:
        return 4 * self.n // self.total if self.total else 0

    def _line(self, what: str) -> None:
        of = f" of {_mib(self.total)}" if self.total else ""
        print(f"cllm: {self.desc}: {what} {_mib(self.n)}{of}", file=sys.stderr, flush=True)

    def update(self, n: int) -> None:
        self.n += n
        now, quarter = time.monotonic(), self._quarters()
        if quarter > self._quarter or now - self._last >= _EVERY_S:
            self._quarter, self._last = quarter, now
            self._line(f"{100 * self.n // self.total}%," if self.total else "at")

    def close(self) -> None:
        pass

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress_class():
    """What draws a download's progress here: None (huggingface_hub's own bar) on a terminal, else lines."""
    return None if sys.stderr.isatty() else LineProgress
