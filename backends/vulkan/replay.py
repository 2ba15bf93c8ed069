"""The vulkan backend's replay (Backend.on_record): a resized pipeline as one reusable command
buffer."""
from __future__ import annotations

from mnnllm_core.backend_api import Replay

from .device import Program, Recorder


class VulkanReplay(Replay):
    """A resized pipeline as one reusable command buffer. Per token: every `before_run()`
    (Attention: the KV bookkeeping, past/total into its step buffer); when one says its
    buffers moved (the cache grew) the buffer is recorded again; then one submit, waited for
    at on_execute_end. A step is a Program, recorded as it is, or a callable run while this
    replay's recorder stands in for the backend's (an on_execute, which here only records).
    Two consecutive linear layers on one input (q and k, gate and up) are one dispatch where
    `fused_with` allows it (lavapipe pays ~25 us per dispatch). `backend`: the VulkanBackend
    (runtime.py) whose recorder this replay stands in for while recording."""

    def __init__(self, backend, commands):
        super().__init__(commands)
        self.backend = backend
        self.recorder = Recorder(backend.device, reusable=True)

    def record(self, steps: list) -> None:
        self.recorder.reset()
        shared, self.backend.recorder = self.backend.recorder, self.recorder
        try:
            for step in steps:
                if isinstance(step, Program):
                    self.recorder.dispatch(step)
                else:
                    step()
        finally:
            self.backend.recorder = shared
        self.recorder.end()

    def play(self) -> None:
        self.backend.recorder.flush()  # what a growing cache recorded: its old rows copied over
        self.recorder.submit(wait=False)
        self.backend.replaying = self.recorder  # on_execute_end (or a host access) waits
