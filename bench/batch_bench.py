"""What continuous batching buys on a backend (the model's own, or --backend opencl, vulkan ...):
the aggregate decode speed of S streams decoding together in the BatchEngine
(llm/batch_engine.py) against the same S streams run one after another.

Each stream has its own prompt (PROMPT distinct token ids, no shared prefix) and decodes -n tokens
(stop tokens banned, so every stream runs its whole budget; with --stagger K stream i decodes
K*i fewer, so streams leave one by one and the steps change row count). "alone": the streams one
after another through `Llm.generate`, decode tok/s = decoded tokens / decode time (the context's
decode_us). "together": the streams in one engine of S slots; once every stream decodes, the
steps are timed: decode tok/s = tokens emitted / time, and the median host time of a step. On a
static-shape backend (opencl, vulkan ...) "together" runs twice: unpadded (batch_sizes=(): each
row count its own clone, as before padding) and padded (decode steps padded to the engine's
BATCH_SIZES). Each engine lives through the rounds (as the server's does) after a warm-up run
(which meets every row count the streams leave behind) of --warm tokens a stream, as is the
one-stream run before "alone": on the cpu with a thread team (thread_num > 1, memory "low") each
new program's first runs (`team.SETTLED_AFTER`, 18) warm the team, then alternate the team and
one thread to choose between them (kernels/team.py), so a short warm-up left most timed steps of
a row count in that trial, half of them on one thread, where a step of several rows is
compute-bound. The figures are the steady state.
The modes alternate for --rounds rounds (the mean of each is printed; the engines' order turns
each round), so the machine's drift hits them alike; the load average is printed before and after.
--vs-mnn adds MNN's C++ runtime (PyPI MNN, its own process) serving the streams one after
another: it decodes -n tokens after a PROMPT-token context (`mnnllm bench`'s decode test at that
depth, memory and threads as ours), so one stream's rate is the aggregate of any count.

    python bench/batch_bench.py [CONFIG] [--streams 1,2,4,8] [-n 32] [--rounds 2] [--memory low]
                                [--backend opencl] [--hint KEY=JSON] [--stagger K] [--warm 20] [--vs-mnn]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import mnnllm_core
from mnnllm_core.llm.batch_engine import BatchEngine
from mnnllm_core.bench.worker_protocol import call_worker
from mnnllm_core.llm.batch_plan import BATCH_SIZES
from mnnllm_backends.cpu.kernels import team
from shared_models import SHARED_MODEL  # beside this script

DEFAULT_CONFIG = SHARED_MODEL
PROMPT = 16
WARM = team.SETTLED_AFTER + 2  # warm-up tokens a stream: past the cpu team's trial of each program


def prompts(count: int, vocab: int) -> list[list[int]]:
    """`count` prompts of PROMPT ids that share no first token."""
    return [[1] + [(1000 + 997 * s + 31 * i) % (vocab - 100) + 50 for i in range(PROMPT - 1)] for s in range(count)]


def alone(llm, streams: list[list[int]], n: int, sampler) -> float:
    decoded, seconds = 0, 0.0
    for prompt in streams:
        llm.reset()
        out = llm.generate(prompt, n, sampler)
        decoded += len(out) - 1
        seconds += llm.context.decode_us / 1e6
    return decoded / seconds


def together(engine: BatchEngine, streams: list[list[int]], n: int, sampler, stagger: int = 0) -> tuple[float, float]:
    """(decode tok/s, median ms a step) of the streams decoding together in `engine`. Its slots
    forget their history first: the engines of the modes take turns on the same KV slots."""
    for slot in engine.slots:
        slot.conversation.rewind(0)
    sequences = [engine.submit(p, max(1, n - stagger * i), sampler) for i, p in enumerate(streams)]
    while any(s.state != "decode" for s in sequences if not s.finished):
        engine.step()
    emitted, times = 0, []
    while not engine.idle:
        start = time.perf_counter()
        emitted += len(engine.step())
        times.append(time.perf_counter() - start)
    return emitted / sum(times), statistics.median(times) * 1e3


def mnn_one_after_another(config: str, n: int, threads: int, memory: str, reps: int) -> float:
    """MNN's decode tok/s of one stream: -n tokens after a PROMPT-token context, median of `reps`."""
    job = {"config": config, "backend": "mnn", "threads": threads, "tests": [[0, n, PROMPT]], "reps": reps,
           "precision": 2, "mnn_memory": memory, "settings": {}}
    (result,) = call_worker("mnnllm_core.bench.mnn_worker", job, timeout=600)["rows"]
    return statistics.median(result["samples_ts"])


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default=str(DEFAULT_CONFIG))
    parser.add_argument("--streams", default="1,2,4,8")
    parser.add_argument("-n", type=int, default=32, help="tokens each stream decodes")
    parser.add_argument("-t", type=int, default=2, help="thread_num")
    parser.add_argument("--rounds", type=int, default=2, help="alone and together alternate this many times")
    parser.add_argument("--memory", default=None, help="the config's memory mode (default: the model's own)")
    parser.add_argument("--hint", action="append", default=[], metavar="KEY=JSON",
                        help="a runtime hint, e.g. cpu_int8_activations=true (repeatable)")
    parser.add_argument("--stagger", type=int, default=0, help="stream i decodes this many tokens fewer per i")
    parser.add_argument("--backend", default=None, help="backend_type (default: the model's own; opencl, vulkan ...)")
    parser.add_argument("--warm", type=int, default=WARM, help="tokens a stream decodes in the warm-up runs")
    parser.add_argument("--vs-mnn", action="store_true", help="MNN's C++ runtime serving the streams one after another")
    args = parser.parse_args()
    llm = mnnllm_core.create(args.config)
    hints = dict((k, json.loads(v)) for k, v in (h.split("=", 1) for h in args.hint))
    settings = {"sampler_type": "greedy", "thread_num": args.t, "backend_hints": hints}
    if args.memory:
        settings["memory"] = args.memory
    if args.backend:
        settings["backend_type"] = args.backend
    llm.set_config(settings)
    llm.load()
    sampler = llm.make_sampler({"sampler_type": "greedy", "banned_tokens": sorted(llm.tokenizer.stop_ids)})
    static = llm.runtime_manager.static_shapes
    counts = [int(c) for c in args.streams.split(",")]
    vocab = llm.tokenizer.vocab_size
    modes = {"together": (), "padded": BATCH_SIZES} if static else {"together": ()}
    header = " | ".join(f"{m} tok/s | {m} ms/step" for m in modes)
    print(f"load average {load()}: {Path(args.config).parent.name}, {llm.runtime_manager.config.backend_type}, "
          f"memory {llm.config.memory}, -n {args.n}, stagger {args.stagger}, {args.t} threads, {args.rounds} rounds, "
          f"warm-up {args.warm}")
    print(f"| streams | alone tok/s | {header} | speed-up |")
    print("|---|---|" + "---|---|" * len(modes) + "---|")
    for count in counts:
        streams = prompts(count, vocab)
        engines = {m: BatchEngine(llm, slots=count, batch_sizes=sizes) for m, sizes in modes.items()}
        for engine in engines.values():  # warm-up: the shapes (as the streams leave too) resized and recorded
            together(engine, streams, args.warm, sampler, min(args.stagger, 1))
        alone(llm, streams[:1], args.warm, sampler)
        ones, manys = [], {m: [] for m in modes}
        for round_ in range(args.rounds):  # the engines' order turns each round: neither always runs last
            ones.append(alone(llm, streams, args.n, sampler))
            for mode, engine in list(engines.items())[::-1 if round_ % 2 else 1]:
                manys[mode].append(together(engine, streams, args.n, sampler, args.stagger))
        one = statistics.mean(ones)
        cells = " | ".join(f"{statistics.mean(r[0] for r in runs):.2f} | {statistics.mean(r[1] for r in runs):.1f}"
                           for runs in manys.values())
        last = statistics.mean(r[0] for r in list(manys.values())[-1])
        print(f"| {count} | {one:.2f} | {cells} | {last / one:.2f}x |", flush=True)
    if args.vs_mnn:
        memory = llm.config.memory
        rate = mnn_one_after_another(args.config, args.n, args.t, memory, max(3, args.rounds))
        print(f"MNN C++ cpu (memory {memory}), the streams one after another: {rate:.2f} tok/s at any count")
    print(f"load average {load()}")


if __name__ == "__main__":
    sys.exit(main())
