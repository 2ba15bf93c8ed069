"""Runs every (model, backend, threads) combination in a worker process and gathers rows."""
from __future__ import annotations

import json
import subprocess
import sys
from itertools import product

from ..errors import MnnllmError


def _worker(module: str, job: dict, timeout: float) -> dict:
    done = subprocess.run([sys.executable, "-m", module], input=json.dumps(job), text=True,
                          stdout=subprocess.PIPE, stderr=None, timeout=timeout)
    marker = "@@BENCH@@"
    if marker not in done.stdout:
        raise MnnllmError(f"benchmark worker {module} failed for {job['backend']} (exit {done.returncode})",
                          file=job["config"], field="backend_type")
    return json.loads(done.stdout.split(marker, 1)[1])


def run_bench(models: list[str], backends: list[str], threads: list[int], tests: list[tuple[int, int]],
              reps: int, precision: int, profile: bool, vs_mnn: bool, timeout: float = 3600) -> tuple[list, list]:
    results, mnn = [], []
    combos = list(product(models, backends, threads))
    for i, (model, backend, thread) in enumerate(combos, 1):
        print(f"[{i}/{len(combos)}] {model} on {backend}, {thread} threads", file=sys.stderr, flush=True)
        job = {"config": model, "backend": backend, "threads": thread, "tests": tests, "reps": reps,
               "precision": precision, "profile": profile}
        results.append(_worker("mnnllm_core.bench.worker", job, timeout))
    if vs_mnn:
        for model, thread in product(models, threads):
            print(f"[MNN] {model}, {thread} threads", file=sys.stderr, flush=True)
            job = {"config": model, "backend": "mnn", "threads": thread, "tests": tests, "reps": reps,
                   "precision": precision}
            mnn.append(_worker("mnnllm_core.bench.mnn_worker", job, timeout))
    return results, mnn
