"""The vulkan backend: RuntimeCreator (probe), Runtime (device), Backend (buffers, host copies,
the per-run command buffer). `vulkan` is imported lazily, so importing this module never
touches a driver.

Runtime hint (optional): "vulkan_device": an index into vkEnumeratePhysicalDevices (else
$MNNLLM_VULKAN_DEVICE, else the first discrete GPU, integrated GPU, or any device).

A run records every dispatch of this backend into one command buffer (on_execute_begin opens
it lazily, on_execute_end submits and waits). Any host access to a buffer in between (a copy
to or from the cpu backend around a fallback op, an upload, a download) first submits what was
recorded, so the host sees and changes memory only when the device is idle.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from mnnllm_core.backend_api import Backend, BackendConfig, Runtime, RuntimeCreator, ScheduleConfig, Tensor

class VulkanBackend(Backend):
    """Storage of a tensor is a device.Buffer (fp32, int32 as they are on the host)."""

    name = "vulkan"

    def __init__(self, runtime: "VulkanRuntime", config: BackendConfig):
        super().__init__(runtime, config)
        self.device = runtime.device
        self.recorder = runtime.recorder

    def fits(self, *tensors: Tensor) -> bool:
        """Whether every tensor (with a known shape) fits one storage buffer binding."""
        return all(self.device.fits(t.size * t.dtype.itemsize) for t in tensors)

    # -- memory ------------------------------------------------------------------
    def buffer_key(self, tensor: Tensor) -> int:
        return max(4, tensor.size * tensor.dtype.itemsize)

    def alloc(self, tensor: Tensor):
        return self.device.alloc(self.buffer_key(tensor))

    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        self.recorder.flush()
        tensor.storage.write(np.asarray(array, dtype=tensor.dtype))

    def download(self, tensor: Tensor) -> np.ndarray:
        self.recorder.flush()
        nbytes = tensor.size * tensor.dtype.itemsize
        return tensor.storage.read(nbytes).view(tensor.dtype).reshape(tensor.shape)

    def on_copy_buffer(self, src: Tensor, dst: Tensor) -> None:
        other = src.backend
        if isinstance(other, VulkanBackend) and other.device is self.device:
            self.recorder.copy(dst.storage, src.storage, dst.size * dst.dtype.itemsize)
        else:
            self.upload(dst, other.download(src))

    def on_execute_end(self) -> None:
        self.recorder.flush()


class VulkanRuntime(Runtime):
    """One device, one recorder (command buffer + fence) shared by the backends it creates."""

    name = "vulkan"

    def __init__(self, config: ScheduleConfig, hints: dict[str, Any] | None = None):
        super().__init__(config, hints)
        from . import device
        from .ops import CREATORS
        self.device = device.open_device(device.device_spec(self.hints))
        self.recorder = device.Recorder(self.device)
        self.op_creators.update(CREATORS)

    def create_backend(self, config: BackendConfig) -> VulkanBackend:
        return VulkanBackend(self, config)

    def device_name(self) -> str:
        return self.device.description


class VulkanRuntimeCreator(RuntimeCreator):
    """fp32 everywhere and int4 weights packed whatever precision and memory say; the device
    schedules its own invocations, so thread_num has no meaning."""

    name = "vulkan"
    static_shapes = True

    def is_available(self) -> tuple[bool, str]:
        """Builds and runs the probe shader on the selected device; never raises."""
        try:
            from . import device
        except Exception as err:  # the package missing, or libvulkan not loadable (OSError)
            return False, f"the vulkan package cannot be imported: {type(err).__name__}: {err}"
        spec = device.device_spec({})
        return self.probe_once(spec, lambda: device.probe(spec), "no Vulkan driver (ICD) or device the loader can use; "
                               "on a machine without a GPU install mesa-vulkan-drivers (lavapipe)")

    def create(self, config: ScheduleConfig, hints: dict[str, Any] | None = None) -> VulkanRuntime:
        return VulkanRuntime(config, hints)

    def devices(self) -> list[str]:
        try:
            import vulkan as vk
            instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(), None)
            try:
                return [f"{i} {vk.vkGetPhysicalDeviceProperties(p).deviceName}"
                        for i, p in enumerate(vk.vkEnumeratePhysicalDevices(instance))]
            finally:
                vk.vkDestroyInstance(instance, None)
        except Exception:  # no driver: no devices to list
            return []
