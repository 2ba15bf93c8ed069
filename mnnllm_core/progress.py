"""A one-line progress bar on stderr for long work (export, packing a large model's weights).

Drawn only on a terminal, and only once the work has taken `delay` seconds, so quick jobs
and logs piped to files stay clean. Until the work is done it says how long is left, at the
rate since its previous draw (a first step that was slow, such as compiling kernels, does not
stretch the estimate).
"""
from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, label: str, unit: str = "", scale: float = 1.0, delay: float = 0.0,
                 stream: TextIO | None = None, width: int = 30):
        self.total = max(total, 1)
        self.done = 0
        self.label, self.unit, self.scale = label, unit, scale
        self.stream = stream or sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.width = width
        self.start = time.perf_counter()
        self.delay = delay
        self.last = 0.0  # when the bar was last drawn
        self.drawn = False
        self.drawn_done = 0  # how much was done then

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if self.enabled and now - self.start >= self.delay and (now - self.last >= 0.1 or self.done >= self.total):
            self._draw(now)

    def _draw(self, now: float) -> None:
        frac = min(self.done / self.total, 1.0)
        bar = "#" * int(frac * self.width)
        amount = f"{self.done / self.scale:.1f}/{self.total / self.scale:.1f}{self.unit}" if self.scale != 1 \
            else f"{self.done}/{self.total}{self.unit}"
        elapsed = now - self.start
        left = ""
        if self.drawn and self.drawn_done < self.done < self.total:  # the rate since the last draw
            seconds = (now - self.last) / (self.done - self.drawn_done) * (self.total - self.done)
            left = f", ~{seconds:.0f}s left"
        self.last, self.drawn_done = now, self.done
        self.stream.write(f"\r{self.label} {frac:4.0%} |{bar:<{self.width}}| {amount} {elapsed:.1f}s{left}   ")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            self._draw(time.perf_counter())
            self.stream.write("\n")
            self.stream.flush()
