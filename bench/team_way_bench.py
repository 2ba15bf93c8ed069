"""Whether the cpu thread team's `auto` way (kernels/team.py, `_Way`) keeps the team for a decode
at memory "low" with 2 threads: runs fresh processes, each loading the shared model and decoding
-n tokens -r times (as `mnnllm bench`'s tg does), and prints per process its tok/s per repetition
and every way decision (`team way:` debug lines). `--rule old` gives the trial's rule before the
warm-up, the margin and the short solo keep (no warm-up runs, plain medians, KEEP after any win);
processes of both rules alternate.

    python bench/team_way_bench.py [-p 6] [-n 128] [-r 5] [--rules old,new]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time

from shared_models import SHARED_MODEL  # beside this script


def _one(rule: str, tokens: int, reps: int) -> None:
    import numpy as np

    import mnnllm_core
    from mnnllm_backends.cpu.kernels import team

    if rule == "old":
        team.WARM, team.MARGIN, team.SOLO_KEEP = 0, 0.0, team.KEEP
    decisions = []

    class Catch(logging.Handler):
        def emit(self, record):
            decisions.append(record.getMessage())

    logging.getLogger(team.__name__).addHandler(Catch())
    logging.getLogger(team.__name__).setLevel(logging.DEBUG)
    llm = mnnllm_core.create(str(SHARED_MODEL))
    llm.set_config({"backend_type": "cpu", "memory": "low", "thread_num": 2, "sampler_type": "greedy"})
    llm.load()
    rates = []
    for _ in range(reps):
        llm.reset()
        logits = llm.forward([1, 2])
        start = time.perf_counter()
        for _ in range(tokens):
            logits = llm.forward([int(np.argmax(logits))])
        rates.append(tokens / (time.perf_counter() - start))
    print(json.dumps({"rule": rule, "rates": rates, "decisions": decisions}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-p", "--processes", type=int, default=6)
    parser.add_argument("-n", "--tokens", type=int, default=128)
    parser.add_argument("-r", "--reps", type=int, default=5)
    parser.add_argument("--rules", default="old,new")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        _one(args.one, args.tokens, args.reps)
        return
    rules = args.rules.split(",")
    medians = {rule: [] for rule in rules}
    for i in range(args.processes):
        rule = rules[i % len(rules)]
        with open("/proc/loadavg") as f:
            load = f.read().split()[0]
        out = subprocess.run([sys.executable, __file__, "--one", rule, "-n", str(args.tokens), "-r", str(args.reps)],
                             capture_output=True, text=True, check=True, env=os.environ).stdout
        result = json.loads(out.strip().splitlines()[-1])
        medians[rule].append(statistics.median(result["rates"]))
        print(f"{rule} (load {load}): tok/s " + " ".join(f"{r:.1f}" for r in result["rates"]))
        for line in result["decisions"]:
            print(f"    {line}")
    for rule, values in medians.items():
        print(f"{rule}: medians per process " + " ".join(f"{v:.1f}" for v in values))


if __name__ == "__main__":
    main()
