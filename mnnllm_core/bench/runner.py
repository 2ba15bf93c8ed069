"""Runs every (model, backend, threads) combination in a worker process and gathers rows."""
from __future__ import annotations

import json
import subprocess
import sys
import traceback
from collections.abc import Callable
from itertools import product

from ..errors import MnnllmError

_MARKER = "@@BENCH@@"


class WorkerError(MnnllmError):
    """A benchmark worker failed: the message is the worker's own error, `worker_traceback` its traceback."""

    def __init__(self, message: str, worker_traceback: str = ""):
        super().__init__(message)
        self.worker_traceback = worker_traceback


def worker_main(run: Callable[[dict], dict]) -> None:
    """A worker process's main: the job as JSON on stdin; the marker, then the result or the
    error (its one-line message and traceback) as JSON on stdout."""
    job = json.load(sys.stdin)
    try:
        reply = run(job)
    except KeyboardInterrupt:
        sys.exit(130)  # Ctrl-C reached the whole process group: the parent reports it
    except MnnllmError as err:
        reply = {"error": str(err), "traceback": traceback.format_exc()}
    except Exception as err:  # a bug or a library's own error: still one line for the parent
        reply = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
    print(_MARKER + json.dumps(reply), flush=True)


def _worker(module: str, job: dict, timeout: float) -> dict:
    try:
        done = subprocess.run([sys.executable, "-m", module], input=json.dumps(job), text=True,
                              stdout=subprocess.PIPE, stderr=None, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise MnnllmError(f"the benchmark worker for {job['backend']} ran past {timeout:.0f} s",
                          file=job["config"]) from None
    if _MARKER not in done.stdout:
        raise MnnllmError(f"the benchmark worker for {job['backend']} died without a result "
                          f"(exit {done.returncode})", file=job["config"])
    reply = json.loads(done.stdout.split(_MARKER, 1)[1])
    if "error" in reply:
        raise WorkerError(reply["error"], reply.get("traceback", ""))
    return reply


def run_bench(models: list[str], backends: list[str], threads: list[int], tests: list[tuple[int, int]],
              reps: int, precision: int, profile: bool, vs_mnn: bool, timeout: float = 3600,
              memory: list[str | None] | None = None, vs_llama: str | None = None) -> tuple[list, list]:
    """Our rows, then the reference rows: MNN's (vs_mnn) and llama.cpp's on the GGUF `vs_llama`.
    `memory` lists the memory modes to run (None: the model's own setting)."""
    results, references = [], []
    combos = list(product(models, backends, memory or [None], threads))
    for i, (model, backend, mode, thread) in enumerate(combos, 1):
        print(f"[{i}/{len(combos)}] {model} on {backend}{f' (memory {mode})' if mode else ''}, {thread} threads",
              file=sys.stderr, flush=True)
        job = {"config": model, "backend": backend, "threads": thread, "tests": tests, "reps": reps,
               "precision": precision, "profile": profile, "memory": mode}
        results.append(_worker("mnnllm_core.bench.worker", job, timeout))
    if vs_mnn:
        for model, thread in product(models, threads):
            print(f"[MNN] {model}, {thread} threads", file=sys.stderr, flush=True)
            job = {"config": model, "backend": "mnn", "threads": thread, "tests": tests, "reps": reps,
                   "precision": precision}
            references.append(_worker("mnnllm_core.bench.mnn_worker", job, timeout))
    if vs_llama:
        from .llama_worker import available
        usable, reason = available()
        if not usable:
            print(f"[llama.cpp] skipped: {reason}", file=sys.stderr, flush=True)
        for model, thread in product(models, threads) if usable else ():
            print(f"[llama.cpp] {vs_llama}, {thread} threads", file=sys.stderr, flush=True)
            job = {"config": model, "gguf": vs_llama, "backend": "llama.cpp", "threads": thread, "tests": tests,
                   "reps": reps}
            references.append(_worker("mnnllm_core.bench.llama_worker", job, timeout))
    return results, references
