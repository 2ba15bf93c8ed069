"""The same measurements with MNN's own C++ runtime (PyPI MNN), for side-by-side figures.
Runs in its own process (MNN allows one model per process).

Depth (`-d`): MNN's own `llm_bench` (transformers/llm/engine/demo/llm_bench.cpp) has no depth
option, so this follows llama-bench's meaning with what pymnn 3.6.1 exposes: `reset()`, then
`forward(depth ids)` untimed (pymnn's forward keeps its tokens in the KV cache: the next
forward or generate continues from them, as the context's all_seq_len shows), then the timed
part, afresh for every run. A prefill test is `forward(prompt)`, timed here; a decode test is
`generate(1 token, N + 1)` timed by MNN's own decode_us, so it decodes at depth + 1 onwards,
as our decode test does (llama-bench decodes at depth onwards). After the depth MNN counts the
context as decoding (gen_seq_len > 0), so a timed prompt runs through the module clone MNN keeps
for its length, as a later chat turn on a kept cache does, not through its prefill module."""
from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from importlib import metadata

from ..llm.config import LlmConfig
from ..llm.tokenizer import create_tokenizer
from .bench_tests import BenchTest, depth_tokens, job_tests, prompt_tokens, row
from .worker_protocol import PRECISIONS, worker_main


def _run_once(model, test: BenchTest, ids: list[int], depth_ids: list[int]) -> tuple[float, int]:
    """Seconds and tokens of one run's timed part, after the untimed depth prefill."""
    model.reset()
    if test.depth:
        model.forward(depth_ids[:test.depth])
    ctx0 = _ctx(model)  # MNN's counters add up across calls: the run's own are the differences
    if test.gen == 0:
        start = time.perf_counter()
        model.forward(ids[:test.prompt])
        return time.perf_counter() - start, test.prompt
    start = time.perf_counter()
    model._c_obj.generate(ids[:max(test.prompt, 1)], test.gen + 1)
    total = time.perf_counter() - start
    ctx1 = _ctx(model)
    decoded = ctx1["gen_seq_len"] - ctx0.get("gen_seq_len", 0)
    if test.prompt:
        return total, test.prompt + max(decoded - 1, 0)
    return (ctx1["decode_us"] - ctx0.get("decode_us", 0)) / 1e6, max(decoded - 1, 1)


def run(job: dict) -> dict:
    import MNN.llm as mnn_llm

    tests = job_tests(job)
    folder = os.path.dirname(os.path.abspath(job["config"]))
    config = json.load(open(job["config"]))
    config.update({**job.get("settings", {}), "base_dir": folder + "/", "thread_num": job["threads"], "sampler_type": "greedy",
                   "precision": PRECISIONS[job["precision"]], "memory": job.get("mnn_memory", "low"),
                   "max_all_tokens": max(8192, max(t.context for t in tests) + 8)})
    path = os.path.join(tempfile.mkdtemp(), "config.json")
    json.dump(config, open(path, "w"))
    start = time.perf_counter()
    model = mnn_llm.create(path)
    model.load()
    load_s = time.perf_counter() - start
    vocab = create_tokenizer(LlmConfig.from_file(job["config"]).tokenizer_file).vocab_size
    ids = prompt_tokens(max(t.prompt for t in tests) + 2, vocab)  # the same ids our worker uses
    depth_ids = depth_tokens(max(t.depth for t in tests), vocab)
    rows = []
    for test in tests:
        _run_once(model, test, ids, depth_ids)  # warm-up
        samples = []
        for _ in range(job["reps"]):
            seconds, count = _run_once(model, test, ids, depth_ids)
            samples.append(count / seconds)
        rows.append(row(test, samples, n_kv=_ctx(model)["all_seq_len"]))
    return {"model": job["config"], "backend": f"mnn-cpu({config['memory']})", "threads": job["threads"],
            "precision": config["precision"], "load_s": load_s, "device": "MNN C++ cpu",
            "versions": {"MNN": metadata.version("MNN")}, "rows": rows,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _ctx(model) -> dict:
    # pymnn 3.6.1 converts the context's generate_str (the decoded reply) to a Python str without a
    # check: a reply whose bytes are not UTF-8 (byte tokens of a random-weight model) crashed the
    # worker with SIGSEGV (the 8B shape's "decode crash"). The timings do not need it: cleared first.
    if hasattr(model, "_c_obj") and hasattr(model._c_obj, "set_context"):
        model._c_obj.set_context({"generate_str": ""})
    ctx = model.context
    if isinstance(ctx, dict):
        return ctx
    return {k: getattr(ctx, k) for k in ("gen_seq_len", "decode_us", "prefill_us", "all_seq_len") if hasattr(ctx, k)}


def main() -> None:
    worker_main(run)
    sys.stdout.flush()
    os._exit(0)  # MNN 3.6.1 can crash in its destructors at exit


if __name__ == "__main__":
    main()
