"""Could the exact path's one-token GEMV multiply integers? Each input row rounded to D balanced
int8 digits (x ~ ds * M, |M| < 2^(8D - 1), M = d0 + 256 d1 + 65536 d2 ...) is D rows of the
int8-activation kernel (`int8_dot`, AVX512-VNNI `vpdpbusd`), whose integer sums are exact: the
only error is the rounding of x to M. This measures, on the shared model:

- accuracy: the output of every linear of a few decode steps against float64, for the fp32 kernel
  and for x rounded to D digits (one scale a row, or a block of 64 inputs);
- tokens: greedy decoding of the reference prompts with every linear's input so rounded (the fp32
  kernels then multiply the rounded x), against MNN's memory-normal tokens;
- speed: the int8 kernel with 1, 3 and 4 rows (1 and 3 digits of one token, 4 of them) against the
  fp32 GEMV of one row, one thread, weights in cache and from memory (GB/s of packed bytes).

    python bench/integer_digits_probe.py [--digits 1,2,3] [--rounds 21]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import mnnllm_core
from mnnllm_backends.cpu.kernels import int8_dot, linear, set_threads
from mnnllm_backends.cpu.kernels.layout import pack
from mnnllm_backends.cpu.ops import packed_linear

from gemv_bandwidth import random_weight
from shared_models import SHARED_MODEL

MODEL = SHARED_MODEL.parent
BLOCK = 64


def rounded(x: np.ndarray, digits: int, per_block: bool) -> np.ndarray:
    """x (float32, rows last) rounded to `digits` balanced int8 digits of one scale per row or per
    block of BLOCK inputs, in float64: what an integer GEMV on those digits computes exactly."""
    top = 127 * (256 ** digits - 1) // 255  # the largest M whose balanced digits are all within [-127, 127]
    x64 = np.asarray(x, np.float64)
    groups = x64.reshape(-1, BLOCK) if per_block and x64.shape[-1] % BLOCK == 0 else x64.reshape(-1, x64.shape[-1])
    largest = np.abs(groups).max(axis=1, keepdims=True)
    step = np.where(largest > 0, largest / top, 1.0)
    return (np.rint(groups / step) * step).reshape(x64.shape)


def load_model():
    model = mnnllm_core.create(str(MODEL / "config.json"))
    # one thread, no replay: every linear goes through the Python calls patched below
    model.set_config({"sampler_type": "greedy", "thread_num": 1, "memory": "low", "backend_hints": {"replay": False}})
    return model.load()


def accuracy(prompt_ids: list[int], digit_counts: list[int]) -> None:
    seen = []
    plain = linear.Gemv.__call__

    def recording(gemv, x, threads):
        results = plain(gemv, x, threads)
        seen.append((gemv.first, np.array(x), results[0].copy()))
        return results

    linear.Gemv.__call__ = recording
    try:
        load_model().generate(prompt_ids, 3)
    finally:
        linear.Gemv.__call__ = plain
    errors: dict[str, list[float]] = {}
    weights: dict[int, np.ndarray] = {}
    for weight, x, got in seen:
        w = weights.setdefault(id(weight), linear.dequantize(weight).astype(np.float64))
        exact = w @ x.astype(np.float64)
        rms = np.sqrt(np.mean(exact ** 2)) or 1.0
        errors.setdefault("fp32 kernel", []).append(np.abs(got[:w.shape[0]] - exact).max() / rms)
        for digits in digit_counts:
            for per_block in (False, True):
                name = f"{digits} digit(s) a {'block' if per_block else 'row'}"
                errors.setdefault(name, []).append(np.abs(w @ rounded(x, digits, per_block) - exact).max() / rms)
    print(f"\nmax |error| / rms(output) against float64, {len(seen)} one-token linears")
    print("| arithmetic | median | 99 % | max |\n|---|---:|---:|---:|")
    for name, values in errors.items():
        print(f"| {name} | {np.median(values):.2g} | {np.quantile(values, 0.99):.2g} | {max(values):.2g} |")


def tokens(prompts: list[dict], digit_counts: list[int]) -> None:
    plain_call, plain_few, plain_matmul = linear.Gemv.__call__, linear.Gemv.few, packed_linear.matmul
    print("\ngreedy tokens with every linear's input rounded: the first that differs from MNN memory-normal's")
    print("| arithmetic | " + " | ".join(f"prompt {i}" for i in range(len(prompts))) + " |")
    print("|---|" + "---:|" * len(prompts))
    model = load_model()
    for digits in digit_counts:
        for per_block in (False, True):
            def cast(x, d=digits, b=per_block):
                return np.ascontiguousarray(rounded(x, d, b), np.float32)
            linear.Gemv.__call__ = lambda gemv, x, threads: plain_call(gemv, cast(x), threads)
            linear.Gemv.few = lambda gemv, x, threads: plain_few(gemv, cast(x), threads)
            packed_linear.matmul = lambda weight, x, out, threads: plain_matmul(weight, cast(x), out, threads)
            try:
                firsts = []
                for prompt in prompts:
                    model.reset()
                    got = model.generate(prompt["prompt_ids"], 64)
                    want = prompt["mnn_cpp_q4_memory_normal"]["gen_ids"]
                    firsts.append(next((str(i) for i, (a, b) in enumerate(zip(got, want)) if a != b), "none"))
            finally:
                linear.Gemv.__call__, linear.Gemv.few, packed_linear.matmul = plain_call, plain_few, plain_matmul
            print(f"| {digits} digit(s) a {'block' if per_block else 'row'} | " + " | ".join(firsts) + " |")


def speed(rounds: int) -> None:
    set_threads(1)
    rng = np.random.default_rng(1)
    print("\none thread, GB/s of packed weight bytes (medians)")
    print("| weights | fp32 GEMV, 1 row | int8, 1 row | int8, 3 rows | int8, 4 rows |\n|---|---:|---:|---:|---:|")
    for oc, ic, count in ((2048, 2048, 2), (14336, 4096, 10)):
        weights = [random_weight(rng, oc, ic) for _ in range(count)]
        x = rng.standard_normal(ic).astype(np.float32)
        gemvs = [linear.Gemv([pack(w)]) for w in weights]
        runs = [(sum(g.nbytes for g in gemvs), lambda: [g(x, 1) for g in gemvs])]
        packed = [int8_dot.pack(w) for w in weights]
        for rows in (1, 3, 4):
            xs = rng.standard_normal((rows, ic)).astype(np.float32)
            calls = [int8_dot.BoundLinear(p, xs, np.zeros((rows, p.rows), np.float32), True, 1) for p in packed]
            runs.append((sum(p.nbytes for p in packed), lambda c=calls: [call() for call in c]))
        speeds: list[list[float]] = [[] for _ in runs]
        for round_ in range(rounds + 1):  # the first compiles and touches
            for (nbytes, run), values in zip(runs, speeds):
                start = time.perf_counter()
                run()
                if round_:
                    values.append(nbytes / (time.perf_counter() - start) / 1e9)
        where = "in cache" if count * oc * ic // 2 < 16 << 20 else "from memory"
        print(f"| {count} x {oc} x {ic} ({where}) | " + " | ".join(f"{statistics.median(v):.1f}" for v in speeds) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--digits", default="1,2,3", help="digit counts to try")
    parser.add_argument("--rounds", type=int, default=21, help="timed rounds of the speed table")
    args = parser.parse_args()
    digit_counts = [int(d) for d in args.digits.split(",")]
    prompts = json.loads((MODEL / "reference.json").read_text())["prompts"]
    accuracy(prompts[0]["prompt_ids"], digit_counts)
    tokens(prompts, digit_counts)
    if int8_dot.supported():
        speed(args.rounds)


if __name__ == "__main__":
    main()
