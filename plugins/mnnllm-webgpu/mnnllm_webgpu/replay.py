"""The webgpu replay (Backend.on_record): a resized pipeline's steps kept as they are, encoded
into one command encoder and submitted once per token."""
from __future__ import annotations

from mnnllm_core.backend_api import Replay


class WebGPUReplay(Replay):
    """WebGPU command buffers are single-use, so what is recorded once is everything but the
    encoding: every Program's pipeline, bind group and uniform parameters, the copies. Per token:
    every `before_run()` (Attention: the KV bookkeeping and past/total written to its step buffer),
    the steps encoded into the backend's recorder (a few wgpu calls per dispatch, no allocation),
    one submit at on_execute_end. A step that is not a device step (an Execution's default
    on_execute) is called, and encodes into the same recorder."""

    def __init__(self, backend, commands):
        super().__init__(commands)
        self.backend = backend
        self.steps: list = []

    def record(self, steps: list) -> None:
        self.steps = steps

    def play(self) -> None:
        recorder = self.backend.recorder
        for step in self.steps:
            if hasattr(step, "record"):
                recorder.run(step)
            else:
                step()
