"""Progress of long work (evaluation, conversion, caching, the harness): done of total,
a rate and an ETA. On a terminal, one line redrawn in place; elsewhere (CI, a log file)
one plain line per ``interval_s``, so logs stay readable, and a closing line when the
work took that long. The rate counts from the first ``advance`` (a compile before it is
not work done), the ETA divides what is left by it.

A leaf: the standard library only, so the services and commands that run long loops can
all take a meter. (Training's own line, with loss and MFU, is ``metrics_writer.Progress``.)
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

INTERVAL_S = 30.0  # seconds between lines when not on a terminal (T5XL_PROGRESS_INTERVAL_S)
REDRAW_S = 0.2  # seconds between redraws on a terminal


def duration(seconds: float) -> str:
    """``1:02:03``, ``02:03``; ``--:--`` when unknown."""
    if seconds != seconds or seconds == float("inf"):
        return "--:--"
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def amount(value: float) -> str:
    """``950``, ``12.3k``, ``4.5M``, ``1.2G``, ``3.4T``: counts, bytes and FLOPs alike."""
    for factor, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.1f}{suffix}"
    return f"{value:.0f}" if value == int(value) else f"{value:.2f}"


class Meter:
    """``label: done/total unit, rate unit/s, ETA`` for one loop of known size."""

    def __init__(self, label: str, total: float, unit: str = "examples",
                 stream: TextIO | None = None, interval_s: float | None = None,
                 clock=time.monotonic, from_first_advance: bool = True):
        """``from_first_advance``: the rate leaves out the work before the first advance
        (a compile); False counts from now (reading files, nothing to warm up)."""
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.interval_s = (float(os.environ.get("T5XL_PROGRESS_INTERVAL_S", INTERVAL_S))
                           if interval_s is None else interval_s)
        self.clock = clock
        self.done = 0.0
        self.started = clock()
        # (done, time) the rate counts from: after the first advance, or the start.
        self._first: tuple[float, float] | None = None if from_first_advance else (0.0,
                                                                                   self.started)
        self._last_line = self.started
        self._drawn = False

    def rate(self) -> float:
        """Work per second since the first advance (nan before two)."""
        if self._first is None:
            return float("nan")
        done, when = self._first
        elapsed = self.clock() - when
        return (self.done - done) / elapsed if elapsed > 0 and self.done > done else float("nan")

    def eta(self) -> float:
        rate = self.rate()
        return (self.total - self.done) / rate if rate == rate and rate > 0 else float("nan")

    def line(self) -> str:
        rate = self.rate()
        rate_text = "--" if rate != rate else amount(rate)
        percent = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        return (f"{self.label}: {amount(self.done)}/{amount(self.total)} {self.unit}{percent}, "
                f"{rate_text} {self.unit}/s, ETA {duration(self.eta())}")

    def advance(self, n: float = 1) -> None:
        self.done += n
        now = self.clock()
        if self._first is None:
            self._first = (self.done, now)
        if self.tty and now - self._last_line >= REDRAW_S:
            self.stream.write(f"\r{self.line()}\033[K")
            self._drawn, self._last_line = True, now
        elif not self.tty and now - self._last_line >= self.interval_s:
            self.stream.write(self.line() + "\n")
            self._drawn, self._last_line = True, now
        self.stream.flush()

    def close(self) -> None:
        """Ends the redrawn line; a closing line when the work took an interval or more."""
        elapsed = self.clock() - self.started
        if self._drawn or elapsed >= self.interval_s:
            per_s = self.done / elapsed if elapsed > 0 else float("nan")
            text = (f"{self.label}: {amount(self.done)} {self.unit} in {duration(elapsed)} "
                    f"({'--' if per_s != per_s else amount(per_s)} {self.unit}/s)")
            self.stream.write(f"\r{text}\033[K\n" if self.tty else text + "\n")
            self.stream.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Silent:
    """A meter that shows nothing (evaluation inside training, which has its own line)."""

    def __init__(self, *args, **kwargs):
        pass

    def advance(self, n: float = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass
