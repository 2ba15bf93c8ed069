"""The contract every backend implements: RuntimeCreator -> Runtime -> Backend -> Execution.

Names follow MNN's `Backend.hpp` in snake_case. A backend author subclasses these, registers
op creators on the backend, and exposes a `RuntimeCreator` through the `mnnllm` plugin hooks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .op import Op
from .tensor import Tensor


@dataclass
class BackendConfig:
    """MNN's BackendConfig: how hard and how precisely a backend should work."""

    precision: str = "normal"  # low | normal | high
    memory: str = "normal"  # low | normal | high
    power: str = "normal"  # low | normal | high


@dataclass
class ScheduleConfig:
    """MNN's ScheduleConfig: which backend, how many threads, and the backup backend."""

    backend_type: str = "cpu"
    thread_num: int = 4
    backup_type: str = "cpu"
    backend_config: BackendConfig = field(default_factory=BackendConfig)


class Execution:
    """One op on one backend: resize when shapes change, execute every run.

    `packed_bytes`: bytes of packed weights one run reads (the decode roofline adds them up).
    """

    packed_bytes = 0

    def __init__(self, backend: "Backend"):
        self.backend = backend

    def on_resize(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> None:
        """Prepare for these shapes (scratch buffers, kernel arguments)."""

    def on_execute(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> None:
        raise NotImplementedError

    def on_clone(self, backend: "Backend", op: Op) -> "Execution | None":
        """A twin for another session that shares packed weights; None if unsupported."""
        return None


OpCreator = Callable[["Backend", Sequence[Tensor], Sequence[Tensor], Op], "Execution | None"]


class Backend:
    """Per-session memory and op creation on one device.

    `creators` maps an MNN op type name (e.g. "Convolution", "Raster") to a function
    returning an Execution, or None when this backend cannot run that op as given;
    the pipeline then runs it on the backup cpu backend and inserts the copies.
    """

    name = "abstract"

    def __init__(self, runtime: "Runtime", config: BackendConfig):
        self.runtime = runtime
        self.config = config
        self.creators: dict[str, OpCreator] = dict(runtime.op_creators)

    # -- op creation -------------------------------------------------------------
    def on_create(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor], op: Op) -> Execution | None:
        creator = self.creators.get(op.type)
        return None if creator is None else creator(self, inputs, outputs, op)

    # -- memory ------------------------------------------------------------------
    def on_acquire_buffer(self, tensor: Tensor) -> None:
        raise NotImplementedError

    def on_release_buffer(self, tensor: Tensor) -> None:
        """The tensor's storage may be reused by a later tensor of this resize."""

    def on_clear_buffer(self) -> None:
        """Drop every dynamic buffer (before a new resize)."""

    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        """Host -> this backend's storage of `tensor`."""
        raise NotImplementedError

    def download(self, tensor: Tensor) -> np.ndarray:
        """This backend's storage of `tensor` -> a host array of tensor.shape."""
        raise NotImplementedError

    def on_copy_buffer(self, src: Tensor, dst: Tensor) -> None:
        """Copy between backends; the default goes through the host."""
        dst.backend.upload(dst, src.backend.download(src))

    # -- phases ------------------------------------------------------------------
    def on_resize_begin(self) -> None:
        pass

    def on_resize_end(self) -> None:
        pass

    def on_execute_begin(self) -> None:
        pass

    def on_execute_end(self) -> None:
        pass


class Runtime:
    """Shared device state (contexts, queues, kernel caches) for every backend it creates."""

    name = "abstract"
    static_shapes = False

    def __init__(self, config: ScheduleConfig, hints: dict[str, Any] | None = None):
        self.config = config
        self.hints: dict[str, Any] = dict(hints or {})
        self.op_creators: dict[str, OpCreator] = {}

    def create_backend(self, config: BackendConfig) -> Backend:
        raise NotImplementedError

    def gc(self, level: int = 0) -> None:
        """Release cached memory; higher levels release more."""

    def device_name(self) -> str:
        return self.name


class RuntimeCreator:
    """Entry point of a backend: probes the device and creates the Runtime."""

    name = "abstract"
    static_shapes = False

    def is_available(self) -> tuple[bool, str]:
        """(True, "") when a tiny kernel really built and ran; else (False, why)."""
        raise NotImplementedError

    def create(self, config: ScheduleConfig, hints: dict[str, Any] | None = None) -> Runtime:
        raise NotImplementedError

    def devices(self) -> list[str]:
        return []
