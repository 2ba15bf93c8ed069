"""The opencl backend: RuntimeCreator (probe), Runtime (device, queue, kernel choices),
Backend (buffers, host copies, kernel building). pyopencl is imported lazily, so importing
this module never touches OpenCL.

Runtime hints (all optional):
  "opencl_device": "platform:device"  which device (else $MNNLLM_OPENCL_DEVICE, else the
                                      first GPU, else the first device); see device.py
  "opencl_fp16": bool                 force fp16 activation storage on or off; by default it
                                      is on only for precision "low" on a device with
                                      cl_khr_fp16 (kernels convert with vload_half /
                                      vstore_half and always compute in fp32)
  "opencl_linear_split": int          work-items that share one output row of a linear
                                      layer (a power of two); default 1 on a CPU device
                                      (one work-item per row, wide vector loads: fastest
                                      on pocl) and 64 on a GPU (work-group reduction);
                                      set, it wins over gpu_tuning
  "gpu_tuning": str                   MNN's tuning levels: "none" (default: the split by
                                      device class), "fast" | "normal" | "wide" | "heavy":
                                      each linear layer's splits (LINEAR_SPLITS) timed once
                                      per device on its real shapes, the fastest kept in the
                                      tuning cache file (TuningCache) and read by later runs
  "opencl_cpu_kernels": bool          the kernels written for a CPU device (prefill: register
                                      tiles, weights dequantized once per work-group; decode:
                                      gemv_cpu.cl; pocl) or those for a GPU; default by device
                                      class (ops/variant.py)
  "kv_fp16": bool                     (every backend's) store the KV cache as fp16 with fp32
                                      activations too (by default it is stored as the activations are)
  "attention_mode": int               MNN's (kv_format.py): 8 (default) the cache as set above;
                                      10 keys and values int8 (a scale per token and kv head);
                                      the other parts are logged as ignored
  "replay": bool                      default true: a pipeline wholly on opencl is replayed as
                                      one flat list of enqueues bound once (OpenCLReplay);
                                      false keeps the per-op loop
pocl 3.1 offers cl_khr_command_buffer, but pyopencl has no binding for it: the replay is the
enqueue loop (kernels and arguments bound once; per token only the enqueues and one 8-byte
write of the step's KV lengths, which every Attention reads).
"""
from __future__ import annotations

import atexit
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from mnnllm_core.backend_api import (Backend, BackendConfig, ConfigError, DeviceCache, KVFormat, Runtime,
                                     RuntimeCreator, RuntimeHints, ScheduleConfig, Tensor, TuningCache, announce,
                                     kv_format)

if TYPE_CHECKING:
    from .device import Program

BUILD_SECONDS = 30  # every kernel of SmolLM2's load through pocl 3.1, measured on the 2-core reference machine
LINEAR_SPLITS = (1, 4, 16, 64)  # the splits gpu_tuning times (those the device's work-groups hold)


@dataclass(frozen=True)
class OpenCLHints(RuntimeHints):
    """The opencl hints of the module docstring; None: the device class decides."""

    opencl_device: str | None = None
    opencl_fp16: bool | None = None
    opencl_linear_split: int | None = None
    opencl_cpu_kernels: bool | None = None


class OpenCLBackend(Backend):
    """Storage of a tensor is a cl.Buffer; float32 tensors are held as fp16 when `half`."""

    name = "opencl"

    def __init__(self, runtime: "OpenCLRuntime", config: BackendConfig):
        super().__init__(runtime, config)
        forced = runtime.hints.opencl_fp16
        self.half = bool(forced) if forced is not None else (
            config.precision == "low" and runtime.device.has_fp16)
        self.queue = runtime.queue
        self.allocator = runtime.allocator

    # -- kernels -----------------------------------------------------------------
    def program(self, file: str, kernel: str, **defines: Any) -> "Program":
        """Kernel `kernel` of kernels/`file`, built for this backend's storage type."""
        from .device import Program
        options = " ".join(f"-D{k}={v}" for k, v in sorted(defines.items()))
        if self.half:
            options += " -DHALF_STORAGE"
        return Program(self.runtime.compiler.build_file(file, options.strip()), kernel)

    def storage_dtype(self, tensor: Tensor) -> np.dtype:
        if self.half and tensor.dtype == np.float32:
            return np.dtype(np.float16)
        return tensor.dtype

    # -- memory ------------------------------------------------------------------
    def buffer_key(self, tensor: Tensor) -> int:
        return max(4, tensor.size * self.storage_dtype(tensor).itemsize)

    def alloc(self, tensor: Tensor):
        return self.allocator.alloc(self.buffer_key(tensor))

    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        self.allocator.copyin(tensor.storage, np.asarray(array, dtype=self.storage_dtype(tensor)).reshape(-1))

    def download(self, tensor: Tensor) -> np.ndarray:
        host = np.empty(tensor.shape, self.storage_dtype(tensor))
        return self.allocator.copyout(host, tensor.storage).astype(tensor.dtype, copy=False)

    def on_copy_buffer(self, src: Tensor, dst: Tensor) -> None:
        other = src.backend
        if isinstance(other, OpenCLBackend) and other.runtime.device is self.runtime.device and other.half == self.half:
            self.allocator.copy(dst.storage, src.storage, dst.size * self.storage_dtype(dst).itemsize)
        else:
            self.upload(dst, src.backend.download(src))

    def on_execute_end(self) -> None:
        self.queue.finish()

    def on_record(self, commands) -> "OpenCLReplay":
        from .replay import OpenCLReplay
        return OpenCLReplay(self.queue, commands)


class OpenCLRuntime(Runtime):
    """One device, one in-order queue, and the process-wide program cache of that device."""

    name = "opencl"
    hints_type = OpenCLHints

    def __init__(self, config: ScheduleConfig, hints: RuntimeHints | dict[str, Any] | None = None):
        super().__init__(config, hints)
        import pyopencl as cl

        from . import device
        from .ops import CREATORS
        self.device = device.open_device(device.device_spec(self.hints.opencl_device))
        self.queue = cl.CommandQueue(self.device.context)
        self.allocator = device.Allocator(self.device, self.queue)
        self.compiler = device.Compiler(self.device)
        _announce_first_build(self.hints, self.device)
        split = self.hints.opencl_linear_split
        self.linear_split_forced = split is not None
        if split is None:
            split = 1 if self.device.is_cpu else min(64, self.device.device.max_work_group_size)
        self.linear_split = split
        if split < 1 or split & (split - 1):
            raise ConfigError(f"opencl_linear_split must be a power of two, got {split!r}",
                              field="backend_hints.opencl_linear_split")
        self.tuning = TuningCache.from_hints(self.hints, self.device.tuning_key)
        self.op_creators.update(CREATORS)
        self.kv_format = kv_format(self.name, self.hints.attention_mode, self.hints.kv_fp16)
        self.step_buffer = self.allocator.alloc(8)  # int past, int total: see attention_step
        self.step_values: tuple[int, int] | None = None

    def attention_step(self, past: int, total: int) -> None:
        """Set the (past, total) that Attention kernels read from `step_buffer`: a fill enqueued
        only when it changes, so all layers of a step share one write (the queue is in order, so
        each kernel reads the value enqueued before it)."""
        if self.step_values != (past, total):
            import pyopencl as cl
            cl.enqueue_fill_buffer(self.queue, self.step_buffer, np.array((past, total), np.int32), 0, 8)
            self.step_values = (past, total)

    def linear_split_for(self, problem: str, run: Callable[[int], None]) -> int:
        """The split of a linear layer: the forced one, else the tuned one (gpu_tuning: `run(split)`
        runs the layer once with it and waits), else the device class's."""
        if self.linear_split_forced or self.tuning is None:
            return self.linear_split
        splits = [s for s in LINEAR_SPLITS if s <= self.device.device.max_work_group_size]
        return self.tuning.choose(f"linear {problem}", splits, run)

    def create_backend(self, config: BackendConfig) -> OpenCLBackend:
        return OpenCLBackend(self, config)

    def kv_storage(self) -> str:
        return self.kv_format.name

    def device_name(self) -> str:
        return self.device.description


class OpenCLRuntimeCreator(RuntimeCreator):
    """precision "low" stores activations as fp16 (see opencl_fp16); weights stay packed
    whatever `memory` says; OpenCL schedules its own work-items, so thread_num has no meaning."""

    name = "opencl"
    static_shapes = True
    settings = frozenset({"precision", "attention_mode"})
    hints_type = OpenCLHints
    attention_modes = KVFormat.honoured

    def is_available(self) -> tuple[bool, str]:
        """Builds and runs a tiny kernel on the device $MNNLLM_OPENCL_DEVICE names (else the
        default one); never raises."""
        return self.probe_device_module(device_module, "pyopencl", install="pip install 'mnnllm[opencl]'")

    def create(self, config: ScheduleConfig, hints: RuntimeHints | dict[str, Any] | None = None) -> OpenCLRuntime:
        return OpenCLRuntime(config, hints)

    def list_devices(self) -> list[str]:
        return [f"{key} {d.name.strip()} on {d.platform.name.strip()}" for key, d in device_module().list_devices()]


def _announce_first_build(hints: RuntimeHints, device) -> None:
    """Say so when this device has not built these kernel sources before (the driver compiles
    them then; pyopencl and pocl keep the binaries), and note at exit that it has."""
    marker = DeviceCache.for_device(hints, "opencl", device.tuning_key, "built")
    sources = device_module().kernel_digest().encode()
    if marker.read() != sources:
        announce(f"building the OpenCL kernels for {device.description} (first run on this device: about "
                 f"{BUILD_SECONDS} s with pocl; the driver keeps them)")
        atexit.register(marker.write, sources)


def device_module():
    """device.py, which imports pyopencl (hence only when the backend is probed or used)."""
    from . import device
    return device
