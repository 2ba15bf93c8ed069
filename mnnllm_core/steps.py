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
    if any(getattr(h, "mnnllm_steps", False) for h in STEPS.handlers):
        return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter("mnnllm: %(message)s"))
    handler.mnnllm_steps = True
    STEPS.addHandler(handler)
    STEPS.setLevel(logging.INFO)
    STEPS.propagate = False
