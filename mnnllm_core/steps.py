"""Announcements of long steps (exporting, downloading, compiling kernels, packing weights,
creating pipelines): one line before the step with what it does and how long it should take, so
the first minute of a cold start is never silent.

They go to the `mnnllm.steps` logger at INFO. The `mnnllm` command shows them on stderr as
`mnnllm: ...` (`show_steps`); a program using the library sees them with
`logging.basicConfig(level=logging.INFO)`, or not at all.
"""
from __future__ import annotations

import logging
import sys
from typing import TextIO

STEPS = logging.getLogger("mnnllm.steps")


def announce(message: str) -> None:
    """Say, before it starts, what a long step does (with its expected duration in the text)."""
    STEPS.info("%s", message)


def show_steps(stream: TextIO | None = None) -> None:
    """Print announcements on `stream` (stderr) as `mnnllm: ...`, whatever the root logger's
    level; they are not passed on to the root logger too."""
    if any(isinstance(h, _StepsHandler) for h in STEPS.handlers):
        return
    handler = _StepsHandler(stream)
    handler.setFormatter(logging.Formatter("mnnllm: %(message)s"))
    STEPS.addHandler(handler)
    STEPS.setLevel(logging.INFO)
    STEPS.propagate = False


class _StepsHandler(logging.Handler):
    """Writes to `stream`, else to whatever sys.stderr is when a line is written (not the one at
    install time: a caller that swaps stderr, as pytest's capture or a host application does, still
    gets the lines, and a closed old stream is never written to)."""

    def __init__(self, stream: TextIO | None):
        super().__init__()
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = self.stream or sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # logging's own policy: a handler never raises into the caller
            self.handleError(record)
