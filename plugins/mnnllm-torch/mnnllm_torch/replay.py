"""Record and replay of a resized pipeline on torch (`TorchBackend.on_record` -> TorchReplay).

The recorded step is the pipeline's commands as a flat list of device-only calls: each
Execution's `compute()` when it has one (Attention: the KV bookkeeping is split off into
`before_run()`), else its `on_execute` bound to its tensors. Per run, every `before_run()`
(host bookkeeping and a small write of the KV lengths into device tensors), then the step:

  "graph"  (the default on a CUDA device) the step captured once as a CUDA graph and replayed:
           one launch per token instead of hundreds; captured again when a KV cache moved to
           larger tensors (a new shape is a new resize, hence a new replay). cuda_graph.py holds
           the CUDA-only part.
  "eager"  the same step run call by call, on any device: what "graph" captures, runnable (and
           tested against the per-op loop) where there is no CUDA.

Pipeline inputs (positions, the mask, the embeddings) are uploaded into the tensors the step
reads before each run, so nothing per token is ever recorded into the step.
"""
from __future__ import annotations

import logging
from functools import partial
from typing import Callable

from mnnllm_core.backend_api import Replay

log = logging.getLogger(__name__)


class TorchReplay(Replay):
    def __init__(self, backend, commands, graph: bool):
        executions = [c.execution for c in commands]
        self.stepped = [e for e in executions if hasattr(e, "before_run")]
        self.calls: list[Callable[[], None]] = [_device_call(c) for c in commands]
        blocking = [type(e).__name__ for e in executions if not getattr(e, "capturable", True)]
        self.graph = None
        if graph and blocking:
            log.info("torch replay runs eagerly: %s cannot be captured in a CUDA graph", ", ".join(sorted(set(blocking))))
        elif graph:
            from .cuda_graph import CudaGraphStep
            self.graph = CudaGraphStep(self.step, backend.device)

    def step(self) -> None:
        """The recorded step, call by call (what a CUDA graph captures)."""
        for call in self.calls:
            call()

    def run(self) -> None:
        moved = False
        for execution in self.stepped:
            moved = execution.before_run() or moved
        if self.graph is None:
            self.step()
        else:
            self.graph.run(moved)


def _device_call(command) -> Callable[[], None]:
    """What the step runs for one command: its `compute()` (device work only) or its on_execute."""
    execution = command.execution
    compute = getattr(execution, "compute", None)
    return compute if compute is not None else partial(execution.on_execute, command.inputs, command.outputs)
