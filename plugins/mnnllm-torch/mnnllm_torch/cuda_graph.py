"""The CUDA-only layer of the torch replay: a recorded step captured as one CUDA graph.

Nothing else in the plugin touches CUDA graphs, and nothing here decides what the step is
(replay.py records it; the same step runs eagerly, and is tested, where there is no CUDA).
A recording's first run (and the first after its tensors moved) runs eagerly, so a step
that runs once (a prefill of a new length) is never captured; the second run captures (after a
warm-up run on a side stream, torch's recipe: cuBLAS picks its workspaces, lazy allocations
happen) and replays, and every later run only replays. The step is idempotent (a function of
its input tensors, the weights and the KV rows before `past`; it writes the same rows again), so
the warm-up changes nothing. A capture that fails (an op torch cannot capture) logs a warning
and leaves the step running eagerly.

This file could not be run where it was written (no CUDA there): see the plugin's README.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

log = logging.getLogger(__name__)

WARMUP_RUNS = 1


class CudaGraphStep:
    def __init__(self, step: Callable[[], None], device: torch.device):
        self.step, self.device = step, device
        self.graph: torch.cuda.CUDAGraph | None = None
        self.warm = False  # the step ran once since it was recorded or its tensors moved
        self.captures = 0
        self.failed = False

    def run(self, moved: bool) -> None:
        """One run of the step: eager the first time, captured the second, replayed after."""
        if moved:
            self.graph, self.warm = None, False
        if self.graph is None:
            if self.failed or not self.warm:
                self.step()
                self.warm = True
                return
            self.capture()
            if self.graph is None:
                self.step()
                return
        self.graph.replay()

    def capture(self) -> None:
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self.step()
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.step()
        except Exception as err:  # whatever torch raises for an op it cannot capture
            log.warning("torch replay: the step cannot be captured as a CUDA graph (%s: %s); it runs eagerly",
                        type(err).__name__, err)
            self.failed = True
            return
        self.graph = graph
        self.captures += 1
