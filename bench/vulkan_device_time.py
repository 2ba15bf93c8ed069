"""Where a vulkan step's device time goes, shader by shader: a recorded step (the replay of a
decode step, or of the prefill) is taken apart and each shader's dispatches are submitted alone,
`-r` times in one command buffer, timed by wall clock and by this process's CPU time (lavapipe
runs the shaders on the process's own threads, so on a CPU device the CPU time holds up better
than the wall clock on a loaded machine). The values the dispatches compute are thrown away.

    python bench/vulkan_device_time.py                  # a decode step after a 40-token prompt
    python bench/vulkan_device_time.py --prefill 128    # the prefill of 128 tokens
    python bench/vulkan_device_time.py -o json

Linear layers are listed per shape (their work-group count along x tells them apart).
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


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed(device, dispatches, reps: int) -> tuple[float, float]:
    """(wall ms, cpu ms) of one pass over `dispatches`, medians of 3 submits of `reps` passes."""
    from mnnllm_backends.vulkan.device import Recorder
    recorder = Recorder(device, reusable=True)
    for _ in range(reps):
        for item in dispatches:
            recorder.dispatch(item)
    recorder.end()
    samples = []
    for _ in range(3):
        wall, cpu = time.perf_counter(), _cpu_seconds()
        recorder.submit()
        samples.append(((time.perf_counter() - wall) / reps * 1e3, (_cpu_seconds() - cpu) / reps * 1e3))
    return sorted(samples)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default=str(DEFAULT_CONFIG), help="config.json of the model")
    parser.add_argument("--prefill", type=int, default=0, help="time the prefill of this many tokens instead")
    parser.add_argument("-r", "--reps", type=int, default=10, help="passes per submit")
    parser.add_argument("-o", choices=("md", "json"), default="md")
    args = parser.parse_args()
    import mnnllm_core
    import mnnllm_backends.vulkan.replay as vulkan_replay
    from mnnllm_backends.vulkan.device import Program

    replays = []
    run = vulkan_replay.VulkanReplay.run

    def kept(self):
        run(self)
        replays.append(self)
    vulkan_replay.VulkanReplay.run = kept
    llm = mnnllm_core.create(args.model)
    llm.set_config({"backend_type": "vulkan", "thread_num": 2, "sampler_type": "greedy"})
    llm.load()
    prompt = list(range(100, 100 + (args.prefill or 40)))
    llm.generate(prompt, 4)
    if not replays:
        sys.exit("no replayed step: is every op on vulkan (replay on)?")
    replay = replays[0] if args.prefill else replays[-1]
    dispatches = [item for item in replay.recorder.keep if isinstance(item, Program)]
    groups = defaultdict(list)
    for item in dispatches:
        shape = f" x{item.groups[0]} groups" if item.name.startswith("linear") else ""
        groups[item.name + shape].append(item)
    device = replay.backend.device
    reps = max(1, args.reps if not args.prefill else 1)
    whole = _timed(device, dispatches, reps)
    rows = [{"shader": name, "dispatches": len(items), **dict(zip(("wall_ms", "cpu_ms"), _timed(device, items, reps)))}
            for name, items in sorted(groups.items(), key=lambda kv: -len(kv[1]))]
    step = "prefill of %d tokens" % args.prefill if args.prefill else "decode step"
    if args.o == "json":
        print(json.dumps({"step": step, "device": device.description, "dispatches": len(dispatches),
                          "wall_ms": whole[0], "cpu_ms": whole[1], "shaders": rows}, indent=1))
        return
    print(f"{step} on {device.description}: {len(dispatches)} dispatches, "
          f"wall {whole[0]:.2f} ms, cpu {whole[1]:.2f} ms\n")
    print("| shader | dispatches | wall (ms) | cpu (ms) |\n|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['shader']} | {row['dispatches']} | {row['wall_ms']:.2f} | {row['cpu_ms']:.2f} |")


if __name__ == "__main__":
    main()
