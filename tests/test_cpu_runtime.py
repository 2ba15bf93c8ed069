"""The cpu runtime honours thread_num for BLAS, capped at the cores there are."""
import os

import pytest
from threadpoolctl import threadpool_info

from mnnllm_core.core.backend import ScheduleConfig
from mnnllm_core.express.runtime_manager import RuntimeManager


def _blas_threads() -> set[int]:
    return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}


@pytest.mark.skipif(not _blas_threads(), reason="numpy's BLAS is not visible to threadpoolctl")
def test_thread_num_sets_the_blas_thread_count():
    runtime = RuntimeManager.create(ScheduleConfig(backend_type="cpu", thread_num=1))
    assert runtime.runtime.thread_num == 1 and _blas_threads() == {1}
    runtime = RuntimeManager.create(ScheduleConfig(backend_type="cpu", thread_num=10_000))
    assert runtime.runtime.thread_num == os.cpu_count() and _blas_threads() == {os.cpu_count()}
