"""The vulkan backend: RuntimeCreator (probe), Runtime (device), Backend (buffers, host copies,
the per-run command buffer). `vulkan` is imported lazily, so importing this module never
touches a driver.

Runtime hints (optional): "vulkan_device": an index into vkEnumeratePhysicalDevices (else
$MNNLLM_VULKAN_DEVICE, else the first discrete GPU, integrated GPU, or any device);
"vulkan_linear": the kernels of 4-bit linear layers, "texel" (weights in 4-word texels read
through texel buffers, 16 rows per invocation: the default on a CPU device such as lavapipe,
where a storage-buffer read costs a loop over the lanes), "group" (8 rows per work-group with a
shared-memory reduction: the default on a GPU) or "lanes" (one invocation per row); forced for
every layer. "gpu_tuning" (MNN's levels, TuningCache): unless forced, each 4-bit layer shape's
decode kernel is timed once per device on its real weights and the fastest kept in the tuning
file; "none" (the default) keeps the device class's choice.

Compute pipelines are created through a VkPipelineCache kept on disk (core/device_cache.py:
`<tmp_path or $MNNLLM_CACHE>/vulkan/<device key digest>.pipelines`, keyed by device, driver and
pipelineCacheUUID, written at exit beside and renamed; a corrupt file is ignored with a warning).

"vulkan_subgroups" (default: whether the device has subgroup arithmetic in compute shaders,
with subgroups of at least 8): the norms and the attention softmax with one 8-invocation
work-group per row joined by subgroup operations; false forces the one-invocation-per-row kernels.
"vulkan_split_keys": the cache length from which a decode step runs flash-decoding (attention.py;
0: never).

Runtime hint "attention_mode" (MNN's; kv_format.py): 8 (the default) keeps the KV cache fp32 (or
fp16 with the hint "kv_fp16": true), 10 stores keys and values as int8 with a scale per
token and kv head; the other parts (keys-only int8, non-flash) are logged as ignored. Other
formats than fp32 need the one-dispatch attention (subgroups; attention.py).

Runtime hint "replay" (default true): a pipeline that runs wholly on vulkan is recorded into
one command buffer once per resize and replayed: per token the attentions' host bookkeeping,
one submit and wait (VulkanReplay). With "replay": false, or with any op on cpu, a run
records every dispatch of this backend into one command buffer (on_execute_begin opens it
lazily, on_execute_end submits and waits). Any host access to a buffer in between (a copy to
or from the cpu backend around a fallback op, an upload, a download) first submits what was
recorded, so the host sees and changes memory only when the device is idle.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from mnnllm_core.backend_api import (Backend, BackendConfig, ConfigError, DeviceCache, Runtime, RuntimeCreator,
                                     RuntimeHints, ScheduleConfig, Tensor, TuningCache, announce, kv_format)

ATTENTION_MODES = frozenset({8, 10})  # the attention_mode values the vulkan backend honours whole

PIPELINE_SECONDS = 5  # a model's ~30 shaders through a GPU driver's compiler (a guess; lavapipe: 0.1 s measured)


@dataclass(frozen=True)
class VulkanHints(RuntimeHints):
    """The vulkan hints of the module docstring; None: the device class decides."""

    vulkan_device: int | str | None = None
    vulkan_linear: str | None = None
    vulkan_subgroups: bool | None = None
    vulkan_split_keys: int | None = None


class VulkanBackend(Backend):
    """Storage of a tensor is a device.Buffer (fp32, int32 as they are on the host)."""

    name = "vulkan"

    def __init__(self, runtime: "VulkanRuntime", config: BackendConfig):
        super().__init__(runtime, config)
        self.device = runtime.device
        self.allocator = runtime.allocator
        self.recorder = runtime.recorder
        self.replaying = None  # the Recorder of a replay submitted and not yet waited for

    def idle(self) -> None:
        """Submit what was recorded and wait for everything submitted: host access is safe."""
        if self.replaying is not None:
            self.replaying.wait()
            self.replaying = None
        self.recorder.flush()

    def fits(self, *tensors: Tensor) -> bool:
        """Whether every tensor (with a known shape) fits one storage buffer binding and one
        texel view (maxStorageBufferRange, maxTexelBufferElements)."""
        return all(self.device.fits_floats(t.size * t.dtype.itemsize) for t in tensors)

    # -- memory ------------------------------------------------------------------
    def buffer_key(self, tensor: Tensor) -> int:
        return max(4, tensor.size * tensor.dtype.itemsize)

    def alloc(self, tensor: Tensor):
        return self.allocator.alloc(self.buffer_key(tensor))

    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        self.idle()
        self.allocator.copyin(tensor.storage, np.asarray(array, dtype=tensor.dtype))

    def download(self, tensor: Tensor) -> np.ndarray:
        self.idle()
        nbytes = tensor.size * tensor.dtype.itemsize
        return self.allocator.copyout(tensor.storage, nbytes).view(tensor.dtype).reshape(tensor.shape)

    def on_copy_buffer(self, src: Tensor, dst: Tensor) -> None:
        other = src.backend
        if isinstance(other, VulkanBackend) and other.device is self.device:
            self.recorder.copy(dst.storage, src.storage, dst.size * dst.dtype.itemsize)
        else:
            self.upload(dst, other.download(src))

    def on_execute_end(self) -> None:
        self.idle()

    def on_record(self, commands) -> "VulkanReplay":
        from .replay import VulkanReplay
        return VulkanReplay(self, commands)


class VulkanRuntime(Runtime):
    """One device, one recorder (command buffer + fence) shared by the backends it creates."""

    name = "vulkan"
    hints_type = VulkanHints

    def __init__(self, config: ScheduleConfig, hints: RuntimeHints | dict[str, Any] | None = None):
        super().__init__(config, hints)
        from . import device
        from .ops import CREATORS
        from .ops.linear import DECODE_Q4
        self.device = device.open_device(device.device_spec(self.hints.vulkan_device))
        pipelines = DeviceCache.for_device(self.hints, "vulkan", self.device.pipeline_key, "pipelines")
        if not self.device.keep_pipelines(pipelines):
            expected = "under a second" if self.device.is_cpu else f"about {PIPELINE_SECONDS} s"
            announce(f"creating the vulkan pipelines on {self.device.name} (first run with this driver: "
                     f"{expected}; kept in {pipelines.path})")
        self.allocator = device.Allocator(self.device)
        self.recorder = device.Recorder(self.device)
        self.linear_forced = self.hints.vulkan_linear is not None
        self.linear_variant = self.hints.vulkan_linear or ("texel" if self.device.is_cpu else "group")
        if self.linear_variant not in DECODE_Q4:
            raise ConfigError(f"vulkan_linear must be one of {sorted(DECODE_Q4)}, got {self.linear_variant!r}",
                              field="backend_hints.vulkan_linear")
        self.tuning = TuningCache.from_hints(self.hints, self.device.tuning_key)
        device_can = self.device.subgroup_arithmetic and self.device.subgroup_size >= 8
        forced = self.hints.vulkan_subgroups
        self.subgroups = (device_can if forced is None else forced) and device_can
        if (self.hints.vulkan_split_keys or 0) < 0:
            raise ConfigError("vulkan_split_keys must be 0 (never) or a cache length, "
                              f"got {self.hints.vulkan_split_keys}",
                              field="backend_hints.vulkan_split_keys")
        self.kv_format = kv_format(self.name, self.hints.attention_mode, self.hints.kv_fp16,
                                   ATTENTION_MODES)
        self.op_creators.update(CREATORS)

    def linear_variant_for(self, problem: str, variants: list[str], run: Callable[[str], None]) -> str:
        """The decode kernel of a 4-bit linear layer of this shape, one of `variants` (those its
        weight allows): the forced one, else the tuned one (gpu_tuning: `run(variant)` runs the
        layer once with it and waits), else the device class's ("lanes" where that one does not
        apply)."""
        if self.linear_forced or self.tuning is None:
            return self.linear_variant if self.linear_variant in variants else "lanes"
        return self.tuning.choose(f"linear {problem}", variants, run)

    def create_backend(self, config: BackendConfig) -> VulkanBackend:
        return VulkanBackend(self, config)

    def kv_storage(self) -> str:
        return self.kv_format.name

    def device_name(self) -> str:
        return self.device.description


class VulkanRuntimeCreator(RuntimeCreator):
    """fp32 everywhere and int4 weights packed whatever precision and memory say; the device
    schedules its own invocations, so thread_num has no meaning."""

    name = "vulkan"
    static_shapes = True
    hints_type = VulkanHints
    settings = frozenset({"attention_mode"})
    attention_modes = ATTENTION_MODES

    def is_available(self) -> tuple[bool, str]:
        """Builds and runs the probe shader on the selected device; never raises."""
        return self.probe_device_module(device_module, "the vulkan package",
                                        "no Vulkan driver (ICD) or device the loader can use; "
                                        "on a machine without a GPU install mesa-vulkan-drivers (lavapipe)",
                                        install="pip install 'mnnllm[vulkan]'")

    def create(self, config: ScheduleConfig, hints: RuntimeHints | dict[str, Any] | None = None) -> VulkanRuntime:
        return VulkanRuntime(config, hints)

    def list_devices(self) -> list[str]:
        return device_module().list_devices()


def device_module():
    """device.py, which imports vulkan (hence only when the backend is probed or used)."""
    from . import device
    return device
