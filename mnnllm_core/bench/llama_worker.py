"""The same measurements with llama.cpp (PyPI `llama-cpp-python`, the optional `bench` extra)
on a GGUF of the same model, for side-by-side figures. Runs in its own process. `cache_type` is the
KV cache's type (llama-bench's -ctk and -ctv: f16, q8_0, q4_0); a quantized one turns flash attention
on, as llama.cpp needs for a quantized V cache.

Depth (`-d`) as llama-bench: `reset()` then `eval(depth ids)` untimed (eval appends to the KV
cache from n_tokens on), then the timed part, afresh for every run (llama-bench restores a
saved state instead; the timed part starts from the same cache either way)."""
from __future__ import annotations

import os
import resource
import time
from importlib import metadata

from .bench_tests import BenchTest, depth_tokens, job_tests, prompt_tokens, row
from .worker_protocol import worker_main

# ggml_type values (ggml.h's enum ggml_type) of the KV cache types llama-bench's -ctk / -ctv take
KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}


def available() -> tuple[bool, str]:
    """Whether llama-cpp-python can be imported here, and why not."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as err:
        return False, f"llama-cpp-python is not installed ({err}); pip install 'mnnllm[bench]'"
    return True, ""


def _run_once(model, test: BenchTest, ids: list[int], depth_ids: list[int]) -> float:
    model.reset()
    if test.depth:
        model.eval(depth_ids[:test.depth])
    if test.prompt:
        start = time.perf_counter()
        model.eval(ids[:test.prompt])
    else:
        model.eval(ids[:1])
        start = time.perf_counter()
    for i in range(test.gen):
        model.eval([ids[(test.prompt + 1 + i) % len(ids)]])
    return time.perf_counter() - start


def run(job: dict) -> dict:
    from llama_cpp import Llama

    tests = job_tests(job)
    longest = max(t.context for t in tests) + 8
    batch = max(8, max(t.prompt for t in tests), min(max(t.depth for t in tests), 2048))  # llama-bench's -b 2048
    cache_type = job.get("cache_type", "f16")
    if cache_type not in KV_TYPES:
        raise ValueError(f"llama.cpp KV cache type {cache_type!r} is not one of {', '.join(KV_TYPES)}")
    start = time.perf_counter()
    model = Llama(model_path=job["gguf"], n_threads=job["threads"], n_threads_batch=job["threads"], n_ctx=longest,
                  n_batch=batch, verbose=False, type_k=KV_TYPES[cache_type], type_v=KV_TYPES[cache_type],
                  flash_attn=cache_type != "f16")
    load_s = time.perf_counter() - start
    ids = prompt_tokens(longest, model.n_vocab())  # the ids our worker and MNN's use
    depth_ids = depth_tokens(max(t.depth for t in tests), model.n_vocab())
    rows = []
    for test in tests:
        _run_once(model, test, ids, depth_ids)  # warm-up
        samples = [test.tokens / _run_once(model, test, ids, depth_ids) for _ in range(job["reps"])]
        rows.append(row(test, samples, n_kv=model.n_tokens))
    return {"model": job["config"], "model_size": os.path.getsize(job["gguf"]), "backend": "llama.cpp",
            "threads": job["threads"], "precision": f"{os.path.basename(job['gguf'])}, {cache_type} KV",
            "load_s": load_s,
            "device": "llama.cpp cpu", "versions": {"llama-cpp-python": metadata.version("llama-cpp-python")},
            "rows": rows, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    worker_main(run)


if __name__ == "__main__":
    main()
