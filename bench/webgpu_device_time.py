"""Where a webgpu step's device time goes, kernel by kernel: a replayed step (a decode step, or
the prefill) is taken apart and each kernel's dispatches are encoded alone, `-r` times in one
command encoder, submitted and waited for, timed by wall clock and by this process's CPU time
(lavapipe runs the shaders on the process's own threads, so on a CPU adapter the CPU time holds
up better than the wall clock on a loaded machine). The values computed are thrown away; the
KV cache's past/total stay those of the recorded step.

    python bench/webgpu_device_time.py                # a decode step after 40 tokens
    python bench/webgpu_device_time.py --prefill 128  # the prefill of 128 tokens
    python bench/webgpu_device_time.py --context 1024 # a decode step after 1024 tokens

Linear kernels are listed per shape (their work-group counts tell them apart).
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections import defaultdict
from shared_models import SHARED_MODEL  # beside this script

DEFAULT_CONFIG = SHARED_MODEL


def _clocks() -> tuple[float, float]:
    """(wall, this process's CPU) seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), usage.ru_utime + usage.ru_stime


def _timed(device, programs, reps: int) -> tuple[float, float]:
    """(wall ms, cpu ms) of one pass over `programs`: medians of 3 submits of `reps` passes each."""
    from mnnllm_webgpu.device import Recorder
    samples = []
    for _ in range(3):
        recorder = Recorder(device)
        for program in programs * reps:
            recorder.run(program)
        before = _clocks()
        recorder.flush()
        device.queue.read_buffer(device.dummy, 0, 4)  # waits for the device
        after = _clocks()
        samples.append(tuple((b - a) / reps * 1e3 for a, b in zip(before, after)))
    return sorted(samples)[1]


def _replayed_step(config: str, prompt: list[int], prefill: bool):
    """The replay of the prefill, or of the last decode step, of greedy generation after `prompt`."""
    import mnnllm_core
    import mnnllm_webgpu.replay as webgpu_replay
    seen = []
    play = webgpu_replay.WebGPUReplay.play

    def keep(replay) -> None:
        play(replay)
        seen.append(replay)
    webgpu_replay.WebGPUReplay.play = keep
    llm = mnnllm_core.create(config)
    llm.set_config({"backend_type": "webgpu", "sampler_type": "greedy"})
    llm.load()
    llm.generate(prompt, 4)
    if not seen:
        sys.exit("no replayed step: is every op on webgpu (replay on)?")
    return seen[0] if prefill else seen[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default=str(DEFAULT_CONFIG), help="config.json of the model")
    parser.add_argument("--prefill", type=int, default=0, help="time the prefill of this many tokens instead")
    parser.add_argument("--context", type=int, default=40, help="prompt tokens before the timed decode step")
    parser.add_argument("-r", "--reps", type=int, default=10, help="passes per submit")
    parser.add_argument("-o", choices=("md", "json"), default="md")
    args = parser.parse_args()
    from mnnllm_webgpu.device import Program
    prompt = [100 + i % 1000 for i in range(args.prefill or args.context)]
    replay = _replayed_step(args.model, prompt, bool(args.prefill))
    programs = [step for step in replay.steps if isinstance(step, Program)]
    kernels: dict[str, list] = defaultdict(list)
    for program in programs:  # linears and attention passes told apart by their work-group counts
        kernels[program.shader + (f" {program.groups}" if program.shader.startswith(("linear", "attention")) else "")
                ].append(program)
    device, reps = replay.backend.device, 1 if args.prefill else max(1, args.reps)
    step = f"prefill of {args.prefill} tokens" if args.prefill else f"decode step after {len(prompt)} tokens"
    wall, cpu = _timed(device, programs, reps)
    rows = [(name, len(items), *_timed(device, items, reps))
            for name, items in sorted(kernels.items(), key=lambda kv: -len(kv[1]))]
    if args.o == "json":
        print(json.dumps({"step": step, "device": device.description, "dispatches": len(programs), "wall_ms": wall,
                          "cpu_ms": cpu, "kernels": [dict(zip(("kernel", "dispatches", "wall_ms", "cpu_ms"), row))
                                                     for row in rows]}, indent=1))
        return
    print(f"{step} on {device.description}: {len(programs)} dispatches, wall {wall:.2f} ms, cpu {cpu:.2f} ms\n")
    print("| kernel | dispatches | wall (ms) | cpu (ms) |\n|---|---:|---:|---:|")
    for name, count, wall_ms, cpu_ms in rows:
        print(f"| {name} | {count} | {wall_ms:.2f} | {cpu_ms:.2f} |")


if __name__ == "__main__":
    main()
