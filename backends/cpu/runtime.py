"""The numpy cpu backend: storage is numpy arrays, executions are numpy/BLAS calls."""
from __future__ import annotations

import logging
import os
import platform
from collections import defaultdict
from typing import Any

import numpy as np

from mnnllm_core.core.backend import Backend, BackendConfig, Runtime, RuntimeCreator, ScheduleConfig
from mnnllm_core.core.tensor import Tensor

from .ops import CREATORS

log = logging.getLogger(__name__)


class CPUBackend(Backend):
    name = "cpu"

    def __init__(self, runtime: "CPURuntime", config: BackendConfig):
        super().__init__(runtime, config)
        self._free: dict[tuple, list[np.ndarray]] = defaultdict(list)

    def on_acquire_buffer(self, tensor: Tensor) -> None:
        key = (tensor.shape, tensor.dtype.str)
        pool = self._free.get(key)
        tensor.storage = pool.pop() if pool else np.empty(tensor.shape, dtype=tensor.dtype)

    def on_release_buffer(self, tensor: Tensor) -> None:
        if tensor.storage is not None:
            self._free[(tensor.shape, tensor.dtype.str)].append(tensor.storage)

    def on_clear_buffer(self) -> None:
        self._free.clear()

    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        tensor.storage[...] = np.asarray(array).reshape(tensor.shape)

    def download(self, tensor: Tensor) -> np.ndarray:
        return tensor.storage


class CPURuntime(Runtime):
    name = "cpu"

    def __init__(self, config: ScheduleConfig, hints: dict[str, Any] | None = None):
        super().__init__(config, hints)
        self.op_creators.update(CREATORS)
        # more BLAS threads than cores only makes threads wait on each other
        self.thread_num = max(1, min(int(config.thread_num), os.cpu_count() or 1))
        self._limits = _limit_blas_threads(self.thread_num)

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
    name = "cpu"
    static_shapes = False

    def is_available(self) -> tuple[bool, str]:
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        ok = np.array_equal(a @ a.T, np.array([[5, 14], [14, 50]], dtype=np.float32))
        return (True, "") if ok else (False, "numpy matmul gave a wrong result")

    def create(self, config: ScheduleConfig, hints: dict[str, Any] | None = None) -> CPURuntime:
        return CPURuntime(config, hints)

    def devices(self) -> list[str]:
        return [f"{platform.machine()} cpu x{os.cpu_count()}"]
