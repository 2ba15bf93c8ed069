"""How fast this host reads its memory: the bandwidth the decode roofline is judged against.

A decode step streams every weight once, so bytes per token x tokens per second is what the
weights were read at, and the question is how close that comes to what the memory gives. A
plain loop of loads measures the loop, not the memory (one scalar a cycle); numpy's `max` over
float32 is vectorized (AVX2 / AVX-512 / NEON) and reads as fast as the cores can ask, so it is
the probe here, as STREAM's read kernels are elsewhere. The buffer is four times the last-level
cache (a read from cache would flatter the memory) and each thread reduces a slice of its own:
numpy releases the GIL inside a reduction, so `threads` slices are read at once. The best of
ROUNDS reads is reported, as STREAM does: what the memory can give, not what a noisy host gave;
and their median, what it gave most of the time. On a shared host the two differ: one read in
several comes out ~7% above the others (a VM of 2 Xeon cores: 15.5-16.1 GB/s, then 17.0), and a
decode's speed, the mean over seconds of streaming, is judged against both (`report._roofline`).
The probe runs in a worker process of its own (`mnnllm bench`), so its buffer never counts in a
model run's peak memory.
"""
from __future__ import annotations

import glob
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .worker_protocol import worker_main

MIN_BYTES, MAX_BYTES = 256 << 20, 2 << 30  # bounds of the buffer, whatever the cache size says


def last_level_cache_bytes() -> int:
    """The largest cache sysfs reports for cpu0 (Linux), or 0 where it says nothing."""
    largest = 0
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            largest = max(largest, int(digits) * scale)
    return largest


def buffer_bytes() -> int:
    """Four times the last-level cache, within MIN_BYTES..MAX_BYTES and a quarter of the free memory."""
    wanted = min(max(4 * last_level_cache_bytes(), MIN_BYTES), MAX_BYTES)
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return wanted
    return max(min(wanted, available // 4), 16 << 20)


ROUNDS = 9  # reads of the buffer per thread count


def reads_gbs(threads: int, nbytes: int | None = None, rounds: int = ROUNDS) -> list[float]:
    """GB/s (1e9 bytes) at which `threads` threads read a buffer of `nbytes`, once per round."""
    nbytes = buffer_bytes() if nbytes is None else nbytes
    data = np.ones(nbytes // 4, np.float32)  # written once: every page is mapped before the timing
    slices = np.array_split(data, max(1, threads))
    speeds = []
    with ThreadPoolExecutor(max(1, threads - 1)) as pool:
        for _ in range(rounds):
            start = time.perf_counter()
            others = [pool.submit(np.max, part) for part in slices[1:]]
            np.max(slices[0])
            for other in others:
                other.result()
            speeds.append(data.nbytes / (time.perf_counter() - start) / 1e9)
    return speeds


def run(job: dict) -> dict:
    """The worker's job: {"threads": [1, 2, ...]} -> {"read_gbs": {"1": GB/s (the best read), ...},
    "median_gbs": {"1": GB/s (the median read), ...}, "rounds": reads each, "bytes": buffer size}."""
    nbytes = buffer_bytes()
    speeds = {str(t): reads_gbs(int(t), nbytes) for t in job["threads"]}
    return {"read_gbs": {t: max(s) for t, s in speeds.items()},
            "median_gbs": {t: statistics.median(s) for t, s in speeds.items()}, "rounds": ROUNDS, "bytes": nbytes}


if __name__ == "__main__":
    worker_main(run)
