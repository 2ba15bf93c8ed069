"""Measures one (model, backend, threads) combination with mnnllm itself, in its own process,
so load time, peak memory and BLAS thread settings are its own. Job as JSON on stdin, result
on stdout."""
from __future__ import annotations

import os
import platform
import resource
import statistics
import sys
import time

import numpy as np

from .bench_tests import BenchTest, depth_tokens, job_tests, label, prompt_tokens, row
from .worker_protocol import PRECISIONS, worker_main


def _model_size(config) -> int:
    return sum(os.path.getsize(p) for p in (config.llm_model, config.llm_weight) if os.path.exists(p))


def _next(llm, logits: np.ndarray) -> int:
    """Greedy over the ids the tokenizer knows: a random model's logits may favour the padding rows
    of a vocabulary larger than its tokenizer's (as Qwen's are), which forward() would refuse."""
    return int(np.argmax(logits[:llm.tokenizer.vocab_size]))


def _decode(llm, first: int, steps: int) -> None:
    token = first
    for _ in range(steps):
        token = _next(llm, llm.forward([token]))


def _run_once(llm, test: BenchTest, ids: list[int], depth_ids: list[int]) -> float:
    """Seconds of the timed part of one run, from an empty conversation: the depth (llama-bench's
    n_depth) is prefilled first, untimed, afresh for every run; a decode test runs one more
    untimed token (a prompt of 1) before its timed decodes."""
    llm.reset()
    if test.depth:
        llm.forward(depth_ids[:test.depth])
    start = time.perf_counter()
    if test.prompt:
        logits = llm.forward(ids[:test.prompt])
        _decode(llm, _next(llm, logits), test.gen)
    else:
        llm.forward(ids[:1])
        start = time.perf_counter()
        _decode(llm, ids[1], test.gen)
    return time.perf_counter() - start


def _vision_row(vision, reps: int) -> dict:
    """Images per second through a vision-language model's encoder (preprocessing included) at
    its image_size, as MNN's demo reports the vision time; `mp_s` is the same in megapixels/s."""
    height, width = vision.target_size(None, None)
    image = np.random.default_rng(0).integers(0, 256, (height, width, 3)).astype(np.float32)
    vision.encode(image)  # warm-up: the resize for this shape
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        vision.encode(image)
        samples.append(1.0 / (time.perf_counter() - start))
    avg = statistics.fmean(samples)
    return {"test": f"vision{height}x{width} img/s", "n_prompt": 0, "n_gen": 0, "samples_ts": samples,
            "avg_ts": avg, "stddev_ts": statistics.stdev(samples) if len(samples) > 1 else 0.0,
            "mp_s": avg * height * width / 1e6}


def _profile(llm, ids: list[int]) -> dict:
    """Seconds per (backend, op type) for one prefill and one decode step."""
    result = {}
    for phase, tokens in (("prefill", ids), ("decode", ids[:1])):
        if phase == "prefill":
            llm.reset()
        module = llm.pool.get(len(tokens), False)
        pipeline = module.static_module.session.pipeline
        pipeline.profile = {}
        llm.forward(tokens)
        times, pipeline.profile = pipeline.profile, None
        total = sum(times.values()) or 1.0
        result[phase] = [{"backend": b, "op": op, "ms": round(t * 1e3, 3), "share": round(t / total, 4)}
                         for (b, op), t in sorted(times.items(), key=lambda kv: -kv[1])]
    return result


def _packed_bytes(llm) -> int:
    module = llm.pool.get(1, False)
    return sum(e.packed_bytes for _, e in module.static_module.session.pipeline.executions.values())


def _progress(line: str) -> None:
    """A progress line: redrawn in place on a terminal, one line each when stderr is a pipe or a file."""
    if sys.stderr.isatty():
        print(f"\r{line}", end="", file=sys.stderr, flush=True)
    else:
        print(line, file=sys.stderr, flush=True)


def run(job: dict) -> dict:
    from mnnllm_core import __version__
    from mnnllm_core.llm.create import create
    from mnnllm_core.plugins.manager import registry

    tests = job_tests(job)
    llm = create(job["config"])
    llm.set_config({**job.get("settings", {}), "backend_type": job["backend"], "thread_num": job["threads"],
                    "precision": PRECISIONS[job["precision"]], "sampler_type": "greedy",
                    "max_all_tokens": max(4096, max(t.context for t in tests) + 8),
                    **({"memory": job["memory"]} if job.get("memory") else {})})
    start = time.perf_counter()
    llm.load()
    load_s = time.perf_counter() - start
    vocab = llm.tokenizer.vocab_size
    ids = prompt_tokens(max(t.prompt for t in tests) + 2, vocab)
    depth_ids = depth_tokens(max(t.depth for t in tests), vocab)
    rows = []
    for test in tests:
        cold_s = _run_once(llm, test, ids, depth_ids)  # warm-up: resizes, kernel compiles and tuning, page faults
        samples = []
        for rep in range(job["reps"]):
            _progress(f"  {job['backend']} t{job['threads']} {label(test.name, test.depth)} {rep + 1}/{job['reps']}")
            samples.append(test.tokens / _run_once(llm, test, ids, depth_ids))
        rows.append(row(test, samples, cold_ts=test.tokens / cold_s, n_kv=len(llm.conversation)))
    if getattr(llm, "vision", None) is not None:
        rows.append(_vision_row(llm.vision, job["reps"]))
    if sys.stderr.isatty():
        print("\r", end="", file=sys.stderr)
    honours = registry().get(job["backend"]).settings
    result = {
        "model": job["config"], "model_size": _model_size(llm.config),
        "backend": f"{job['backend']}({job['memory']})" if job.get("memory") else job["backend"],
        "threads": job["threads"], "precision": PRECISIONS[job["precision"]] if "precision" in honours else "-",
        "honours": sorted(honours), "load_s": load_s,
        "device": llm.runtime_manager.runtime.device_name(), "placement": llm.placement(),
        "decode_weight_bytes": _packed_bytes(llm),
        "reads_host_memory": llm.runtime_manager.runtime.reads_host_memory,
        "versions": {"mnnllm": __version__, "numpy": np.__version__, "python": platform.python_version(),
                     "backend": registry().version_of(job["backend"])},
        "rows": rows,
    }
    if job.get("profile"):
        result["profile"] = _profile(llm, ids[:max(1, max(t.prompt for t in tests) or 64)])
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def main() -> None:
    worker_main(run)


if __name__ == "__main__":
    main()
