"""How fast the cpu backend's one-token linears stream their weights, against how fast the memory
reads: whether a decode is bound by the memory or by the kernel's instructions.

Random 4-bit weights (blocks of 64, fp16 alphas) packed as a model's are, `--count` of them so that
they outnumber the last-level cache, each multiplied by one token's x in turn: the exact fp32
GEMV (`linear.Gemv`, numba's pool splitting rows with threads) and, on a cpu with AVX512-VNNI,
the int8-activation linear (`int8_dot.BoundLinear`). Each speed is the bytes of the packed
weights over the time of one pass over them all (GB/s, 1e9 bytes); the memory's is numpy's `max`
over a buffer of the same size (`mnnllm_core/bench/memory_probe.py`), read in the same round,
at 1 and 2 threads, the rounds one after another so that all share the host's changing load.

    python bench/gemv_bandwidth.py [--rows 14336] [--inputs 4096] [--count 10] [-n 7]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from mnnllm_backends.cpu.kernels import int8_dot, linear, set_threads
from mnnllm_backends.cpu.kernels.layout import pack
from mnnllm_core.bench.memory_probe import reads_gbs
from mnnllm_core.core.weights.formats import QuantizedWeight

BLOCK = 64


def random_weight(rng: np.random.Generator, oc: int, ic: int) -> QuantizedWeight:
    blocks = ic // BLOCK
    zero = (rng.standard_normal((oc, blocks)) * 0.1).astype(np.float16).astype(np.float32)
    scale = (rng.random((oc, blocks)) * 0.02 + 0.001).astype(np.float16).astype(np.float32)
    return QuantizedWeight(4, BLOCK, oc, ic, rng.integers(0, 256, oc * ic // 2, dtype=np.uint8), zero, scale)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=14336, help="output rows of a weight")
    parser.add_argument("--inputs", type=int, default=4096, help="inputs of a weight (a multiple of 64)")
    parser.add_argument("--count", type=int, default=10, help="weights (their bytes should outnumber the cache)")
    parser.add_argument("-n", "--rounds", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    weights = [random_weight(rng, args.rows, args.inputs) for _ in range(args.count)]
    x = rng.standard_normal(args.inputs).astype(np.float32)
    rows = x.reshape(1, -1)
    gemvs = [linear.Gemv([pack(w)]) for w in weights]
    for gemv in gemvs:
        gemv.parallel_worth = True  # split with threads whatever the weight's size
    fp32_bytes = sum(g.nbytes for g in gemvs)
    runs = {}
    for threads in (1, 2):
        runs[f"fp32 t{threads}"] = (fp32_bytes, lambda t=threads: [g(x, t) for g in gemvs])
    if int8_dot.supported():
        packed = [int8_dot.pack(w) for w in weights]
        int8_bytes = sum(p.nbytes for p in packed)
        for threads in (1, 2):
            calls = [int8_dot.BoundLinear(p, rows, np.zeros((1, p.rows), np.float32), False, threads) for p in packed]
            runs[f"int8 t{threads}"] = (int8_bytes, lambda c=calls: [call() for call in c])
    print(f"{args.count} weights of {args.rows} x {args.inputs}: {fp32_bytes / 1e6:.0f} MB packed")
    speeds: dict[str, list[float]] = {}
    for _ in range(args.rounds + 1):  # the first round compiles and touches: not counted
        for threads in (1, 2):
            set_threads(threads)
            speeds.setdefault(f"memory t{threads}", []).append(reads_gbs(threads, fp32_bytes, 1)[0])
            for name, (nbytes, run) in runs.items():
                if name.endswith(f"t{threads}"):
                    start = time.perf_counter()
                    run()
                    speeds.setdefault(name, []).append(nbytes / (time.perf_counter() - start) / 1e9)
    print("| reads | median GB/s | best GB/s |\n|---|---:|---:|")
    for name, values in speeds.items():
        print(f"| {name} | {statistics.median(values[1:]):.1f} | {max(values[1:]):.1f} |")


if __name__ == "__main__":
    main()
