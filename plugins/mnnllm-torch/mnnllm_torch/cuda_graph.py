"""The CUDA-only layer of the torch replay: a recorded step captured as one CUDA graph.

Nothing else in the plugin touches CUDA graphs, and nothing here decides what the step is
(replay.py records it; the same step runs eagerly, and is tested, where there is no CUDA).
Capture follows torch's recipe: a few warm-up runs on a side stream (cuBLAS picks its
workspaces, lazy allocations happen), then the capture; the step is idempotent (it is a
function of its input tensors, the weights and the KV rows before `past`, and writes the same
rows again), so warming up with the current token's inputs changes nothing. A capture that
fails (an op torch cannot capture) logs a warning and leaves the step running eagerly.

This file could not be run where it was written (no CUDA there): see the plugin's README.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

log = logging.getLogger(__name__)

WARMUP_RUNS = 2


class CudaGraphStep:
    def __init__(self, step: Callable[[], None], device: torch.device):
        self.step, self.device = step, device
        self.graph: torch.cuda.CUDAGraph | None = None
        self.captures = 0
        self.failed = False

    def run(self, moved: bool) -> None:
        """One run of the step: the graph replayed, captured first when there is none yet or the
        tensors it was captured on moved."""
        if self.failed:
            self.step()
            return
        if self.graph is None or moved:
            self.capture()
            if self.failed:
                self.step()
                return
        self.graph.replay()

    def capture(self) -> None:
        self.graph = None
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
