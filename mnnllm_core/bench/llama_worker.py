"""The same measurements with llama.cpp (PyPI `llama-cpp-python`, the optional `bench` extra)
on a GGUF of the same model, for side-by-side figures. Runs in its own process."""
from __future__ import annotations

import os
import resource
import statistics
import time
from importlib import metadata

from .bench_tests import BenchTest, prompt_tokens
from .worker_protocol import worker_main


def available() -> tuple[bool, str]:
    """Whether llama-cpp-python can be imported here, and why not."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as err:
        return False, f"llama-cpp-python is not installed ({err}); pip install 'mnnllm[bench]'"
    return True, ""


def _run_once(model, test: BenchTest, ids: list[int]) -> float:
    model.reset()
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

    longest = max(t[0] + t[1] for t in job["tests"]) + 8
    start = time.perf_counter()
    model = Llama(model_path=job["gguf"], n_threads=job["threads"], n_threads_batch=job["threads"], n_ctx=longest,
                  n_batch=max(8, max(t[0] for t in job["tests"])), verbose=False)
    load_s = time.perf_counter() - start
    ids = prompt_tokens(longest, model.n_vocab())  # the ids our worker and MNN's use
    rows = []
    for prompt, gen in job["tests"]:
        test = BenchTest(prompt, gen)
        _run_once(model, test, ids)  # warm-up
        samples = [test.tokens / _run_once(model, test, ids) for _ in range(job["reps"])]
        rows.append({"test": test.name, "n_prompt": prompt, "n_gen": gen, "samples_ts": samples,
                     "avg_ts": statistics.fmean(samples),
                     "stddev_ts": statistics.stdev(samples) if len(samples) > 1 else 0.0})
    return {"model": job["config"], "model_size": os.path.getsize(job["gguf"]), "backend": "llama.cpp",
            "threads": job["threads"], "precision": os.path.basename(job["gguf"]), "load_s": load_s,
            "device": "llama.cpp cpu", "versions": {"llama-cpp-python": metadata.version("llama-cpp-python")},
            "rows": rows, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    worker_main(run)


if __name__ == "__main__":
    main()
