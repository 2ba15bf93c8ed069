"""The opencl backend's replay (Backend.on_record): a resized pipeline as one flat list of
enqueues bound once."""
from __future__ import annotations

from typing import Any, Callable

from mnnllm_core.backend_api import Replay

from .device import Program


class OpenCLReplay(Replay):
    """The pipeline's steps (Replay.walk) as one flat list of enqueue calls, bound at the first
    run: a kernel's enqueue with its sizes (`Program.bound`), a copy, or an Execution's
    on_execute run in place (Attention, whose run does the KV bookkeeping). Linear layers give
    q and k, and gate and up with the MUL_SILU after them, as one kernel where `fused_with`
    allows it (pocl pays per kernel). `steps` is the list before binding."""

    def __init__(self, queue, commands):
        super().__init__(commands)
        self.queue = queue
        self.steps: list = []
        self.calls: list[Callable[[], Any]] = []

    @property
    def gated(self) -> int:
        """Of the pairs of linear layers enqueued as one kernel, those with their MUL_SILU."""
        return self.fused[2]

    def record(self, steps: list) -> None:
        self.steps = steps
        calls = (step.bound(self.queue) if isinstance(step, Program) else step for step in steps)
        self.calls = [call for call in calls if call is not None]  # an empty kernel has no call

    def play(self) -> None:
        for call in self.calls:
            call()
