"""The wgpu-touching half of the backend, in the words every device layer uses (plugins/README.md):
adapter selection, an Allocator (storage buffers: alloc / constant / copyin / copyout / copy),
a Compiler (a WGSL file -> compute pipeline, cached per device), a Program (one pipeline with its
bind group, a uniform buffer of its parameters and its work-group counts), Copy and Fill steps, and
a Recorder that encodes steps into one command encoder and submits them at once.

Only this module imports `wgpu`; the plugin and runtime modules do not, so registering the
plugin costs nothing and a machine without a WebGPU stack lists the backend as unavailable.

Adapter selection: the runtime hint "webgpu_adapter" or $MNNLLM_WEBGPU_ADAPTER: an index into
wgpu's adapter list (`mnnllm backends` shows it) or a power preference ("high-performance",
"low-power"); default: wgpu's high-performance adapter. Only the Vulkan, Metal and Direct3D 12
backends of wgpu are asked for: its GL backend adds no compute path worth having and, probing
EGL/Wayland, prints to stderr on machines without a display.

WebGPU orders `queue.write_buffer` before the next submit, so the host writes a buffer only
after what was encoded so far is submitted (`Recorder.flush`); reads (`queue.read_buffer`) wait
for the device. WebGPU command buffers run once: a replay keeps its steps (pipelines, bind
groups and parameters made once) and encodes them again for every token, one submit.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np
import wgpu

from mnnllm_core.backend_api import Execution

ENV_ADAPTER = "MNNLLM_WEBGPU_ADAPTER"
MAX_GROUPS = 65535  # a dispatch over more groups along x is folded into y
# UNIFORM too: a decode step's linear reads its input as a uniform block (linear_q4_texel.wgsl)
STORAGE = (wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_SRC
           | wgpu.BufferUsage.COPY_DST)
OPTIONAL_FEATURES = ("shader-f16", "subgroup")
LIMITS = ("max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage",
          "max-texture-dimension-2d", "max-storage-textures-per-shader-stage",
          "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
          "max-uniform-buffer-binding-size")


@lru_cache(maxsize=None)
def wgsl(name: str) -> str:
    return resources.files("mnnllm_webgpu.shaders").joinpath(f"{name}.wgsl").read_text()


def device_spec(hint: int | str | None) -> str | None:
    """The adapter selection: the hint, else the environment variable, else None (the default)."""
    chosen = hint if hint is not None else os.environ.get(ENV_ADAPTER)
    return None if chosen in (None, "") else str(chosen)


NATIVE_BACKENDS = ("Vulkan", "Metal", "DX12")


@lru_cache(maxsize=None)
def _instance() -> None:
    """Limit wgpu's instance to NATIVE_BACKENDS, once, before its first use (a wgpu without the
    extras, or an instance someone else made first, keeps wgpu's own choice). Without a display
    (no XDG_RUNTIME_DIR) Mesa's device-select layer, seeing the surface extensions wgpu enables,
    tries Wayland and prints an error line to stderr: the plugin presents nothing and picks its
    own adapter, so that layer is switched off there."""
    if "XDG_RUNTIME_DIR" not in os.environ:
        os.environ.setdefault("NODEVICE_SELECT", "1")
    try:
        from wgpu.backends.wgpu_native.extras import set_instance_extras
        set_instance_extras(backends=NATIVE_BACKENDS)
    except (ImportError, RuntimeError, ValueError):
        pass


def _adapters() -> list:
    _instance()
    return list(wgpu.gpu.enumerate_adapters_sync())


def _adapter(spec: str | None):
    if spec is None or spec in ("high-performance", "low-power"):
        _instance()
        adapter = wgpu.gpu.request_adapter_sync(power_preference=spec or "high-performance")
        if adapter is None:
            raise RuntimeError("wgpu found no adapter")
        return adapter
    found = _adapters()
    if not spec.isdigit() or int(spec) >= len(found):
        raise ValueError(f"{ENV_ADAPTER}/webgpu_adapter {spec!r}: not a power preference nor an index below "
                         f"{len(found)}")
    return found[int(spec)]


def describe_adapter(adapter) -> str:
    info = adapter.info
    return (f"{info.get('device') or info.get('vendor')} ({info.get('backend_type')}, "
            f"{info.get('adapter_type')}, {info.get('description')})")


def list_devices() -> list[str]:
    default = describe_adapter(_adapter(None))
    rows = []
    for i, adapter in enumerate(_adapters()):
        name = describe_adapter(adapter)
        rows.append(f"{i}: {name}" + (" [default]" if name == default else ""))
    return rows


class WebGPUDevice:
    """One adapter's device and queue, the features it was opened with and its limits."""

    def __init__(self, adapter):
        self.adapter = adapter
        self.features = [f for f in OPTIONAL_FEATURES if f in adapter.features]
        limits = {k: adapter.limits[k] for k in LIMITS if k in adapter.limits}
        self.device = adapter.request_device_sync(required_features=self.features, required_limits=limits)
        self.queue = self.device.queue
        self.max_binding = int(self.device.limits["max-storage-buffer-binding-size"])
        self.max_storage_bindings = int(self.device.limits["max-storage-buffers-per-shader-stage"])
        self.max_uniform = int(self.device.limits["max-uniform-buffer-binding-size"])
        self.max_texture = int(self.device.limits["max-texture-dimension-2d"])
        self.max_storage_textures = int(self.device.limits["max-storage-textures-per-shader-stage"])
        self.uniform_alignment = int(self.device.limits["min-uniform-buffer-offset-alignment"])
        self.description = describe_adapter(adapter)
        self.is_cpu = adapter.info.get("adapter_type") == "CPU"
        self.compiler = Compiler(self)
        self.dummy = self.device.create_buffer(size=16, usage=STORAGE)

    @property
    def subgroups(self) -> bool:
        """Whether the device was opened with subgroup operations (WGSL `enable subgroups;`)."""
        return "subgroup" in self.features

    @property
    def f16(self) -> bool:
        """Whether the device was opened with "shader-f16" (WGSL `enable f16;`, arrays of f16)."""
        return "shader-f16" in self.features

    @property
    def subgroup_size(self) -> int:
        """The subgroup size a kernel sees (subgroup_size.wgsl, run once); 0 without subgroups."""
        if "_subgroup_size" not in self.__dict__:
            size = 0
            if self.subgroups:
                out = self.device.create_buffer(size=16, usage=STORAGE)
                recorder = Recorder(self)
                recorder.run(Program(self, "subgroup_size", [out], None, (1, 1, 1)))
                recorder.flush()
                size = int(np.frombuffer(self.queue.read_buffer(out, 0, 4), np.uint32)[0])
            self._subgroup_size = size
        return self._subgroup_size

    def fits(self, nbytes: int) -> bool:
        """Whether `nbytes` fit one storage binding (max_storage_buffer_binding_size)."""
        return nbytes <= self.max_binding


@lru_cache(maxsize=None)
def open_device(spec: str | None) -> WebGPUDevice:
    return WebGPUDevice(_adapter(spec))


class Compiler:
    """WGSL file -> compute pipeline (entry point `main`, bind group 0 laid out by the shader),
    compiled once per device and set of `defines` (each `${KEY}` of the source replaced by its
    value: WGSL sizes function-scope arrays with constants, which pipeline overrides are not)."""

    def __init__(self, device: WebGPUDevice):
        self.device = device
        self.pipelines: dict[tuple, Any] = {}

    def pipeline(self, name: str, defines: tuple[tuple[str, Any], ...] = ()):
        found = self.pipelines.get((name, defines))
        if found is None:
            source = wgsl(name)
            for key, value in defines:
                source = source.replace("${" + key + "}", str(value))
            module = self.device.device.create_shader_module(code=source, label=name)
            found = self.pipelines[(name, defines)] = self.device.device.create_compute_pipeline(
                layout="auto", compute={"module": module, "entry_point": "main"}, label=name)
        return found


def pack_params(fmt: str, *values) -> bytes:
    """A uniform block: struct-packed little-endian, padded to 16 bytes."""
    data = struct.pack("<" + fmt, *values)
    return data + bytes(-len(data) % 16)


def fold(groups: int, local: int) -> tuple[tuple[int, int, int], int]:
    """(work-groups, invocations per dispatch row): a count above MAX_GROUPS folds into y."""
    groups = max(1, groups)
    if groups <= MAX_GROUPS:
        return (groups, 1, 1), groups * local
    y = -(-groups // MAX_GROUPS)
    x = -(-groups // y)
    return (x, y, 1), x * local


def resource(binding) -> Any:
    """A bind group entry's resource: a texture view as it is, a buffer whole or a (buffer,
    offset, nbytes) window of one."""
    if isinstance(binding, wgpu.GPUTextureView):
        return binding
    b, offset, size = binding if isinstance(binding, tuple) else (binding, 0, binding.size)
    return {"buffer": b, "offset": offset, "size": size}


class Program:
    """One kernel bound to its buffers (bindings 0..n-1, in order; a (buffer, offset, nbytes)
    triple binds that window; a texture view binds itself) and a uniform block of its parameters
    (binding n), dispatched over `groups`; made once per resize, recorded per run."""

    def __init__(self, device: WebGPUDevice, shader: str, buffers: list, params: bytes | None,
                 groups: tuple[int, int, int], defines: tuple[tuple[str, Any], ...] = ()):
        self.shader, self.groups = shader, tuple(int(g) for g in groups)
        self.pipeline = device.compiler.pipeline(shader, defines)
        entries = [{"binding": i, "resource": resource(b)} for i, b in enumerate(buffers)]
        if params:
            self.uniform = device.device.create_buffer_with_data(data=params, usage=wgpu.BufferUsage.UNIFORM)
            entries.append({"binding": len(buffers), "resource": {"buffer": self.uniform, "offset": 0,
                                                                   "size": self.uniform.size}})
        self.bind_group = device.device.create_bind_group(layout=self.pipeline.get_bind_group_layout(0),
                                                          entries=entries)

    def record(self, recorder: "Recorder") -> None:
        if 0 in self.groups:
            return
        compute = recorder.compute_pass()
        compute.set_pipeline(self.pipeline)
        compute.set_bind_group(0, self.bind_group)
        compute.dispatch_workgroups(*self.groups)


@dataclass(eq=False)
class Copy:
    """A device copy of `nbytes` (multiples of 4) between buffers; within one buffer through a temporary."""

    dst: Any
    src: Any
    nbytes: int
    dst_offset: int = 0
    src_offset: int = 0

    def record(self, recorder: "Recorder") -> None:
        recorder.copy(self.dst, self.src, self.nbytes, self.dst_offset, self.src_offset)


@dataclass(eq=False)
class CopyToTexture:
    """`rows` rows of a texture (a view) from a buffer at `offset`, one texel row of the texture's
    width per `bytes_per_row` (a multiple of 256)."""

    view: Any
    src: Any
    offset: int
    bytes_per_row: int
    rows: int

    def record(self, recorder: "Recorder") -> None:
        recorder.copy_to_texture(self.view, self.src, self.offset, self.bytes_per_row, self.rows)


@dataclass(eq=False)
class Fill:
    """Zeroes the first `nbytes` of a buffer."""

    buffer: Any
    nbytes: int

    def record(self, recorder: "Recorder") -> None:
        recorder.fill_zero(self.buffer, self.nbytes)


class Recorder:
    """Steps encoded into one command encoder (dispatches into one compute pass while no copy
    comes between), submitted by `flush`."""

    def __init__(self, device: WebGPUDevice):
        self.device = device
        self.encoder = None
        self.pass_ = None

    def _encoder(self):
        if self.encoder is None:
            self.encoder = self.device.device.create_command_encoder()
        return self.encoder

    def compute_pass(self):
        if self.pass_ is None:
            self.pass_ = self._encoder().begin_compute_pass()
        return self.pass_

    def _end_pass(self):
        if self.pass_ is not None:
            self.pass_.end()
            self.pass_ = None
        return self._encoder()

    def run(self, step) -> None:
        step.record(self)

    def copy(self, dst, src, nbytes: int, dst_offset: int = 0, src_offset: int = 0) -> None:
        if nbytes <= 0:
            return
        encoder = self._end_pass()
        if dst is src:  # WebGPU copies never read and write one buffer
            temp = self.device.device.create_buffer(size=nbytes, usage=STORAGE)
            encoder.copy_buffer_to_buffer(src, src_offset, temp, 0, nbytes)
            src, src_offset = temp, 0
        encoder.copy_buffer_to_buffer(src, src_offset, dst, dst_offset, nbytes)

    def copy_to_texture(self, view, src, offset: int, bytes_per_row: int, rows: int) -> None:
        texture = view.texture
        self._end_pass().copy_buffer_to_texture(
            {"buffer": src, "offset": offset, "bytes_per_row": bytes_per_row, "rows_per_image": rows},
            {"texture": texture}, (texture.size[0], rows, 1))

    def fill_zero(self, buffer, nbytes: int) -> None:
        if nbytes > 0:
            self._end_pass().clear_buffer(buffer, 0, nbytes)

    def flush(self) -> None:
        """Submit what was encoded (nothing when nothing was)."""
        if self.encoder is None:
            return
        self._end_pass()
        self.device.queue.submit([self.encoder.finish()])
        self.encoder = None


class Allocator:
    """Storage buffers (4-byte multiples) and the host copies."""

    def __init__(self, device: WebGPUDevice):
        self.device = device

    def alloc(self, nbytes: int):
        return self.device.device.create_buffer(size=-(-max(4, int(nbytes)) // 4) * 4, usage=STORAGE)

    def constant(self, array: np.ndarray):
        """A buffer holding `array`'s bytes (weights, tables), padded to 4 bytes."""
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        padded = np.zeros(-(-max(4, data.size) // 4) * 4, np.uint8)
        padded[:data.size] = data
        return self.device.device.create_buffer_with_data(data=padded, usage=STORAGE)

    def texture(self, height: int, width: int, channels: int = 4, array: np.ndarray | None = None,
                storage: bool = False):
        """A view of a 2D rgba32uint (4 channels), rg32uint (2) or r32uint (1) texture, holding
        `array` (uint32 [height, width, channels]) when given: what kernels read by texel fetches
        (lavapipe gathers those, a storage buffer it reads lane by lane); `storage`: bindable as a
        read-only storage texture too."""
        usage = wgpu.TextureUsage.TEXTURE_BINDING | wgpu.TextureUsage.COPY_DST
        texture = self.device.device.create_texture(
            size=(width, height, 1), format={4: "rgba32uint", 2: "rg32uint", 1: "r32uint"}[channels],
            usage=usage | wgpu.TextureUsage.STORAGE_BINDING if storage else usage)
        if array is not None:
            self.device.queue.write_texture({"texture": texture}, np.ascontiguousarray(array, np.uint32),
                                            {"bytes_per_row": width * channels * 4, "rows_per_image": height},
                                            (width, height, 1))
        return texture.create_view()

    def copyin(self, buffer, array: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        if data.size % 4:
            data = np.concatenate([data, np.zeros(-data.size % 4, np.uint8)])
        if data.size:
            self.device.queue.write_buffer(buffer, offset, data)

    def copyout(self, buffer, nbytes: int, offset: int = 0) -> np.ndarray:
        """uint8 [nbytes] of the buffer (waits for the device)."""
        if nbytes <= 0:
            return np.zeros(0, np.uint8)
        size = -(-nbytes // 4) * 4
        data = self.device.queue.read_buffer(buffer, buffer_offset=offset, size=size)
        return np.frombuffer(data, np.uint8)[:nbytes].copy()


def probe(spec: str | None) -> str:
    """Compile and run a tiny kernel (y = x + 1) on the selected adapter; its description, or raises."""
    device = open_device(spec)
    allocator = Allocator(device)
    x = allocator.constant(np.arange(4, dtype=np.float32))
    y = allocator.alloc(16)
    recorder = Recorder(device)
    recorder.run(Program(device, "probe", [x, y], None, (1, 1, 1)))
    recorder.flush()
    got = allocator.copyout(y, 16).view(np.float32)
    if not np.array_equal(got, [1, 2, 3, 4]):
        raise RuntimeError(f"the probe kernel gave {got.tolist()} instead of [1, 2, 3, 4]")
    return device.description


class StepsExecution(Execution):
    """An Execution whose run is a list of steps (Program, Copy, Fill) made in on_resize:
    on_execute encodes them into the backend's recorder, a replay keeps them."""

    def __init__(self, backend):
        super().__init__(backend)
        self.steps: list = []

    def on_execute(self, inputs, outputs) -> None:
        recorder = self.backend.recorder
        for step in self.steps:
            recorder.run(step)

    def replay_steps(self, inputs, outputs) -> list:
        return list(self.steps)
