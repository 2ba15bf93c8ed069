"""The Vulkan-touching half of the backend, in the words every device layer uses (plugins/README.md):
device selection, an Allocator (host-visible storage Buffers: alloc / constant / copyin /
copyout), a Compiler (a committed SPIR-V shader -> compute Pipeline, cached per device), a
Program (one pipeline with bound buffers, push constants and group counts) and a Recorder that
puts many Programs into one command buffer and submits them at once.

Only this module imports `vulkan`; importing the plugin or the runtime module never touches a
driver (`import vulkan` without libvulkan raises OSError, which the probe reports).

Device selection: `MNNLLM_VULKAN_DEVICE=<index>` (the order of vkEnumeratePhysicalDevices) or
the runtime hint "vulkan_device"; default: the first discrete GPU, else the first integrated GPU,
else the first device (lavapipe on a machine without a GPU).

Memory: every buffer is host-visible and coherent and stays mapped, so upload and download are
memcpy's (after the recorded work is submitted and waited for). A buffer larger than the
device's maxStorageBufferRange is never created: callers check `fits()` and fall back to cpu.

Bindings: a Buffer binds as a storage buffer; `Texels(buffer, kind)` binds it as a uniform
texel buffer (a view of 32-bit float or uint texels of 1, 2 or 4 components). Lavapipe reads a
texel buffer with vector gathers but a storage buffer one lane at a time, so the kernels for a
CPU device read their inputs as texels.
"""
from __future__ import annotations

import atexit
import os
import struct
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np
import vulkan as vk

from mnnllm_core.backend_api import Execution

ENV_DEVICE = "MNNLLM_VULKAN_DEVICE"
WHOLE_SIZE = 0xFFFFFFFFFFFFFFFF  # the package's VK_WHOLE_SIZE is -1, which cffi rejects
MAX_GROUPS = 65535  # a dispatch larger than this many groups along x is folded into y
DESCRIPTOR_POOL_SETS = 1024


TEXEL_FORMATS = {"float": "VK_FORMAT_R32_SFLOAT", "int": "VK_FORMAT_R32_SINT", "uint": "VK_FORMAT_R32_UINT",
                 "vec2": "VK_FORMAT_R32G32_SFLOAT", "vec4": "VK_FORMAT_R32G32B32A32_SFLOAT",
                 "uvec4": "VK_FORMAT_R32G32B32A32_UINT", "half4": "VK_FORMAT_R16G16B16A16_SFLOAT",
                 "char4": "VK_FORMAT_R8G8B8A8_SINT"}
TEXEL_BYTES = {"float": 4, "int": 4, "uint": 4, "vec2": 8, "vec4": 16, "uvec4": 16, "half4": 8, "char4": 4}
STORAGE, TEXEL = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, vk.VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER


@lru_cache(maxsize=None)
def spirv(name: str) -> bytes:
    return resources.files("mnnllm_backends.vulkan.shaders").joinpath(f"{name}.spv").read_bytes()


@dataclass(eq=False)
class Pipeline:
    pipeline: object
    layout: object
    set_layout: object
    kinds: tuple  # descriptor type per binding
    push_size: int


class Buffer:
    """One VkBuffer with its own host-visible memory, mapped for its whole life."""

    def __init__(self, device: "VulkanDevice", nbytes: int):
        self.device = device
        self.size = max(4, int(nbytes))
        d = device.device
        self.buffer = vk.vkCreateBuffer(d, vk.VkBufferCreateInfo(
            size=self.size, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE,
            usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT
            | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT), None)
        need = vk.vkGetBufferMemoryRequirements(d, self.buffer)
        self.memory = vk.vkAllocateMemory(d, vk.VkMemoryAllocateInfo(
            allocationSize=need.size, memoryTypeIndex=device.memory_type(need.memoryTypeBits)), None)
        vk.vkBindBufferMemory(d, self.buffer, self.memory, 0)
        self.host = np.frombuffer(vk.vkMapMemory(d, self.memory, 0, self.size, 0), np.uint8)
        self.views: dict[str, object] = {}

    def view(self, kind: str):
        """The buffer's texel view of `kind` (TEXEL_FORMATS), made once."""
        found = self.views.get(kind)
        if found is None:
            found = self.views[kind] = vk.vkCreateBufferView(self.device.device, vk.VkBufferViewCreateInfo(
                buffer=self.buffer, format=getattr(vk, TEXEL_FORMATS[kind]), offset=0, range=WHOLE_SIZE), None)
        return found

    def write(self, array: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        self.host[offset:offset + data.size] = data

    def read(self, nbytes: int, offset: int = 0) -> np.ndarray:
        return self.host[offset:offset + nbytes].copy()

    def __del__(self) -> None:
        try:
            d = self.device.device
            self.host = None
            for view in self.views.values():
                vk.vkDestroyBufferView(d, view, None)
            vk.vkUnmapMemory(d, self.memory)
            vk.vkDestroyBuffer(d, self.buffer, None)
            vk.vkFreeMemory(d, self.memory, None)
        except Exception:  # interpreter shutdown: the driver goes with the process
            pass


def subgroup_support(physical) -> tuple[int, bool]:
    """(subgroup size, whether compute shaders have subgroup arithmetic) of a Vulkan 1.1 device."""
    try:
        sub = vk.VkPhysicalDeviceSubgroupProperties()
        vk.vkGetPhysicalDeviceProperties2(physical, vk.VkPhysicalDeviceProperties2(pNext=sub))
    except Exception:  # a Vulkan 1.0 driver: no subgroups
        return 0, False
    return int(sub.subgroupSize), bool(sub.supportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT
                                        and sub.supportedOperations & vk.VK_SUBGROUP_FEATURE_ARITHMETIC_BIT)


def list_devices() -> list[str]:
    """Every physical device as "index name" (the index "vulkan_device" takes)."""
    instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(), None)
    try:
        return [f"{i} {vk.vkGetPhysicalDeviceProperties(p).deviceName}"
                for i, p in enumerate(vk.vkEnumeratePhysicalDevices(instance))]
    finally:
        vk.vkDestroyInstance(instance, None)


def select_device(physical, spec: str | None):
    if not physical:
        raise RuntimeError("the Vulkan loader found no physical device (is mesa-vulkan-drivers installed?)")
    if spec not in (None, ""):
        index = int(spec)
        if not 0 <= index < len(physical):
            raise RuntimeError(f"Vulkan device {index} does not exist; {len(physical)} found")
        return physical[index]
    for kind in (vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU, vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU):
        for p in physical:
            if vk.vkGetPhysicalDeviceProperties(p).deviceType == kind:
                return p
    return physical[0]


class VulkanDevice:
    """Instance, logical device, one compute queue, the pipeline cache and descriptor pools."""

    def __init__(self, spec: str | None = None):
        app = vk.VkApplicationInfo(pApplicationName="mnnllm", applicationVersion=1, pEngineName="mnnllm",
                                   engineVersion=1, apiVersion=vk.VK_MAKE_VERSION(1, 1, 0))
        self.instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
        self.physical = select_device(list(vk.vkEnumeratePhysicalDevices(self.instance)), spec)
        props = vk.vkGetPhysicalDeviceProperties(self.physical)
        self.name = vk.ffi.string(props.deviceName).decode() if not isinstance(props.deviceName, str) \
            else props.deviceName
        self.max_range = int(props.limits.maxStorageBufferRange)
        self.max_texels = int(props.limits.maxTexelBufferElements)
        self.max_push = int(props.limits.maxPushConstantsSize)
        self.is_cpu = props.deviceType == vk.VK_PHYSICAL_DEVICE_TYPE_CPU  # lavapipe: kernels for a CPU
        self.subgroup_size, self.subgroup_arithmetic = subgroup_support(self.physical)
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        compute = [i for i, f in enumerate(families) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT]
        if not compute:
            raise RuntimeError(f"Vulkan device {self.name} has no compute queue")
        self.family = compute[0]
        queue_info = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.family, queueCount=1,
                                                pQueuePriorities=[1.0])
        self.device = vk.vkCreateDevice(self.physical, vk.VkDeviceCreateInfo(
            queueCreateInfoCount=1, pQueueCreateInfos=[queue_info]), None)
        self.queue = vk.vkGetDeviceQueue(self.device, self.family, 0)
        self.memory_props = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        self.command_pool = vk.vkCreateCommandPool(self.device, vk.VkCommandPoolCreateInfo(
            queueFamilyIndex=self.family, flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT), None)
        self.pipelines: dict[str, Pipeline] = {}
        self.pipeline_cache = None  # a VkPipelineCache once `keep_pipelines` gives it a file
        self.pipeline_file = None
        self.pipelines_unsaved = 0
        self.pools: list = []
        self.pool_left = 0
        self.free_sets: dict[Pipeline, list] = {}  # sets of dropped Programs, per layout, to reuse
        self.live_sets = 0  # sets held by a Program now

    @property
    def tuning_key(self) -> str:
        """What a tuned kernel choice holds for: device, driver and API version (TuningCache)."""
        props = vk.vkGetPhysicalDeviceProperties(self.physical)
        return f"vulkan | {self.name} | driver {props.driverVersion} | api {props.apiVersion}"

    @property
    def pipeline_key(self) -> str:
        """What compiled pipelines hold for: the tuning key plus the driver's pipelineCacheUUID."""
        props = vk.vkGetPhysicalDeviceProperties(self.physical)
        uuid = bytes(props.pipelineCacheUUID).hex()
        return f"{self.tuning_key} | vendor {props.vendorID:#x} device {props.deviceID:#x} | cache {uuid}"

    def keep_pipelines(self, file) -> bool:
        """Create pipelines through a VkPipelineCache read from `file` (a DeviceCache) and write it
        back at exit: later processes skip the driver's shader compilation. The first file given
        stays; True when the file held pipelines of this device."""
        if self.pipeline_cache is not None:
            return self.pipeline_file.exists()
        data = file.read()
        info = vk.VkPipelineCacheCreateInfo(initialDataSize=len(data) if data else 0,
                                            pInitialData=vk.ffi.from_buffer(data) if data else None)
        self.pipeline_cache = vk.vkCreatePipelineCache(self.device, info, None)
        self.pipeline_file = file
        atexit.register(self.save_pipelines)
        return data is not None

    def save_pipelines(self) -> None:
        """Write the pipeline cache's data to its file when pipelines were created since the last write."""
        if self.pipeline_cache is None or not self.pipelines_unsaved:
            return
        size = vk.ffi.new("size_t *")  # the package wraps no vkGetPipelineCacheData: cffi's binding
        if vk.lib.vkGetPipelineCacheData(self.device, self.pipeline_cache, size, vk.ffi.NULL) != vk.VK_SUCCESS:
            return
        buffer = vk.ffi.new("char[]", size[0])
        if vk.lib.vkGetPipelineCacheData(self.device, self.pipeline_cache, size, buffer) != vk.VK_SUCCESS:
            return
        self.pipeline_file.write(vk.ffi.buffer(buffer, size[0])[:])
        self.pipelines_unsaved = 0

    @property
    def description(self) -> str:
        return f"{self.name} (Vulkan, maxStorageBufferRange {self.max_range >> 20} MiB)"

    def fits(self, nbytes: int) -> bool:
        return int(nbytes) <= self.max_range

    def fits_floats(self, nbytes: int) -> bool:
        """Whether a tensor of `nbytes` can be bound both ways: a storage buffer and a view of
        float texels (the shaders read most inputs as texels)."""
        return self.fits_texels(nbytes, "float")

    def fits_texels(self, nbytes: int, kind: str) -> bool:
        """Whether a buffer of `nbytes` fits one storage binding and one texel view of `kind`."""
        return self.fits(nbytes) and int(nbytes) // TEXEL_BYTES[kind] <= self.max_texels

    def memory_type(self, bits: int) -> int:
        want = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        best = None
        for i in range(self.memory_props.memoryTypeCount):
            flags = self.memory_props.memoryTypes[i].propertyFlags
            if bits & (1 << i) and flags & want == want:
                if flags & vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT:
                    return i
                best = i if best is None else best
        if best is None:
            raise RuntimeError("no host-visible coherent Vulkan memory type")
        return best

    # -- descriptor sets ----------------------------------------------------------
    def descriptor_set(self, pipeline: Pipeline, bindings) -> object:
        """A descriptor set for `pipeline` binding `bindings` (Buffer or Texels, in binding order):
        one a dropped Program gave back (`release_set`) when there is one, else a new one."""
        free = self.free_sets.get(pipeline)
        dset = free.pop() if free else self._new_set(pipeline)
        writes = [vk.VkWriteDescriptorSet(
            dstSet=dset, dstBinding=i, descriptorCount=1, descriptorType=TEXEL, pTexelBufferView=[b.buffer.view(b.kind)])
            if isinstance(b, Texels) else vk.VkWriteDescriptorSet(
            dstSet=dset, dstBinding=i, descriptorCount=1, descriptorType=STORAGE,
            pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=b.buffer, offset=0, range=WHOLE_SIZE)])
            for i, b in enumerate(bindings)]
        vk.vkUpdateDescriptorSets(self.device, len(writes), writes, 0, None)
        self.live_sets += 1
        return dset

    def release_set(self, pipeline: Pipeline, dset: object) -> None:
        """`dset` is no longer bound by any command buffer that may still run: reuse it."""
        self.free_sets.setdefault(pipeline, []).append(dset)
        self.live_sets -= 1

    @property
    def allocated_sets(self) -> int:
        """Descriptor sets taken from the pools so far (live and free)."""
        return len(self.pools) * DESCRIPTOR_POOL_SETS - self.pool_left

    def _new_set(self, pipeline: Pipeline) -> object:
        if self.pool_left == 0:
            sizes = [vk.VkDescriptorPoolSize(type=kind, descriptorCount=DESCRIPTOR_POOL_SETS * 12)
                     for kind in (STORAGE, TEXEL)]
            self.pools.append(vk.vkCreateDescriptorPool(self.device, vk.VkDescriptorPoolCreateInfo(
                maxSets=DESCRIPTOR_POOL_SETS, poolSizeCount=len(sizes), pPoolSizes=sizes), None))
            self.pool_left = DESCRIPTOR_POOL_SETS
        self.pool_left -= 1
        return vk.vkAllocateDescriptorSets(self.device, vk.VkDescriptorSetAllocateInfo(
            descriptorPool=self.pools[-1], descriptorSetCount=1, pSetLayouts=[pipeline.set_layout]))[0]


class Allocator:
    """Device memory: Buffers of at most maxStorageBufferRange bytes and the host copies (plain
    memcpy's into the mapped memory: callers make the device idle first)."""

    def __init__(self, device: "VulkanDevice"):
        self.device = device

    def alloc(self, nbytes: int) -> Buffer:
        if not self.device.fits(nbytes):
            raise ValueError(f"{nbytes} bytes exceed maxStorageBufferRange ({self.device.max_range})")
        return Buffer(self.device, nbytes)

    def constant(self, array: np.ndarray) -> Buffer:
        """A buffer initialised from host memory (packed weights, norm gammas)."""
        data = np.ascontiguousarray(array)
        buffer = self.alloc(data.nbytes)
        if data.nbytes:
            buffer.write(data)
        return buffer

    @staticmethod
    def copyin(buffer: Buffer, array: np.ndarray) -> None:
        buffer.write(array)

    @staticmethod
    def copyout(buffer: Buffer, nbytes: int) -> np.ndarray:
        return buffer.read(nbytes)


class Compiler:
    """A committed SPIR-V shader (shaders/NAME.spv) -> compute Pipeline, built once per process
    per device and shader name (the cache is the device's)."""

    def __init__(self, device: "VulkanDevice"):
        self.device = device

    def compile(self, name: str, kinds: tuple, push_size: int) -> Pipeline:
        """The compute pipeline of shader `name`, with one descriptor of kinds[i] at binding i."""
        found = self.device.pipelines.get(name)
        if found is not None:
            return found
        d = self.device.device
        code = spirv(name)
        module = vk.vkCreateShaderModule(d, vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code), None)
        set_layout = vk.vkCreateDescriptorSetLayout(d, vk.VkDescriptorSetLayoutCreateInfo(
            bindingCount=len(kinds), pBindings=[vk.VkDescriptorSetLayoutBinding(
                binding=i, descriptorType=kind, descriptorCount=1,
                stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT) for i, kind in enumerate(kinds)]), None)
        ranges = [vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=push_size)]
        layout = vk.vkCreatePipelineLayout(d, vk.VkPipelineLayoutCreateInfo(
            setLayoutCount=1, pSetLayouts=[set_layout], pushConstantRangeCount=1 if push_size else 0,
            pPushConstantRanges=ranges if push_size else None), None)
        stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName="main")
        pipeline = vk.vkCreateComputePipelines(d, self.device.pipeline_cache or None, 1, [
            vk.VkComputePipelineCreateInfo(stage=stage, layout=layout)], None)[0]
        self.device.pipelines_unsaved += 1
        vk.vkDestroyShaderModule(d, module, None)
        found = self.device.pipelines[name] = Pipeline(pipeline, layout, set_layout, tuple(kinds), push_size)
        return found


@dataclass(frozen=True)
class Texels:
    """A Buffer bound as a uniform texel buffer of `kind` texels (TEXEL_FORMATS)."""

    buffer: Buffer
    kind: str


class Program:
    """One compiled pipeline with bound buffers, push constants and group counts: recorded with
    `Recorder.dispatch`.

    `buffers` (Buffer or Texels) are kept referenced so they outlive every command buffer that
    uses them. A Recorder keeps every Program its command buffer holds, so a Program is dropped
    only when no command buffer that may run binds it: then its descriptor set goes back to the
    device for the next Program of the same pipeline (a re-record, a resize or a dropped clone
    never grows the pools)."""

    def __init__(self, device: VulkanDevice, name: str, buffers, push: bytes, groups: tuple[int, int, int]):
        self.device = device
        self.name = name  # the shader's (bench/vulkan_device_time.py groups by it)
        kinds = tuple(TEXEL if isinstance(b, Texels) else STORAGE for b in buffers)
        self.pipeline = Compiler(device).compile(name, kinds, len(push))
        self.buffers = list(buffers)
        self.dset = device.descriptor_set(self.pipeline, self.buffers)
        self.push = vk.ffi.new("char[]", push) if push else None
        self.push_size = len(push)
        self.groups = groups

    def __del__(self) -> None:
        dset, self.dset = getattr(self, "dset", None), None
        if dset is not None:
            self.device.release_set(self.pipeline, dset)


def fold(groups: int, local: int) -> tuple[tuple[int, int, int], int]:
    """Groups along x (at most MAX_GROUPS) and y for a 1-D launch; and invocations per y row."""
    groups = max(1, groups)
    if groups <= MAX_GROUPS:
        return (groups, 1, 1), groups * local
    return (MAX_GROUPS, -(-groups // MAX_GROUPS), 1), MAX_GROUPS * local


def pack_push(fmt: str, *values) -> bytes:
    return struct.pack("<" + fmt, *values)


class Recorder:
    """Records programs, fills and copies into one command buffer; `flush()` submits it and
    waits. A barrier separates consecutive commands (ops depend on their predecessors).

    `reusable`: the command buffer is recorded once (then `end()`) and `submit()`ted as often
    as needed: a replayed decode step; `reset()` before recording it again."""

    def __init__(self, device: VulkanDevice, reusable: bool = False):
        self.device = device
        self.flags = 0 if reusable else vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT
        d = device.device
        self.cmd = vk.vkAllocateCommandBuffers(d, vk.VkCommandBufferAllocateInfo(
            commandPool=device.command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        self.fence = vk.vkCreateFence(d, vk.VkFenceCreateInfo(), None)
        self.open = False
        self.count = 0
        self.submits = 0
        self.pending = False  # submitted, not yet waited for
        self.barrier = [vk.VkMemoryBarrier(
            srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
            | vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT)]
        self.stages = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
        self.submit_info = vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[self.cmd])
        self.keep: list = []  # Program objects referenced by the open command buffer

    def _begin(self) -> None:
        if not self.open:
            vk.vkBeginCommandBuffer(self.cmd, vk.VkCommandBufferBeginInfo(flags=self.flags))
            self.open = True
        elif self.count:
            vk.vkCmdPipelineBarrier(self.cmd, self.stages, self.stages, 0, 1, self.barrier, 0, None, 0, None)
        self.count += 1

    def dispatch(self, item: Program) -> None:
        if not all(item.groups):
            return
        self._begin()
        cmd, p = self.cmd, item.pipeline
        vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline)
        vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0, 1, [item.dset], 0, None)
        if item.push_size:
            vk.vkCmdPushConstants(cmd, p.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, item.push_size, item.push)
        vk.vkCmdDispatch(cmd, *item.groups)
        self.keep.append(item)

    def fill_zero(self, buffer: Buffer, nbytes: int) -> None:
        self._begin()
        vk.vkCmdFillBuffer(self.cmd, buffer.buffer, 0, (int(nbytes) + 3) // 4 * 4 if nbytes < buffer.size
                           else WHOLE_SIZE, 0)
        self.keep.append(buffer)

    def copy(self, dst: Buffer, src: Buffer, nbytes: int, dst_offset: int = 0, src_offset: int = 0) -> None:
        if not nbytes:
            return
        self._begin()
        vk.vkCmdCopyBuffer(self.cmd, src.buffer, dst.buffer, 1, [vk.VkBufferCopy(
            srcOffset=int(src_offset), dstOffset=int(dst_offset), size=int(nbytes))])
        self.keep += (src, dst)

    def flush(self) -> None:
        """Submit what was recorded and wait; then host reads and writes are safe."""
        if not self.open:
            return
        self.end()
        self.submit()
        self.reset()

    def end(self) -> None:
        """Close the command buffer: nothing more is recorded until reset()."""
        if self.open:
            vk.vkEndCommandBuffer(self.cmd)
            self.open = False

    def submit(self, wait: bool = True) -> None:
        """Run the closed command buffer once; wait for it now, or later with `wait()`."""
        if not self.count:
            return
        vk.vkQueueSubmit(self.device.queue, 1, [self.submit_info], self.fence)
        self.submits += 1
        self.pending = True
        if wait:
            self.wait()

    def wait(self) -> None:
        """Wait for the last submit (if it is still pending)."""
        if self.pending:
            d = self.device.device
            vk.vkWaitForFences(d, 1, [self.fence], vk.VK_TRUE, WHOLE_SIZE)
            vk.vkResetFences(d, 1, [self.fence])
            self.pending = False

    def reset(self) -> None:
        """Empty the command buffer (and let go of what it referenced)."""
        vk.vkResetCommandBuffer(self.cmd, 0)
        self.open, self.count = False, 0
        self.keep.clear()

    def __del__(self) -> None:
        try:  # a replay's recorder goes with its pipeline's encoding (every resize makes a new one)
            self.wait()
            vk.vkFreeCommandBuffers(self.device.device, self.device.command_pool, 1, [self.cmd])
            vk.vkDestroyFence(self.device.device, self.fence, None)
        except Exception:  # interpreter shutdown: the driver goes with the process
            pass


_DEVICES: dict[str | None, VulkanDevice] = {}


def open_device(spec: str | None) -> VulkanDevice:
    """One VulkanDevice per process per selection (pipelines are built once)."""
    if spec not in _DEVICES:
        _DEVICES[spec] = VulkanDevice(spec)
    return _DEVICES[spec]


def probe(spec: str | None) -> str:
    """Build and run the probe shader on the selected device; returns its description."""
    device = open_device(spec)
    host = np.arange(4, dtype=np.float32)
    allocator = Allocator(device)
    buffer = allocator.constant(host)
    recorder = Recorder(device)
    recorder.dispatch(Program(device, "probe", [buffer], b"", (1, 1, 1)))
    recorder.flush()
    result = allocator.copyout(buffer, 16).view(np.float32)
    if not np.array_equal(result, host * 2):
        raise RuntimeError(f"the probe shader computed {result.tolist()} instead of {(host * 2).tolist()}")
    return device.description


def device_spec(hint: int | str | None) -> str | None:
    """The device the "vulkan_device" hint names, else $MNNLLM_VULKAN_DEVICE, else None (default)."""
    return hint or os.environ.get(ENV_DEVICE) or None


class ProgramExecution(Execution):
    """An Execution that records one Program per run (bound in on_resize)."""

    def __init__(self, backend):
        super().__init__(backend)
        self.program: Program | None = None

    def on_execute(self, inputs, outputs) -> None:
        self.backend.recorder.dispatch(self.program)
