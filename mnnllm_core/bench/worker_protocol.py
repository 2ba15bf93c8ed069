"""How `mnnllm bench` talks to its worker processes: the job as JSON on stdin, a marker line
then the result (or the worker's error) as JSON on stdout. Both ends live here so the runner
and the workers import this file and never each other."""
from __future__ import annotations

import json
import subprocess
import sys
import traceback
from collections.abc import Callable

from ..errors import MnnllmError

_MARKER = "@@BENCH@@"

PRECISIONS = {0: "normal", 1: "high", 2: "low"}  # a job's `precision` (`mnnllm bench -c`) -> the config's name


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


def call_worker(module: str, job: dict, timeout: float) -> dict:
    """Run the worker `python -m module` on `job` and return its result; its error as WorkerError."""
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
