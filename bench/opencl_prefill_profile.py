"""Where the opencl backend's prefill time goes, kernel by kernel: the model is loaded on a
queue with profiling enabled, one prefill of `-p` tokens is run (after a warm-up prefill that
resizes, compiles and tunes), and each kernel's device time (OpenCL profiling events, start to
end) is summed per kernel name and global size, so linear layers are listed per shape.

    python bench/opencl_prefill_profile.py              # pp512 on the shared model
    python bench/opencl_prefill_profile.py -p 128 -o json

On pocl (a CPU device) the kernels run on the process's own worker threads, so the process's CPU
time of the prefill is given too: on a loaded machine it holds up better than the wall clock
(compare shares and CPU time more than wall milliseconds).
"""
from __future__ import annotations

import argparse
import json
import resource
import time
from collections import defaultdict
from shared_models import SHARED_MODEL  # beside this script

DEFAULT_CONFIG = SHARED_MODEL


def profiling_queues() -> None:
    """Every CommandQueue made from now on has profiling enabled."""
    import pyopencl as cl
    plain = cl.CommandQueue

    class ProfilingQueue(plain):
        def __init__(self, context, device=None, properties=None):
            super().__init__(context, device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    cl.CommandQueue = ProfilingQueue


def recorded_enqueues(events: list) -> None:
    """Each bound kernel's enqueue keeps (kernel name, global size, local size, event)."""
    import pyopencl as cl
    from mnnllm_backends.opencl.device import Program

    def call(self, queue) -> None:
        if all(self.global_size):
            event = cl.enqueue_nd_range_kernel(queue, self.kernel, self.global_size, self.local_size)
            events.append((self.kernel.function_name, self.global_size, self.local_size, event))
    Program.__call__ = call
    Program.bound = lambda self, queue: (lambda: call(self, queue)) if all(self.global_size) else None  # replays


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default=str(DEFAULT_CONFIG), help="config.json of the model")
    parser.add_argument("-p", "--prompt", type=int, default=512, help="prefill tokens")
    parser.add_argument("--precision", default="low", help="as mnnllm bench: low (fp16 storage where the "
                                                           "device has it), normal, high")
    parser.add_argument("--hint", action="append", default=[], metavar="KEY=JSON",
                        help="a runtime hint, e.g. opencl_linear_split=1 (repeatable)")
    parser.add_argument("-o", choices=("md", "json"), default="md")
    args = parser.parse_args()
    profiling_queues()
    events: list = []
    recorded_enqueues(events)
    import mnnllm_core
    hints = dict((k, json.loads(v)) for k, v in (h.split("=", 1) for h in args.hint))
    llm = mnnllm_core.create(args.model)
    llm.set_config({"backend_type": "opencl", "thread_num": 2, "sampler_type": "greedy",
                    "precision": args.precision, "max_all_tokens": max(4096, args.prompt + 8),
                    "backend_hints": hints})
    llm.load()
    prompt = [100 + i % 20000 for i in range(args.prompt)]
    llm.forward(prompt)  # warm-up: resize, compile, tune
    llm.reset()
    events.clear()
    start, cpu = time.perf_counter(), _cpu_seconds()
    llm.forward(prompt)
    wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    groups: dict[str, list[float]] = defaultdict(list)
    for name, global_size, local_size, event in events:
        shape = "x".join(map(str, global_size)) + (f" local {'x'.join(map(str, local_size))}" if local_size else "")
        groups[f"{name} {shape}"].append((event.profile.end - event.profile.start) * 1e-6)
    total = sum(sum(v) for v in groups.values())
    rows = sorted(({"kernel": k, "calls": len(v), "ms": round(sum(v), 2), "share": round(sum(v) / total, 4)}
                   for k, v in groups.items()), key=lambda r: -r["ms"])
    result = {"prompt": args.prompt, "wall_ms": round(wall * 1e3, 1), "cpu_ms": round(cpu * 1e3, 1),
              "kernel_ms": round(total, 1),
              "tok_s": round(args.prompt / wall, 1), "device": llm.runtime_manager.runtime.device_name(),
              "hints": hints, "rows": rows}
    if args.o == "json":
        print(json.dumps(result, indent=1))
        return
    print(f"prefill {args.prompt} tokens on {result['device']}: wall {result['wall_ms']} ms "
          f"({result['tok_s']} tok/s), process CPU {result['cpu_ms']} ms, kernels {result['kernel_ms']} ms")
    print("| kernel global[ local] | calls | ms | share |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['kernel']} | {r['calls']} | {r['ms']} | {100 * r['share']:.1f}% |")


if __name__ == "__main__":
    main()
