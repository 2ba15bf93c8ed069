"""The pyopencl-touching half of the backend, kept as small as tinygrad's ops_cl.py:
device selection, an Allocator (alloc / copyin / copyout / copy), a Compiler (source and
options -> built program, cached per process) and a Program (one kernel with bound arguments).

Only this module imports pyopencl; importing the plugin or the runtime module does not touch
OpenCL, so a machine without a driver can still list the backend as unavailable.

Device selection: `MNNLLM_OPENCL_DEVICE="platform:device"` (indices as `clinfo -l` prints them),
or the runtime hint "opencl_device" with the same syntax; default: the first GPU found, else the
first device of any type.
"""
from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from functools import lru_cache, partial
from importlib import resources
from typing import Any, Callable

import numpy as np
import pyopencl as cl

from mnnllm_core.backend_api import Execution

log = logging.getLogger(__name__)

ENV_DEVICE = "MNNLLM_OPENCL_DEVICE"


def list_devices() -> list[tuple[str, cl.Device]]:
    """Every device of every platform as ("platform:device", device); empty without a driver."""
    try:
        platforms = cl.get_platforms()
    except cl.Error as err:
        raise RuntimeError(f"no OpenCL driver found (no ICD in /etc/OpenCL/vendors or $OCL_ICD_VENDORS; "
                           f"install e.g. pocl-opencl-icd): {err}") from err
    found = []
    for p, platform in enumerate(platforms):
        for d, device in enumerate(platform.get_devices()):
            found.append((f"{p}:{d}", device))
    return found


def select_device(spec: str | None) -> cl.Device:
    """The device named by `spec` ("platform:device"), else the first GPU, else the first device."""
    devices = list_devices()
    if not devices:
        raise RuntimeError("no OpenCL platform or device found (is an ICD such as pocl-opencl-icd installed?)")
    if spec:
        for key, device in devices:
            if key == spec.strip():
                return device
        raise RuntimeError(f"OpenCL device {spec!r} does not exist; devices: {', '.join(k for k, _ in devices)}")
    gpus = [d for _, d in devices if d.type & cl.device_type.GPU]
    return gpus[0] if gpus else devices[0][1]


@dataclass(eq=False)
class CLDevice:
    """One device with its context: shared by every Runtime of the process on that device, so
    that a program is compiled once per process per (source, options)."""

    device: cl.Device
    context: cl.Context
    programs: dict[tuple[str, str], cl.Program] = field(default_factory=dict)

    @property
    def is_cpu(self) -> bool:
        return bool(self.device.type & cl.device_type.CPU)

    @property
    def has_fp16(self) -> bool:
        return "cl_khr_fp16" in self.device.extensions.split()

    @property
    def tuning_key(self) -> str:
        """What a tuned kernel choice holds for: platform, device and driver (TuningCache)."""
        d = self.device
        return f"opencl | {d.platform.name.strip()} {d.platform.version.strip()} | {d.name.strip()} | " \
               f"driver {d.driver_version.strip()}"

    @property
    def description(self) -> str:
        kind = cl.device_type.to_string(self.device.type)
        return f"{self.device.name.strip()} ({kind}, {self.device.platform.name.strip()}, " \
               f"{self.device.max_compute_units} CUs)"


_DEVICES: dict[int, CLDevice] = {}


def open_device(spec: str | None) -> CLDevice:
    device = select_device(spec)
    key = device.int_ptr
    if key not in _DEVICES:
        _DEVICES[key] = CLDevice(device, cl.Context([device]))
    return _DEVICES[key]


class Compiler:
    """OpenCL C source + build options -> program, built once per process per (source, options)
    on a device; pyopencl also caches the binaries on disk (and pocl in ~/.cache/pocl)."""

    def __init__(self, device: CLDevice):
        self.device = device

    def build(self, source: str, options: str = "") -> cl.Program:
        key = (source, options)
        program = self.device.programs.get(key)
        if program is None:
            program = cl.Program(self.device.context, source).build(options=options.split())
            self.device.programs[key] = program
        return program

    def build_file(self, name: str, options: str = "") -> cl.Program:
        """A kernel file of `mnnllm_backends.opencl.kernels`, after the shared `common.cl`."""
        return self.build(kernel_source(name), options)


@lru_cache(maxsize=None)
def kernel_digest() -> str:
    """A digest of every kernel file: what a device's build of them holds for."""
    digest = hashlib.sha256()
    for path in sorted(resources.files("mnnllm_backends.opencl.kernels").iterdir(), key=lambda p: p.name):
        if path.name.endswith(".cl"):
            digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


@lru_cache(maxsize=None)
def kernel_source(name: str) -> str:
    kernels = resources.files("mnnllm_backends.opencl.kernels")
    return kernels.joinpath("common.cl").read_text() + kernels.joinpath(name).read_text()


class Program:
    """One kernel whose arguments are bound once (at resize), so a run is one enqueue."""

    def __init__(self, program: cl.Program, name: str):
        self.kernel = cl.Kernel(program, name)
        self.global_size: tuple[int, ...] = ()
        self.local_size: tuple[int, ...] | None = None

    def bind(self, global_size: tuple[int, ...], local_size: tuple[int, ...] | None, *args) -> "Program":
        self.global_size, self.local_size = tuple(int(g) for g in global_size), local_size
        self.kernel.set_args(*args)
        return self

    def __call__(self, queue: cl.CommandQueue) -> None:
        if all(self.global_size):
            cl.enqueue_nd_range_kernel(queue, self.kernel, self.global_size, self.local_size)

    def bound(self, queue: cl.CommandQueue) -> Callable[[], Any] | None:
        """This kernel's enqueue on `queue` with its sizes bound, what a replay calls per token
        (no lookups left); None when the kernel is empty."""
        if not all(self.global_size):
            return None
        return partial(cl.enqueue_nd_range_kernel, queue, self.kernel, self.global_size, self.local_size)


class ProgramExecution(Execution):
    """An Execution that enqueues one Program bound in on_resize."""

    def __init__(self, backend):
        super().__init__(backend)
        self.program: Program | None = None

    def on_execute(self, inputs, outputs) -> None:
        self.program(self.backend.queue)

    def replay_steps(self, inputs, outputs) -> list:
        """What a replay enqueues per run: the bound program."""
        return [self.program]


class Allocator:
    """Device buffers and the host<->device copies; 0-byte requests get a 4-byte buffer
    (OpenCL forbids empty buffers)."""

    def __init__(self, device: CLDevice, queue: cl.CommandQueue):
        self.context, self.queue = device.context, queue

    def alloc(self, nbytes: int) -> cl.Buffer:
        return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, max(int(nbytes), 4))

    def constant(self, array: np.ndarray) -> cl.Buffer:
        """A read-only buffer initialised from host memory (packed weights, norm gammas)."""
        data = np.ascontiguousarray(array)
        if data.nbytes == 0:
            data = np.zeros(1, np.float32)
        return cl.Buffer(self.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=data)

    def copyin(self, buffer: cl.Buffer, array: np.ndarray) -> None:
        if array.nbytes:
            cl.enqueue_copy(self.queue, buffer, np.ascontiguousarray(array), is_blocking=True)

    def copyout(self, array: np.ndarray, buffer: cl.Buffer) -> np.ndarray:
        if array.nbytes:
            cl.enqueue_copy(self.queue, array, buffer, is_blocking=True)
        return array

    def copy(self, dst: cl.Buffer, src: cl.Buffer, nbytes: int, dst_offset: int = 0, src_offset: int = 0) -> None:
        if nbytes:
            cl.enqueue_copy(self.queue, dst, src, byte_count=int(nbytes), dst_offset=int(dst_offset),
                            src_offset=int(src_offset))


def probe(spec: str | None) -> str:
    """Build and run a tiny kernel on the selected device; returns its description."""
    device = open_device(spec)
    queue = cl.CommandQueue(device.context)
    program = Compiler(device).build("__kernel void probe(__global float *a) { a[get_global_id(0)] *= 2.0f; }")
    host = np.arange(4, dtype=np.float32)
    allocator = Allocator(device, queue)
    buffer = allocator.alloc(host.nbytes)
    allocator.copyin(buffer, host)
    Program(program, "probe").bind((4,), None, buffer)(queue)
    result = allocator.copyout(np.empty_like(host), buffer)
    if not np.array_equal(result, host * 2):
        raise RuntimeError(f"the probe kernel computed {result.tolist()} instead of {(host * 2).tolist()}")
    return device.description


def device_spec(hint: str | None) -> str | None:
    """The device the "opencl_device" hint names, else $MNNLLM_OPENCL_DEVICE, else None (default)."""
    return hint or os.environ.get(ENV_DEVICE) or None
