"""The numpy cpu backend: storage is numpy arrays, executions are numpy/BLAS calls."""
from __future__ import annotations

import logging
import os
import platform
from typing import Any

import numpy as np

from mnnllm_core.backend_api import BackendConfig, HostBackend, Runtime, RuntimeCreator, ScheduleConfig

from .ops import CREATORS

log = logging.getLogger(__name__)


class CPUBackend(HostBackend):
    name = "cpu"


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
    """fp32 on every precision; weights dequantized once at load whatever `memory` says."""

    name = "cpu"
    static_shapes = False
    settings = frozenset({"thread_num"})

    def is_available(self) -> tuple[bool, str]:
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        ok = np.array_equal(a @ a.T, np.array([[5, 14], [14, 50]], dtype=np.float32))
        return (True, "") if ok else (False, "numpy matmul gave a wrong result")

    def create(self, config: ScheduleConfig, hints: dict[str, Any] | None = None) -> CPURuntime:
        return CPURuntime(config, hints)

    def devices(self) -> list[str]:
        return [f"{platform.machine()} cpu x{os.cpu_count()}"]
