"""Greedy tokens after a 2,000-token prompt with a quantized KV cache: ours with fp32
keys and values, ours with int8 ones (`attention_mode`), MNN's runtime (PyPI MNN, in a subprocess)
with its default and with the same `attention_mode`.

The prompt is built from the shared model's tokenizer, the same every run: numbered sentences of a
made-up museum catalogue, cut at `--tokens`. Each run decodes `--new` greedy tokens (no stop
token ends it). Printed: each run's tokens, where each pair first differs, and at every step the
largest |logit difference| of our int8 cache against our fp32 one. Past the step where the int8
run picks another token the two runs read different contexts, so the logits compared there are
those of the int8 cache fed the fp32 run's tokens (teacher forcing), which is what the difference
is meant to measure.

    python bench/long_greedy.py [CONFIG] [--tokens 2000] [--new 32] [--memory low] [--mode 10] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SHARED = Path(os.environ.get("MNNLLM_SHARED", Path(__file__).resolve().parents[2] / "shared"))
DEFAULT_CONFIG = SHARED / "models" / "smollm2-135m-instruct-mnn-q4" / "config.json"

MNN_SCRIPT = r"""
import json, os, sys, tempfile
import MNN.llm as mnn_llm
job = json.load(sys.stdin)
folder = os.path.dirname(os.path.abspath(job["config"]))
config = json.load(open(job["config"]))
config.update({**job["keys"], "base_dir": folder + "/"})
path = os.path.join(tempfile.mkdtemp(), "config.json")
json.dump(config, open(path, "w"))
model = mnn_llm.create(path)
model.load()
tokens = list(model._c_obj.generate(job["ids"], job["new"]))
print("@@RESULT@@" + json.dumps(tokens), flush=True)
os._exit(0)  # MNN 3.6.1 can crash in its destructors at interpreter exit
"""


def prompt_ids(llm, count: int) -> list[int]:
    """`count` tokens of a long, deterministic text (numbered catalogue entries)."""
    entries = []
    while True:
        i = len(entries)
        entries.append(f"Entry {i}: the clock made by workshop {i % 17} in {1480 + (37 * i) % 420} keeps "
                       f"{['solar', 'sidereal', 'lunar', 'mean'][i % 4]} time and chimes {1 + i % 12} times.")
        if i % 40 == 39:
            ids = llm.tokenizer_encode(" ".join(entries))
            if len(ids) >= count:
                return ids[:count]


def keys(memory: str, threads: int, mode: int | None) -> dict:
    out = {"memory": memory, "thread_num": threads, "sampler_type": "greedy", "max_all_tokens": 4096}
    return {**out, "attention_mode": mode} if mode is not None else out


def ours(config: str, ids: list[int], new: int, memory: str, threads: int, mode: int | None,
         forced: list[int] | None = None) -> tuple[list[int], list[np.ndarray], float]:
    """Greedy tokens and each step's logits; with `forced`, the steps read those tokens instead of
    their own picks (the tokens returned are still each step's own argmax)."""
    import mnnllm_core
    llm = mnnllm_core.create(config)
    llm.set_config(keys(memory, threads, mode))
    llm.load()
    start = time.perf_counter()
    logits = llm.forward(ids)
    tokens, steps = [], []
    for step in range(new):
        steps.append(np.array(logits, np.float32))
        tokens.append(int(np.argmax(logits)))
        if step + 1 < new:
            logits = llm.forward([forced[step] if forced else tokens[-1]])
    return tokens, steps, time.perf_counter() - start


def mnn(config: str, ids: list[int], new: int, memory: str, threads: int, mode: int | None) -> list[int]:
    job = {"config": config, "ids": ids, "new": new, "keys": keys(memory, threads, mode)}
    done = subprocess.run([sys.executable, "-c", MNN_SCRIPT], input=json.dumps(job), capture_output=True,
                          text=True, errors="replace", timeout=1800)
    marker = "@@RESULT@@"
    if marker not in done.stdout:
        raise RuntimeError(f"MNN's run failed ({done.returncode}): {done.stderr[-1500:]}")
    return json.loads(done.stdout.split(marker, 1)[1])


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first step where the two differ (None: equal over the shorter)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", default=str(DEFAULT_CONFIG))
    parser.add_argument("--tokens", type=int, default=2000, help="prompt length")
    parser.add_argument("--new", type=int, default=32, help="greedy tokens to decode")
    parser.add_argument("--memory", default="low", help="memory mode of every run (MNN's too)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mode", type=int, default=10, help="attention_mode of the int8 runs (10: keys and values)")
    parser.add_argument("--no-mnn", action="store_true", help="skip MNN's runs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import mnnllm_core
    tokenizer = mnnllm_core.create(args.config)
    tokenizer.set_config({"memory": args.memory})
    ids = prompt_ids(tokenizer.load(), args.tokens)
    del tokenizer
    fp32, fp32_logits, fp32_s = ours(args.config, ids, args.new, args.memory, args.threads, None)
    int8, int8_logits, int8_s = ours(args.config, ids, args.new, args.memory, args.threads, args.mode)
    split = first_difference(fp32, int8)
    if split is not None:  # compare logits over the fp32 run's context past the split
        _, forced_logits, _ = ours(args.config, ids, args.new, args.memory, args.threads, args.mode, forced=fp32)
        int8_logits = int8_logits[:split] + forced_logits[split:]
    deltas = [float(np.abs(a - b).max()) for a, b in zip(int8_logits, fp32_logits)]
    runs = {"ours fp32": fp32, f"ours int8 ({args.mode})": int8}
    if not args.no_mnn:
        runs["MNN default"] = mnn(args.config, ids, args.new, args.memory, args.threads, None)
        runs[f"MNN attention_mode {args.mode}"] = mnn(args.config, ids, args.new, args.memory, args.threads, args.mode)
    names = list(runs)
    pairs = {f"{a} vs {b}": first_difference(runs[a], runs[b]) for i, a in enumerate(names) for b in names[i + 1:]}
    result = {"prompt_tokens": len(ids), "new": args.new, "memory": args.memory, "threads": args.threads,
              "tokens": runs, "first_difference": pairs, "max_logit_delta_int8_vs_fp32": deltas,
              "seconds": {"ours fp32": fp32_s, "ours int8": int8_s}, "load": open("/proc/loadavg").read().split()[:3]}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{len(ids)}-token prompt, {args.new} greedy tokens, memory {args.memory}, {args.threads} threads")
    for name, tokens in runs.items():
        print(f"  {name:>24}: {tokens}")
    for pair, step in pairs.items():
        print(f"  {pair}: " + ("equal" if step is None else f"first differs at step {step}"))
    print("  max |logit int8 - fp32| per step: " + ", ".join(f"{d:.3f}" for d in deltas))
    print(f"  (largest {max(deltas):.3f}; logits of magnitude ~{np.abs(fp32_logits[0]).max():.0f})")


if __name__ == "__main__":
    main()
