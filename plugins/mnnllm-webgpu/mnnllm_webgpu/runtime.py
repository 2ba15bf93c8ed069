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
Activations and arithmetic are fp32 (the shared model's reference tokens are fp32's); int32
tensors are stored as they are on the host.

fp16 storage, where the adapter has "shader-f16" (the device is opened with it; lavapipe has it):
fp16 weights of unquantized linears stay fp16 on the device at any precision (f16 -> f32 is exact,
so the results are fp32's bit for bit); precision "low" also stores fp32 unquantized weights as
fp16 and keeps the KV cache fp16; the hint "kv_fp16" (every backend's) keeps the KV cache fp16 at
any precision. Without shader-f16 all of it stays fp32, and a request for it is logged as ignored.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from mnnllm_core.backend_api import (Backend, BackendConfig, ConfigError, KVFormat, Runtime, RuntimeCreator,
                                     RuntimeHints, ScheduleConfig, Tensor)

log = logging.getLogger(__name__)

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
        f16, low = self.device.f16, config.precision == "low"
        self.f16_weights = f16  # fp16 weights kept fp16; fp32 ones too under precision "low"
        self.f16_lossy = f16 and low
        self.kv_format = KVFormat("fp16" if f16 and (low or runtime.hints.kv_fp16) else "float")
        if not f16 and (low or runtime.hints.kv_fp16):
            runtime.report_no_f16(config.precision)

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

    def report_no_f16(self, precision: str) -> None:
        """Log once per runtime that fp16 storage was asked for on an adapter without shader-f16."""
        if not self.__dict__.get("_reported_f16"):
            self._reported_f16 = True
            log.info("backend webgpu ignores precision=%s / kv_fp16=%s: %s has no shader-f16, storage stays fp32",
                     precision, self.hints.kv_fp16, self.device.description)

    def create_backend(self, config: BackendConfig) -> WebGPUBackend:
        return WebGPUBackend(self, config)

    def device_name(self) -> str:
        return self.device.description


class WebGPURuntimeCreator(RuntimeCreator):
    """fp32 arithmetic; precision "low" honoured (fp16 weights and KV cache) where the default
    adapter has shader-f16, else ignored and reported so; 4- and 8-bit weights packed whatever
    memory says; the adapter schedules its own invocations, so thread_num has no meaning."""

    name = "webgpu"
    static_shapes = True
    hints_type = WebGPUHints

    @property
    def settings(self) -> frozenset[str]:
        """{"precision"} where the default adapter (the one `mnnllm backends` probes) has
        shader-f16, else nothing: what this machine's webgpu honours."""
        if not self.is_available()[0]:
            return frozenset()
        module = device_module()
        return frozenset({"precision"}) if module.open_device(module.device_spec(None)).f16 else frozenset()

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
