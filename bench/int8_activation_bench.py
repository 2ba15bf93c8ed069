"""The cpu backend's memory "low" linears, exact fp32 kernels against the opt-in int8-activation
path (backend hint `cpu_int8_activations`, `kernels/int8_dot.py`), both loaded in one process and
measured alternately: the forward of 1/2/4/8 tokens after a short prompt (all logits), a prefill
of --prefill tokens, and decode tg (tokens a second over -t greedy tokens).

    python bench/int8_activation_bench.py [CONFIG] [-n 7] [-t 32] [--threads 2] [--prefill 128]

Measured 2026-12-04 (Zen4 with AVX512-VNNI, 2 loaded cores; medians, so +-15 %), int8 vs fp32:
    135M q4, 1 thread (-n 9):  tg32 80.4 vs 63.8 tok/s (1.26x); 4 tokens 15.9 vs 35.8 ms; 8 tokens
        24.4 vs 57.2 ms; prefill 128: 295 vs 700 ms; forward cost vs 1 token, int8: 1.17/1.27/1.94x
        (2/4/8 tokens), fp32: 1.56/3.32/5.30x
    135M q4, 2 threads (-n 7): tg32 103 vs 133 tok/s (0.78x: one launch per linear, mostly
        single-threaded below PARALLEL_BYTES, where the fp32 path fuses q/k/v and gate/up);
        8 tokens 18.9 vs 31.8 ms; prefill 128: 145 vs 310 ms
Since q/k/v and gate/up share one int8 call each, an instruction of the replay's compiled program
(measured 2026-12-04 with the machine at load 12-17 on 2 cores, so wall times swung +-50 %;
process CPU time per decode token, medians of 5 x 32 tokens, was steadier): 135M q4 int8 vs fp32,
2 threads 7.0-7.5 vs 7.3-7.8 ms (before: 8.8 vs 7.8 ms), 1 thread 6.2-6.6 vs 7.1-7.9 ms.
    1.7B q4b64 shape, 1 thread (-n 3 -t 8 --prefill 64): tg8 12.4 vs 6.8 tok/s (1.82x); 4 tokens
        143 vs 458 ms; prefill 64: 1.36 vs 4.36 s; int8 forward cost vs 1 token 1.06/1.24/1.94x
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import mnnllm_core
from shared_models import SHARED_MODEL  # beside this script

DEFAULT_CONFIG = SHARED_MODEL
PATHS = {"fp32": False, "int8": True}


def load(config: Path, int8: bool, threads: int):
    llm = mnnllm_core.create(config)
    llm.set_config({"sampler_type": "greedy", "thread_num": threads, "memory": "low",
                    "backend_hints": {"cpu_int8_activations": int8}})
    return llm.load()


def forward_ms(llm, prompt: list[int], seq: int) -> float:
    llm.reset()
    llm.forward(prompt)
    start = time.perf_counter()
    llm.forward(prompt[:seq], all_logits=seq > 1)
    return (time.perf_counter() - start) * 1e3


def prefill_ms(llm, ids: list[int]) -> float:
    llm.reset()
    start = time.perf_counter()
    llm.forward(ids)
    return (time.perf_counter() - start) * 1e3


def decode_tok_s(llm, prompt: list[int], tokens: int) -> float:
    llm.reset()
    llm.forward(prompt)
    token = int(llm.forward([prompt[-1]]).argmax())
    start = time.perf_counter()
    for _ in range(tokens):
        token = int(llm.forward([token]).argmax())
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("-n", "--runs", type=int, default=7)
    parser.add_argument("-t", "--generate", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prefill", type=int, default=128)
    args = parser.parse_args()
    llms = {name: load(args.config, int8, args.threads) for name, int8 in PATHS.items()}
    vocab = 1000
    prompt = [(17 * i + 5) % vocab + 100 for i in range(12)]
    long_prompt = [(31 * i + 7) % vocab + 100 for i in range(args.prefill)]
    counts = (1, 2, 4, 8)
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(args.runs + 1):  # round 0 warms up (records the replays) and is dropped
        for name in (PATHS if r % 2 else reversed(list(PATHS))):
            llm = llms[name]
            values = {f"{seq} tok ms": forward_ms(llm, prompt, seq) for seq in counts}
            values[f"prefill {args.prefill} ms"] = prefill_ms(llm, long_prompt)
            values[f"tg{args.generate} tok/s"] = decode_tok_s(llm, prompt, args.generate)
            if r:
                for key, value in values.items():
                    times.setdefault((name, key), []).append(value)
    keys = list(dict.fromkeys(key for _, key in times))
    print("| measure | " + " | ".join(PATHS) + " | int8 vs fp32 |\n|---|" + "---:|" * (len(PATHS) + 1))
    for key in keys:
        fp32, int8 = (statistics.median(times[(name, key)]) for name in PATHS)
        speed = fp32 / int8 if key.endswith("ms") else int8 / fp32
        print(f"| {key} | {fp32:.2f} | {int8:.2f} | {speed:.2f}x |")
    one = {name: statistics.median(times[(name, "1 tok ms")]) for name in PATHS}
    for name in PATHS:
        ratios = ", ".join(f"{seq}: {statistics.median(times[(name, f'{seq} tok ms')]) / one[name]:.2f}x"
                           for seq in counts[1:])
        print(f"{name}: forward cost vs 1 token: {ratios}")


if __name__ == "__main__":
    main()
