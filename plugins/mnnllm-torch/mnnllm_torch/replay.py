"""Record and replay of a resized pipeline on torch (`TorchBackend.on_record` -> TorchReplay).

The core's walk (Replay) gives the step: every Execution's `replay_steps()`, each a device-only
call (Attention's `compute`: its KV bookkeeping is its `before_run()`; any other op's
on_execute bound to its tensors). Per run, every `before_run()` (host bookkeeping and a small
write of the KV lengths into device tensors), then the step:

  "graph"  (the default on a CUDA device) the step captured once as a CUDA graph and replayed:
           one launch per token instead of hundreds; captured again when a KV cache moved to
           larger tensors (a new shape is a new resize, hence a new replay). cuda_graph.py holds
           the CUDA-only part. An Execution that is not `capturable` keeps the step eager.
  "eager"  the same step run call by call, on any device: what "graph" captures, runnable (and
           tested against the per-op loop) where there is no CUDA.

Pipeline inputs (positions, the mask, the embeddings) are uploaded into the tensors the step
reads before each run, so nothing per token is ever recorded into the step.
"""
from __future__ import annotations

import logging
from typing import Callable

from mnnllm_core.backend_api import Replay

log = logging.getLogger(__name__)


class TorchReplay(Replay):
    def __init__(self, backend, commands, graph: bool):
        super().__init__(commands)
        self.calls: list[Callable[[], None]] = []
        self.fresh = False  # recorded since the last run: a graph captures again
        blocking = [type(c.execution).__name__ for c in self.commands if not c.execution.capturable]
        self.graph = None
        if graph and blocking:
            log.info("torch replay runs eagerly: %s cannot be captured in a CUDA graph", ", ".join(sorted(set(blocking))))
        elif graph:
            from .cuda_graph import CudaGraphStep
            self.graph = CudaGraphStep(self.step, backend.device)

    def record(self, steps: list) -> None:
        self.calls, self.fresh = steps, True

    def step(self) -> None:
        """The recorded step, call by call (what a CUDA graph captures)."""
        for call in self.calls:
            call()

    def play(self) -> None:
        if self.graph is None:
            self.step()
        else:
            self.graph.run(self.fresh)
        self.fresh = False
