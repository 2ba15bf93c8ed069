"""What continuous batching buys on a backend (the model's own, or --backend opencl, vulkan ...):
the aggregate decode speed of S streams decoding together in the BatchEngine
(llm/batch_engine.py) against the same S streams run one after another.

Each stream has its own prompt (PROMPT distinct token ids, no shared prefix) and decodes -n tokens
(stop tokens banned, so every stream runs its whole budget). "alone": the streams one after
another through `Llm.generate`, decode tok/s = decoded tokens / decode time (the context's
decode_us). "together": the streams in one engine of S slots; once every stream decodes, the
steps are timed: decode tok/s = tokens emitted / time. A warm-up of each shape runs first
(the first steps of a shape resize and record its replay). The two alternate for --rounds rounds
(the mean of each is printed), so the machine's drift hits both alike.

    python bench/batch_bench.py [CONFIG] [--streams 1,2,4,8] [-n 32] [--rounds 2] [--memory low]
                                [--backend opencl] [--hint KEY=JSON]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import mnnllm_core
from mnnllm_core.llm.batch_engine import BatchEngine

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "shared" / "models" / "smollm2-135m-instruct-mnn-q4" / \
    "config.json"
PROMPT = 16


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


def together(llm, streams: list[list[int]], n: int, sampler) -> float:
    engine = BatchEngine(llm, slots=len(streams))
    sequences = [engine.submit(p, n, sampler) for p in streams]
    while any(s.state != "decode" for s in sequences):
        engine.step()
    emitted, start = 0, time.perf_counter()
    while not engine.idle:
        emitted += len(engine.step())
    return emitted / (time.perf_counter() - start)


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
    parser.add_argument("--backend", default=None, help="backend_type (default: the model's own; opencl, vulkan ...)")
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
    counts = [int(c) for c in args.streams.split(",")]
    vocab = llm.tokenizer.vocab_size
    print(f"| streams | alone tok/s | together tok/s | speed-up |  ({Path(args.config).parent.name}, "
          f"{llm.runtime_manager.config.backend_type}, memory {llm.config.memory}, -n {args.n}, {args.t} threads)")
    print("|---|---|---|---|")
    for count in counts:
        streams = prompts(count, vocab)
        together(llm, streams, 4, sampler)  # warm-up: this many rows' shapes resized and recorded
        alone(llm, streams[:1], 4, sampler)
        ones, manys = [], []
        for _ in range(args.rounds):
            ones.append(alone(llm, streams, args.n, sampler))
            manys.append(together(llm, streams, args.n, sampler))
        one, many = statistics.mean(ones), statistics.mean(manys)
        print(f"| {count} | {one:.2f} | {many:.2f} | {many / one:.2f}x |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
