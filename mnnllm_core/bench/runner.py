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
