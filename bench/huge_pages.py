"""The int4 GEMV over packs in transparent huge pages against the same packs in 4 KiB pages.

numpy asks the kernel for huge pages (madvise) for arrays of 4 MiB or more; an anonymous mmap of
our own gets 4 KiB pages. Their first touch is cheaper, but every 4 KiB of a streamed weight is
then a TLB miss: this times the decode GEMV of `kernels/linear.py` over 24 weights of the 1.7B
shape's MLP (8,192 x 2,048, 4 bit, block 64: 192 MiB in all, read from memory, not cache), the
two kinds of memory taking turns, medians of `-n` rounds, per thread count.

    python bench/huge_pages.py [-n 12] [--threads 1,2]
"""
from __future__ import annotations

import argparse
import mmap
import re
import statistics
import time

import numpy as np

from mnnllm_backends.cpu.kernels.layout import PackedWeight
from mnnllm_backends.cpu.kernels.linear import Gemv

OC, IC, BLOCK, LAYERS = 8192, 2048, 64, 24


def packed(huge: bool, rng: np.random.Generator) -> PackedWeight:
    """A random 4-bit weight whose codes are in a numpy array (huge pages) or a mapping (4 KiB)."""
    n = OC * IC // 2
    codes = np.empty(n, np.uint8) if huge else np.frombuffer(mmap.mmap(-1, n), np.uint8)
    codes[:] = rng.integers(0, 256, n, dtype=np.uint8)
    alpha = np.full((OC // 32, IC // BLOCK, 64), 0.01, np.float32)
    return PackedWeight(4, OC, IC, BLOCK, codes, alpha)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=12)
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(IC).astype(np.float32)
    gemvs = {huge: [Gemv([packed(huge, rng)]) for _ in range(LAYERS)] for huge in (True, False)}
    rollup = open("/proc/self/smaps_rollup").read()
    print("huge pages held:", re.search(r"AnonHugePages:\s+(\d+ kB)", rollup).group(1), "of", LAYERS * OC * IC // 2 >> 20, "MiB of codes")
    gigabytes = LAYERS * OC * IC / 2 / 1e9
    for threads in (int(t) for t in args.threads.split(",")):
        times = {True: [], False: []}
        for _ in range(args.n):
            for huge in (True, False):
                start = time.perf_counter()
                for gemv in gemvs[huge]:
                    gemv(x, threads)
                times[huge].append(time.perf_counter() - start)
        huge_s, small_s = statistics.median(times[True]), statistics.median(times[False])
        print(f"{threads} thread(s): huge pages {huge_s * 1e3:.1f} ms ({gigabytes / huge_s:.1f} GB/s), "
              f"4 KiB pages {small_s * 1e3:.1f} ms ({gigabytes / small_s:.1f} GB/s): {small_s / huge_s:.2f}x the time")


if __name__ == "__main__":
    main()
