"""Runs every (model, backend, threads) combination in a worker process and gathers rows."""
from __future__ import annotations

import sys
from itertools import product

from ..errors import ConfigError, MnnllmError
from ..llm.config import LlmConfig
from . import llama_worker
from .bench_tests import BenchTest, label
from .rounds import merge_rounds
from .worker_protocol import call_worker


class BenchStopped(MnnllmError):
    """A run failed after others finished: `error` is its error; `results` and `references` hold the
    rows measured before it, which the caller prints before reporting the error."""

    def __init__(self, error: MnnllmError, results: list, references: list):
        super().__init__(error.reason, file=error.file, field=error.field)
        self.error, self.results, self.references = error, results, references


def check_context(config: LlmConfig, tests: list[BenchTest]) -> None:
    """Refuse, before the first run, a test whose depth and tokens exceed the context the model's own
    config sets (`max_all_tokens` in its config.json / llm_config.json). Without one the workers raise
    max_all_tokens to what the longest test needs (a backend's KV buffers may still refuse at run time)."""
    if config.origin("max_all_tokens") is None:
        return
    limit = config.max_all_tokens
    for test in sorted(tests, key=lambda t: -t.context):
        if test.context > limit:
            option = "-d" if test.depth else "-pg" if test.prompt and test.gen else "-p" if test.prompt else "-n"
            raise ConfigError(f"{label(test.name, test.depth)} needs {test.context} tokens of context; the model's "
                              f"max_all_tokens is {limit}", file=config.origin("max_all_tokens"), field=option)


def llama_pairs(models: list[str], vs_llama: str | None) -> list[tuple[str, str]]:
    """(model, GGUF) for llama.cpp: `vs_llama` names one GGUF for every model, or one per model."""
    ggufs = vs_llama.split(",") if vs_llama else []
    if len(ggufs) not in (0, 1, len(models)):
        raise ConfigError(f"{len(ggufs)} GGUF files for {len(models)} models: give one, or one per model",
                          field="--vs-llama")
    return list(zip(models, ggufs if len(ggufs) > 1 else ggufs * len(models)))


def run_bench(models: list[str], backends: list[str], threads: list[int], tests: list[tuple[int, int, int]],
              reps: int, precision: int, profile: bool, vs_mnn: bool, timeout: float = 3600,
              memory: list[str | None] | None = None, vs_llama: str | None = None,
              settings: dict | None = None, llama_kv: list[str] | None = None,
              rounds: int = 1) -> tuple[list, list]:
    """Our rows, then the reference rows: MNN's (vs_mnn) and llama.cpp's on the GGUF `vs_llama`.
    `tests` holds (prompt, gen, depth) each; every engine runs `rounds` times, in turn (rounds.py).
    `memory` lists the memory modes to run (None: the model's own setting); `settings` are config
    keys set in every run of ours and MNN's (`--set`); `llama_kv` the KV cache types llama.cpp runs
    with (f16 by default). A run that fails after others finished raises
    BenchStopped with their rows (those of the rounds that finished, or of the first round's
    runs that did)."""
    results, references = [], []
    llama_pairs(models, vs_llama)  # a mismatch is an error before any run
    try:
        rounds_run = []
        for number in range(rounds):
            ours, theirs = ([], []) if number else (results, references)
            if rounds > 1:
                print(f"[round {number + 1}/{rounds}]", file=sys.stderr, flush=True)
            _run_round(ours, theirs, models, backends, threads, tests, reps, precision, profile, vs_mnn, timeout,
                       memory, vs_llama, settings or {}, llama_kv or ["f16"])
            rounds_run.append((list(ours), list(theirs)))
            results[:] = merge_rounds([o for o, _ in rounds_run])
            references[:] = merge_rounds([t for _, t in rounds_run])
        attach_host_bandwidth(results, timeout)
    except MnnllmError as err:
        if results or references:
            raise BenchStopped(err, results, references) from err
        raise
    return results, references


def attach_host_bandwidth(results: list[dict], timeout: float) -> None:
    """The host's read bandwidth at each result's thread count (`host_read_gbs`, the best read;
    `host_read_median_gbs`, the median of `host_reads`), measured once per
    thread count in a worker of its own, for the results whose weights are read from host memory
    and that decoded (the roofline line compares the two). A probe that fails costs the lines their
    share, not the runs: it is said on stderr."""
    wanted = [r for r in results if r.get("reads_host_memory") and r.get("decode_weight_bytes")
              and any(row["n_prompt"] == 0 and row["n_gen"] for row in r["rows"])]
    if not wanted:
        return
    threads = sorted({r["threads"] for r in wanted})
    print(f"[memory] read bandwidth of this host, {', '.join(map(str, threads))} threads", file=sys.stderr,
          flush=True)
    try:
        probe = call_worker("mnnllm_core.bench.memory_probe", {"config": "-", "backend": "memory probe",
                                                              "threads": threads}, timeout)
    except MnnllmError as err:
        print(f"[memory] no read bandwidth: {err}", file=sys.stderr, flush=True)
        return
    for result in wanted:
        result["host_read_gbs"] = probe["read_gbs"][str(result["threads"])]
        result["host_read_median_gbs"] = probe["median_gbs"][str(result["threads"])]
        result["host_reads"] = probe["rounds"]


def _run_round(results: list, references: list, models, backends, threads, tests, reps, precision, profile, vs_mnn,
               timeout, memory, vs_llama, settings, llama_kv) -> None:
    combos = list(product(models, backends, memory or [None], threads))
    for i, (model, backend, mode, thread) in enumerate(combos, 1):
        print(f"[{i}/{len(combos)}] {model} on {backend}{f' (memory {mode})' if mode else ''}, {thread} threads",
              file=sys.stderr, flush=True)
        job = {"config": model, "backend": backend, "threads": thread, "tests": tests, "reps": reps,
               "precision": precision, "profile": profile, "memory": mode, "settings": settings}
        results.append(call_worker("mnnllm_core.bench.mnnllm_worker", job, timeout))
    if vs_mnn:
        for model, thread in product(models, threads):
            print(f"[MNN] {model}, {thread} threads", file=sys.stderr, flush=True)
            job = {"config": model, "backend": "mnn", "threads": thread, "tests": tests, "reps": reps,
                   "precision": precision, "settings": settings}
            references.append(call_worker("mnnllm_core.bench.mnn_worker", job, timeout))
    if vs_llama:
        usable, reason = llama_worker.available()
        if not usable:
            print(f"[llama.cpp] skipped: {reason}", file=sys.stderr, flush=True)
        for (model, gguf), thread, cache_type in product(llama_pairs(models, vs_llama), threads,
                                                         llama_kv) if usable else ():
            print(f"[llama.cpp] {gguf}, {thread} threads, {cache_type} KV", file=sys.stderr, flush=True)
            job = {"config": model, "gguf": gguf, "backend": "llama.cpp", "threads": thread, "tests": tests,
                   "reps": reps, "cache_type": cache_type}
            references.append(call_worker("mnnllm_core.bench.llama_worker", job, timeout))
