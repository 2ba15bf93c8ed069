"""The numpy cpu backend: storage is numpy arrays, executions are numpy/BLAS calls, and with
`memory: "low"` numba kernels on packed int4/int8 weights (`kernels/`)."""
from __future__ import annotations

import logging
import os
import platform
from dataclasses import dataclass
from typing import Any

import numpy as np

from mnnllm_core.backend_api import (BackendConfig, HostBackend, Runtime, RuntimeCreator, RuntimeHints,
                                     ScheduleConfig)

from .buffer_pool import SizedBufferPool
from .host_threads import HostThreads
from .kv_memory import KVMemory
from .kv_storage import StoredKinds
from .ops import CREATORS

# rows per slab of a long step's row-wise chains (the memory "low" MLP: gate, up, their product
# and down), the core's row_slabs.py: slabs of 512 to 1,023 rows keep the GEMM's panels reused
# over hundreds of rows and three [slab, intermediate] buffers where the step held [rows, ...]
ROW_SLAB = 512

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CPUHints(RuntimeHints):
    """`cpu_int8_activations`: under memory "low", quantize each linear's input to int8 per token
    row and multiply with integer dot products (`ops/int8_linear.py`), as MNN's memory-low path
    does: faster, but not fp32-exact (off by default; cpus without AVX512-VNNI ignore it).
    `cpu_thread_team`: with thread_num > 1 at memory "low", a replayed step's programs run on a
    team of threads kept for the runtime's life, every linear split over them (`kernels/team.py`;
    the same bits as on one thread); off, each program runs on the calling thread and only
    linears over 2 MiB split, over numba's pool."""

    cpu_int8_activations: bool = False
    cpu_thread_team: bool = True


class CPUBackend(HostBackend):
    name = "cpu"
    row_slab = ROW_SLAB

    def __init__(self, runtime: "CPURuntime", config: BackendConfig):
        super().__init__(runtime, config)
        self.pool = SizedBufferPool()  # step buffers shared across shapes (buffer_pool.py)
        self._scratch: dict[str, np.ndarray] = {}
        self.run_count = 0
        self.shared_inputs: dict[Any, object] = {}  # input tensor index (("int8", index)) -> linears reading it
        self.shared_twins: dict[int, object] = {}  # id of a cloned session's SharedInput -> this one's

    def low_memory(self) -> bool:
        """memory "low" with the numba kernels at hand: packed weights and the fused kernels (`kernels/`)."""
        return self.config.memory == "low" and self.runtime.low_memory_kernels()

    def scratch(self, name: str, size: int) -> np.ndarray:
        """A float32 buffer of at least `size` reused by every execution of this backend."""
        buffer = self._scratch.get(name)
        if buffer is None or buffer.size < size:
            buffer = self._scratch[name] = np.empty(size, np.float32)
        return buffer

    def on_execute_begin(self) -> None:
        self.run_count += 1
        self.runtime.apply_threads()

    def on_record(self, commands) -> "CPUReplay":
        from .replay import CPUReplay
        compiled = self.low_memory()
        return CPUReplay(commands, compiled=compiled, team=self.runtime.team() if compiled else None)


class CPURuntime(Runtime):
    name = "cpu"
    hints_type = CPUHints
    reads_host_memory = True

    def __init__(self, config: ScheduleConfig, hints: dict[str, Any] | None = None):
        super().__init__(config, hints)
        self.op_creators.update(CREATORS)
        # more BLAS threads than cores only makes threads wait on each other
        self.thread_num = max(1, min(int(config.thread_num), os.cpu_count() or 1))
        self._limits = _limit_blas_threads(self.thread_num)
        self.host_threads = HostThreads(self.thread_num)  # numpy work split by the ops themselves
        self._kernels = None  # the numba kernels module once loaded, False when numba is missing
        self._kernel_parts: set[str] = set()  # the parts of it loaded (`kernels/warmup.py`)
        self._team = None  # the replay's thread team (`kernels/team.py`), started on first use
        self.kv_memory = KVMemory(self.hints.kvcache_mmap, self.hints.kvcache_limit, self.hints.tmp_path)
        self.kv_format = StoredKinds.of(self.hints.attention_mode, self.hints.kv_fp16)

    def kv_storage(self) -> str:
        return self.kv_format.storage

    def low_memory_kernels(self) -> bool:
        """Load the packed-weight kernels on first use (numba's import is paid only by memory "low")."""
        if self._kernels is None:
            try:
                from . import kernels
            except ImportError as err:
                log.warning("numba is not installed (%s): memory \"low\" computes on fp32 weights", err)
                self._kernels = False
            else:
                self._kernels = kernels
                self.apply_threads()
                from .kernels.warmup import parts_for
                kv = self.kv_format
                stored = not kv.exact and "f16" not in (kv.keys, kv.values)  # a StoredKVCache's rows, read as stored
                self.load_kernels(*parts_for(self.thread_num, kv_stored=stored,
                                             int8_activations=self.hints.cpu_int8_activations))
        return bool(self._kernels)

    def load_kernels(self, *parts: str) -> None:
        """Load these parts of the kernels (`kernels/warmup.py`) once, compiling them first
        (announced) on a machine's first run: a rarer op asks for its part when it is created or resized."""
        wanted = [part for part in parts if part not in self._kernel_parts]
        if wanted and self.low_memory_kernels():
            from .kernels.warmup import warm_up
            warm_up(self.thread_num, wanted)
            self._kernel_parts.update(wanted)

    def team(self):
        """The thread team the replayed programs run on (None: one thread, or the hint is off)."""
        if self.thread_num < 2 or not self.hints.cpu_thread_team or not self.low_memory_kernels():
            return None
        if self._team is None:
            from .kernels.team import Team
            self._team = Team(self.thread_num)
        return self._team

    def close_team(self) -> None:
        """Stop and join the team's workers (a later replay starts a new team)."""
        if self._team is not None:
            self._team.close()
            self._team = None

    def apply_threads(self) -> None:
        """thread_num for the numba kernels launched from the calling thread."""
        if self._kernels:
            self._kernels.set_threads(self.thread_num)

    def create_backend(self, config: BackendConfig) -> CPUBackend:
        return CPUBackend(self, config)

    def device_name(self) -> str:
        return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores, numpy {np.__version__})"


def _limit_blas_threads(threads: int):
    """Honour thread_num: BLAS uses at most this many threads (process-wide, like MNN's pool)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        log.warning("threadpoolctl is not installed: thread_num is not applied to BLAS")
        return None
    return threadpool_limits(limits=threads, user_api="blas")


class CPURuntimeCreator(RuntimeCreator):
    """thread_num for BLAS and the numba kernels; memory "low" keeps quantized weights packed,
    "normal"/"high" dequantize them once to fp32; fp32 on every precision."""

    name = "cpu"
    static_shapes = False
    settings = frozenset({"thread_num", "memory", "attention_mode"})
    hints_type = CPUHints

    def is_available(self) -> tuple[bool, str]:
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        ok = np.array_equal(a @ a.T, np.array([[5, 14], [14, 50]], dtype=np.float32))
        return (True, "") if ok else (False, "numpy matmul gave a wrong result")

    def create(self, config: ScheduleConfig, hints: dict[str, Any] | None = None) -> CPURuntime:
        return CPURuntime(config, hints)

    def devices(self) -> list[str]:
        return [f"{platform.machine()} cpu x{os.cpu_count()}"]
