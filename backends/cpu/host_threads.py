"""Blocks of numpy work spread over the runtime's threads, BLAS on one thread inside each.

A prefill's attention is many small BLAS calls (two per kv head, group and block of queries).
Each call with BLAS's own threads wakes them and waits for them; on a loaded machine a wait lasts
until the scheduler runs the other thread, and a 4,096-token prefill's attention took minutes.
Here BLAS runs on the calling thread for the duration, and the blocks are spread over our own
threads instead: one wait per op, not one per call. A block gives the same bits whichever
thread computes it, so the output is the same at every thread_num (BLAS's on one thread).
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Callable, Iterable


class HostThreads:
    """`count` threads (the caller and count - 1 workers, started on first use)."""

    def __init__(self, count: int) -> None:
        self.count = max(1, int(count))
        self._pool: ThreadPoolExecutor | None = None
        self._blas = _blas_controller()

    def blas_on_one_thread(self):
        """A context in which BLAS calls run on the calling thread (process-wide, as BLAS's setting is)."""
        return self._blas.limit(limits=1) if self._blas is not None else nullcontext()

    def run(self, task: Callable[[object], None], items: Iterable) -> None:
        """task(item) for every item, BLAS on one thread; items are taken in order by whichever
        thread is free (put the costly ones first)."""
        items = list(items)
        with self.blas_on_one_thread():
            if self.count == 1 or len(items) < 2:
                for item in items:
                    task(item)
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.count - 1, thread_name_prefix="mnnllm-cpu")
            _drain_together(self._pool, min(self.count, len(items)), task, items)


def _drain_together(pool: ThreadPoolExecutor, threads: int, task, items: list) -> None:
    """The caller and threads - 1 workers take items from one queue until it is empty; the
    first error is raised once every thread has stopped."""
    lock, position = threading.Lock(), [0]
    failed = threading.Event()

    def drain() -> None:
        while not failed.is_set():
            with lock:
                at = position[0]
                position[0] += 1
            if at >= len(items):
                return
            try:
                task(items[at])
            except BaseException:
                failed.set()
                raise

    workers = [pool.submit(drain) for _ in range(threads - 1)]
    error = None
    try:
        drain()
    except BaseException as err:  # an interrupt included: wait for the workers, then raise it
        error = err
    for worker in workers:
        try:
            worker.result()
        except BaseException as err:
            error = error or err
    if error is not None:
        raise error


def _blas_controller():
    """threadpoolctl's controller of the BLAS libraries loaded, or None without threadpoolctl
    (the runtime has said that thread_num does not reach BLAS then)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController().select(user_api="blas")
