"""How well a GPU backend's prefill on a CPU device (lavapipe) uses the cores: backends side by
side in one process, their prefills alternating, each timed by wall clock, by this process's CPU
time and by each thread's (the CPU time over the wall time is the number of cores kept busy;
lavapipe runs a dispatch's work-groups on its own threads, the rest is the host's). On a loaded
machine the wall time stretches while the CPU time holds: compare CPU-seconds there, and the
parallel fraction on a quiet machine.

    python bench/prefill_cores.py                          # vulkan and webgpu, pp128, 5 rounds
    python bench/prefill_cores.py -a webgpu -p 512 -r 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict
from shared_models import SHARED_MODEL  # beside this script

DEFAULT_CONFIG = SHARED_MODEL
TICK = os.sysconf("SC_CLK_TCK")


def thread_times() -> dict[str, float]:
    """CPU seconds per thread of this process, by name:id."""
    times: dict[str, float] = defaultdict(float)
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        name = "main" if int(tid) == os.getpid() else f"{name}:{tid}"
        times[name] += (int(fields[11]) + int(fields[12])) / TICK
    return times


def timed_prefill(llm, ids: list[int]) -> tuple[float, float, dict]:
    """(wall s, process CPU s, CPU s per thread name) of one prefill from an empty conversation."""
    llm.reset()
    before_threads, before = thread_times(), (time.perf_counter(), time.process_time())
    llm.forward(ids)
    after, after_threads = (time.perf_counter(), time.process_time()), thread_times()
    per_thread = {k: after_threads[k] - before_threads.get(k, 0.0) for k in after_threads}
    return after[0] - before[0], after[1] - before[1], per_thread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default=str(DEFAULT_CONFIG), help="config.json of the model")
    parser.add_argument("-a", "--backends", default="vulkan,webgpu")
    parser.add_argument("-p", "--prompt", type=int, default=128, help="tokens prefilled")
    parser.add_argument("-r", "--rounds", type=int, default=5, help="prefills of each backend, alternating")
    args = parser.parse_args()
    from mnnllm_core.llm.create import create
    llms = {}
    for backend in args.backends.split(","):
        llm = create(args.model)
        llm.set_config({"backend_type": backend, "sampler_type": "greedy"})
        llm.load()
        llms[backend] = llm
    ids = [100 + i % 1000 for i in range(args.prompt)]
    for llm in llms.values():
        timed_prefill(llm, ids)  # warm-up: resizes, compiles
    samples: dict[str, list] = defaultdict(list)
    for _ in range(args.rounds):
        for backend, llm in llms.items():
            samples[backend].append(timed_prefill(llm, ids))
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"pp{args.prompt}, medians of {args.rounds} alternating rounds, load average {load}\n")
    print("| backend | tok/s | wall (ms) | cpu (ms) | cpu / wall | cpu per thread (ms) |\n|---|---:|---:|---:|---:|---|")
    for backend, runs in samples.items():
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        names = sorted({k for r in runs for k in r[2]})
        threads = {k: statistics.median(r[2].get(k, 0.0) for r in runs) for k in names}
        busy = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in sorted(threads.items(), key=lambda kv: -kv[1]) if v > 0)
        print(f"| {backend} | {args.prompt / wall:.1f} | {wall * 1e3:.0f} | {cpu * 1e3:.0f} | {cpu / wall:.2f} | {busy} |")


if __name__ == "__main__":
    main()
