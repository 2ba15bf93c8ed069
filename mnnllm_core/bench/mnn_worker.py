"""The same measurements with MNN's own C++ runtime (PyPI MNN), for side-by-side figures.
Runs in its own process (MNN allows one model per process)."""
from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import tempfile
import time
from importlib import metadata

from ..llm.config import LlmConfig
from ..llm.tokenizer import create_tokenizer
from .bench_tests import BenchTest, prompt_tokens
from .worker_protocol import PRECISIONS, worker_main


def run(job: dict) -> dict:
    import MNN.llm as mnn_llm

    folder = os.path.dirname(os.path.abspath(job["config"]))
    config = json.load(open(job["config"]))
    config.update({**job.get("settings", {}), "base_dir": folder + "/", "thread_num": job["threads"], "sampler_type": "greedy",
                   "precision": PRECISIONS[job["precision"]], "memory": job.get("mnn_memory", "low"),
                   "max_all_tokens": 8192})
    path = os.path.join(tempfile.mkdtemp(), "config.json")
    json.dump(config, open(path, "w"))
    start = time.perf_counter()
    model = mnn_llm.create(path)
    model.load()
    load_s = time.perf_counter() - start
    vocab = create_tokenizer(LlmConfig.from_file(job["config"]).tokenizer_file).vocab_size
    ids = prompt_tokens(max(t[0] for t in job["tests"]) + 2, vocab)  # the same ids our worker uses
    rows = []
    for prompt, gen in job["tests"]:
        test = BenchTest(prompt, gen)
        samples = []
        for rep in range(job["reps"] + 1):
            model.reset()
            ctx0 = _ctx(model)
            if test.gen == 0:
                start = time.perf_counter()
                model.forward(ids[:test.prompt])
                seconds, count = time.perf_counter() - start, test.prompt
            else:
                start = time.perf_counter()
                model._c_obj.generate(ids[:max(test.prompt, 1)], test.gen + 1)
                total = time.perf_counter() - start
                ctx1 = _ctx(model)
                decoded = ctx1["gen_seq_len"] - ctx0.get("gen_seq_len", 0)
                decode_s = (ctx1["decode_us"] - ctx0.get("decode_us", 0)) / 1e6
                if test.prompt:
                    seconds, count = total, test.prompt + max(decoded - 1, 0)
                else:
                    seconds, count = decode_s, max(decoded - 1, 1)
            if rep:  # the first run is the warm-up
                samples.append(count / seconds)
        rows.append({"test": test.name, "n_prompt": prompt, "n_gen": gen, "samples_ts": samples,
                     "avg_ts": statistics.fmean(samples),
                     "stddev_ts": statistics.stdev(samples) if len(samples) > 1 else 0.0})
    return {"model": job["config"], "backend": f"mnn-cpu({config['memory']})", "threads": job["threads"],
            "precision": config["precision"], "load_s": load_s, "device": "MNN C++ cpu",
            "versions": {"MNN": metadata.version("MNN")}, "rows": rows,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _ctx(model) -> dict:
    ctx = model.context
    if isinstance(ctx, dict):
        return ctx
    return {k: getattr(ctx, k) for k in ("gen_seq_len", "decode_us", "prefill_us") if hasattr(ctx, k)}


def main() -> None:
    worker_main(run)
    sys.stdout.flush()
    os._exit(0)  # MNN 3.6.1 can crash in its destructors at exit


if __name__ == "__main__":
    main()
