"""Where the time of a decode step goes: the host (Python setting arguments, enqueueing, recording
commands) versus the device (the kernels, and waiting for them).

For each backend, after a short prefill and a few warm-up steps, every decode step is split into
  execute   the pipeline's run of the step (all commands, then the backend's end of run)
  host      execute minus the wait: opencl enqueues, vulkan records (or, with replay, what the
            replay does on the host before it submits)
  wait      the backend's on_execute_end: opencl clFinish, vulkan submit + wait; on cpu with
            replay, the time inside the replay's compiled programs (the kernels' own time, what
            a device's wait is elsewhere), so "host" is the Python around them
  forward   the whole `Llm.forward` of the token (embedding, uploads, logits readback included)
  held      opencl only, a second pass: the queue is held by a user event while the step is
            enqueued (the host's cost alone: pocl runs the kernels on the host's own cores, so
            unheld, "host" also holds kernel time), then released and finished (the device alone)
and the pipeline's own dispatch cost is measured with every execution replaced by a no-op.

    python bench/host_time.py -a opencl,vulkan -n 32          # markdown
    python bench/host_time.py -a opencl --replay off -o json  # the per-op loop, as JSON
    python bench/host_time.py -a cpu --replay on,off --memory normal

Each (backend, replay) combination runs in its own process. Medians over the steps.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from shared_models import SHARED_MODEL  # beside this script

DEFAULT_CONFIG = SHARED_MODEL


def _timed(owner, name: str, spent: list[float]) -> None:
    """Replace the bound method `owner.name` by one that adds its wall time to spent[-1]."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[-1] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def _time_programs(replay, spent: list[float]) -> None:
    """cpu: every compiled program of the replay (CPUReplay.calls) adds its wall time to
    spent[-1], at this recording and every later one (a grown KV cache records again)."""
    record = replay.record

    def timed(call):
        def run():
            start = time.perf_counter()
            try:
                call()
            finally:
                spent[-1] += time.perf_counter() - start
        return run

    def wrap_programs() -> None:
        # a StepProgram's call (`run_program`, or its thread team's `run`) holds its arrays
        replay.calls = [timed(c) if hasattr(c, "arrays") else c for c in replay.calls]

    def record_timed(steps):
        record(steps)
        wrap_programs()

    replay.record = record_timed
    wrap_programs()


def _noop_execute_s(pipeline, reps: int) -> float:
    """Median seconds of one pipeline run with every execution a no-op (then restored)."""
    executions = {id(c.execution): c.execution for c in pipeline.commands}.values()
    replay = getattr(pipeline, "replay_enabled", None)
    for execution in executions:
        execution.on_execute = lambda inputs, outputs: None
    if replay is not None:
        pipeline.replay_enabled = False  # the per-op loop is what the no-op run measures
    try:
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            pipeline.execute()
            samples.append(time.perf_counter() - start)
    finally:
        for execution in executions:
            del execution.on_execute
        if replay is not None:
            pipeline.replay_enabled = replay
    return statistics.median(samples)


def _held_queue_ms(llm, pipeline, token: int, steps: int) -> dict:
    """opencl only: each step's commands are enqueued behind a marker that waits on a user event,
    so the enqueue time is the host's alone (pocl runs kernels on the same cores as the host
    thread: unheld, an enqueue also waits for them), then the event is set and the finish times
    the device alone. Empty for a backend without a pyopencl queue."""
    import numpy as np

    queue = getattr(pipeline.backend, "queue", None)
    if queue is None or not type(queue).__module__.startswith("pyopencl"):
        return {}
    import pyopencl as cl

    execute, finish = pipeline.execute, pipeline.backend.on_execute_end
    marks: list[list[float]] = []

    def held_execute(*args, **kwargs):
        gate = cl.UserEvent(queue.context)
        cl.enqueue_marker(queue, wait_for=[gate])
        marks.append([time.perf_counter(), gate])
        return execute(*args, **kwargs)

    def release_then_finish():
        mark = marks[-1]
        enqueued = time.perf_counter()
        mark[1].set_status(cl.command_execution_status.COMPLETE)
        finish()
        mark[:] = [enqueued - mark[0], time.perf_counter() - enqueued]

    pipeline.execute, pipeline.backend.on_execute_end = held_execute, release_then_finish
    try:
        for _ in range(steps):
            token = int(np.argmax(llm.forward([token])))
    finally:
        del pipeline.execute, pipeline.backend.on_execute_end
    return {"held_enqueue_ms": statistics.median(m[0] for m in marks) * 1e3,
            "held_device_ms": statistics.median(m[1] for m in marks) * 1e3}


def measure(config: str, backend: str, steps: int, replay: str | None, memory: str | None = None) -> dict:
    import numpy as np

    from mnnllm_core.llm.create import create

    llm = create(config)
    settings = {"backend_type": backend, "thread_num": 2, "sampler_type": "greedy"}
    if replay is not None:
        settings["backend_hints"] = {"replay": replay == "on"}
    if memory is not None:
        settings["memory"] = memory
    llm.set_config(settings)
    llm.load()
    token = int(np.argmax(llm.forward(list(range(1, 9)))))
    for _ in range(3):  # warm-up: the decode clone resizes (and records) here
        token = int(np.argmax(llm.forward([token])))
    module = llm.pool.get(1, False)
    pipeline = module.static_module.session.pipeline
    execute, wait = [0.0], [0.0]
    _timed(pipeline, "execute", execute)
    _timed(pipeline.backend, "on_execute_end", wait)
    if getattr(getattr(pipeline, "replay", None), "programs", 0):
        _time_programs(pipeline.replay, wait)
    rows = []
    for _ in range(steps):
        execute.append(0.0)
        wait.append(0.0)
        start = time.perf_counter()
        token = int(np.argmax(llm.forward([token])))
        rows.append((time.perf_counter() - start, execute[-1], wait[-1]))
    del pipeline.execute, pipeline.backend.on_execute_end
    held = _held_queue_ms(llm, pipeline, token, steps)
    commands = len(pipeline.commands)
    forward_s = statistics.median(r[0] for r in rows)
    execute_s = statistics.median(r[1] for r in rows)
    wait_s = statistics.median(r[2] for r in rows)
    host_s = statistics.median(r[1] - r[2] for r in rows)
    return {"backend": backend, "device": llm.runtime_manager.runtime.device_name(),
            "replay": bool(getattr(pipeline, "replayed", False)), "commands": commands, "steps": steps,
            "forward_ms": forward_s * 1e3, "execute_ms": execute_s * 1e3, "host_ms": host_s * 1e3,
            "wait_ms": wait_s * 1e3, "host_us_per_op": host_s * 1e6 / max(1, commands),
            "noop_pipeline_ms": _noop_execute_s(pipeline, max(5, steps)) * 1e3,
            "tok_s": 1.0 / forward_s, **held}


def _ms(row: dict, key: str) -> str:
    return f"{row[key]:.2f}" if key in row else "-"


def render(rows: list[dict]) -> str:
    head = ("| backend | replay | commands | forward (ms) | execute (ms) | host (ms) | wait (ms) | host us/op "
            "| no-op pipeline (ms) | held: enqueue (ms) | held: device (ms) | tok/s |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['backend']} | {r.get('replay_asked', '-')} | error: {r['error']} |||||||||")
            continue
        lines.append(f"| {r['backend']} | {'on' if r['replay'] else 'off'} | {r['commands']} | {r['forward_ms']:.2f} "
                     f"| {r['execute_ms']:.2f} | {r['host_ms']:.2f} | {r['wait_ms']:.2f} | {r['host_us_per_op']:.1f} "
                     f"| {r['noop_pipeline_ms']:.2f} | {_ms(r, 'held_enqueue_ms')} | {_ms(r, 'held_device_ms')} "
                     f"| {r['tok_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default=str(DEFAULT_CONFIG), help="config.json of the model")
    parser.add_argument("-a", default="cpu,opencl,vulkan", help="backends, e.g. opencl,vulkan")
    parser.add_argument("-n", type=int, default=32, help="decode steps to time")
    parser.add_argument("--replay", default=None,
                        help="on, off or on,off: the 'replay' backend hint (default: the backend's own choice)")
    parser.add_argument("--memory", choices=("low", "normal"), help="the memory setting (default: the config's)")
    parser.add_argument("-o", choices=("md", "json"), default="md")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        backend, replay = json.loads(args.worker)
        print("@@HOST@@" + json.dumps(measure(args.model, backend, args.n, replay, args.memory)))
        return 0
    rows = []
    for backend in [b.strip() for b in args.a.split(",") if b.strip()]:
        for replay in ([r.strip() for r in args.replay.split(",")] if args.replay else [None]):
            memory = ["--memory", args.memory] if args.memory else []
            done = subprocess.run([sys.executable, __file__, "-m", args.model, "-n", str(args.n), *memory,
                                   "--worker", json.dumps([backend, replay])], stdout=subprocess.PIPE, text=True)
            if "@@HOST@@" in done.stdout:
                rows.append(json.loads(done.stdout.split("@@HOST@@", 1)[1]))
            else:
                rows.append({"backend": backend, "replay_asked": replay, "error": f"worker exit {done.returncode}"})
    print(json.dumps(rows, indent=1) if args.o == "json" else render(rows))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
