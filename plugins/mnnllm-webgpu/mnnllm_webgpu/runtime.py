"""The webgpu backend: RuntimeCreator (probe), Runtime (adapter, device), Backend (buffers, host
copies, the per-run command encoder). wgpu is imported lazily (device.py), so importing this
module never touches a driver.

Runtime hints (optional): "webgpu_adapter": an adapter index or a power preference (device.py);
"webgpu_linear_lanes": invocations sharing an output row in the 4-bit linear kernels, 1 or 8
(default: 1 on a CPU adapter such as lavapipe, which runs a work-group's invocations as SIMD
lanes, reads storage buffers lane by lane and pays for barriers: the codes as textures,
linear_q4_texel*.wgsl, sixteen rows an invocation; 8 on a GPU: linear_q4.wgsl); "webgpu_subgroups" (default: whether the adapter has
the "subgroup" feature): the 8 lanes summed by subgroup shuffles, false: through workgroup memory.

A run encodes every dispatch of this backend into one command encoder (the Recorder), submitted
at on_execute_end; any host access to a buffer in between (a copy to or from cpu around a
fallback op, an upload, a download) first submits what was encoded. A pipeline wholly on webgpu
is replayed (replay.py): its steps made once per resize, encoded and submitted once per token.
Storage and arithmetic are fp32 (the shared model's reference tokens are fp32's); int32 tensors
are stored as they are on the host.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mnnllm_core.backend_api import (Backend, BackendConfig, ConfigError, Runtime, RuntimeCreator, RuntimeHints,
                                     ScheduleConfig, Tensor)

LINEAR_LANES = (1, 8)


@dataclass(frozen=True)
class WebGPUHints(RuntimeHints):
    """"webgpu_adapter", "webgpu_linear_lanes", "webgpu_subgroups" (the module docstring); None: the
    adapter decides."""

    webgpu_adapter: int | str | None = None
    webgpu_linear_lanes: int | None = None
    webgpu_subgroups: bool | None = None


class WebGPUBackend(Backend):
    """Storage of a tensor is a wgpu storage buffer of its bytes (rounded up to 4)."""

    name = "webgpu"

    def __init__(self, runtime: "WebGPURuntime", config: BackendConfig):
        super().__init__(runtime, config)
        self.device = runtime.device
        self.allocator = runtime.allocator
        self.recorder = runtime.recorder

    def fits(self, *tensors: Tensor) -> bool:
        """Whether every tensor fits one storage binding (max_storage_buffer_binding_size)."""
        return all(self.device.fits(t.size * t.dtype.itemsize) for t in tensors)

    def buffer_key(self, tensor: Tensor) -> int:
        return max(4, tensor.size * tensor.dtype.itemsize)

    def alloc(self, tensor: Tensor):
        return self.allocator.alloc(self.buffer_key(tensor))

    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        self.recorder.flush()
        self.allocator.copyin(tensor.storage, np.asarray(array, dtype=tensor.dtype))

    def download(self, tensor: Tensor) -> np.ndarray:
        self.recorder.flush()
        nbytes = tensor.size * tensor.dtype.itemsize
        return self.allocator.copyout(tensor.storage, nbytes).view(tensor.dtype).reshape(tensor.shape)

    def on_copy_buffer(self, src: Tensor, dst: Tensor) -> None:
        other = src.backend
        if isinstance(other, WebGPUBackend) and other.device is self.device:
            self.recorder.copy(dst.storage, src.storage, dst.size * dst.dtype.itemsize)
        else:
            self.upload(dst, other.download(src))

    def on_execute_end(self) -> None:
        self.recorder.flush()

    def on_record(self, commands):
        from .replay import WebGPUReplay
        return WebGPUReplay(self, commands)


class WebGPURuntime(Runtime):
    """One adapter's device, one Recorder shared by the backends it creates."""

    name = "webgpu"
    hints_type = WebGPUHints

    def __init__(self, config: ScheduleConfig, hints: RuntimeHints | dict[str, Any] | None = None):
        super().__init__(config, hints)
        from . import device
        from .ops import CREATORS
        self.device = device.open_device(device.device_spec(self.hints.webgpu_adapter))
        self.allocator = device.Allocator(self.device)
        self.recorder = device.Recorder(self.device)
        self.linear_lanes = self.hints.webgpu_linear_lanes or (1 if self.device.is_cpu else 8)
        if self.linear_lanes not in LINEAR_LANES:
            raise ConfigError(f"webgpu_linear_lanes must be one of {LINEAR_LANES}, got {self.linear_lanes!r}",
                              field="backend_hints.webgpu_linear_lanes")
        can = self.device.subgroups
        self.subgroups = can and (self.hints.webgpu_subgroups is not False)
        self.op_creators.update(CREATORS)

    def create_backend(self, config: BackendConfig) -> WebGPUBackend:
        return WebGPUBackend(self, config)

    def device_name(self) -> str:
        return self.device.description


class WebGPURuntimeCreator(RuntimeCreator):
    """fp32 storage and arithmetic whatever precision says; 4- and 8-bit weights packed whatever
    memory says; the adapter schedules its own invocations, so thread_num has no meaning."""

    name = "webgpu"
    static_shapes = True
    hints_type = WebGPUHints

    def is_available(self) -> tuple[bool, str]:
        """Compiles and runs the probe kernel on the selected adapter; never raises."""
        return self.probe_device_module(device_module, "wgpu", "wgpu found no adapter",
                                        install="pip install wgpu")

    def create(self, config: ScheduleConfig, hints: RuntimeHints | dict[str, Any] | None = None) -> WebGPURuntime:
        return WebGPURuntime(config, hints)

    def list_devices(self) -> list[str]:
        return device_module().list_devices()


def device_module():
    """device.py, which imports wgpu (hence only when the backend is probed or used)."""
    from . import device
    return device
