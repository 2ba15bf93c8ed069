"""What reuse saves, measured side by side in one run (medians of -n runs, the variants alternating):

* chat: the prefill of turn 4 of a greedy chat with KV reuse (the default) and with
  `reuse_kv: false` (the whole conversation prefilled again), in one process;
* prefix: time to the first token of a prompt with a ~1k-token shared prefix (a long system
  prompt), in fresh processes, without and with the prefix cache on disk (`prefix_cache_path`,
  filled once by a first process with another question);
* load: load time and resident memory (VmRSS, and its private part RssAnon) in fresh processes
  without `use_mmap`, with it on an empty `tmp_path` (packs and writes) and with it again (maps).

    python bench/reuse_bench.py [CONFIG ...] [-n 3] [--only chat,prefix,load] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from shared_models import SHARED_MODEL  # beside this script

WORKER = r"""
import json, sys, time
job = json.loads(sys.argv[1])
start = time.perf_counter()
import mnnllm_core
llm = mnnllm_core.create(job["config"])
llm.set_config({"sampler_type": "greedy", "thread_num": 2, "max_all_tokens": 4096, **job["keys"]})
llm.load()
load_s = time.perf_counter() - start

def memory():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "RssAnon", "RssFile")}

out = {"load_s": load_s, "after_load_mib": memory()}
if job["mode"] == "load":
    llm.generate(llm.tokenizer_encode("Hello"), 4)
    out["after_generate_mib"] = memory()
elif job["mode"] == "prefix":
    messages = [{"role": "system", "content": job["system"]}, {"role": "user", "content": job["question"]}]
    ids = llm.tokenizer_encode(llm.apply_chat_template(messages))
    start = time.perf_counter()
    out["tokens"] = llm.generate(ids, 1)
    out["first_token_s"] = time.perf_counter() - start
    out["prompt_tokens"] = len(ids)
else:
    turns = []
    for reuse in job["order"]:
        llm.set_config({"reuse_kv": reuse})
        llm.reset()
        messages = []
        for question in job["questions"]:
            messages.append({"role": "user", "content": question})
            ids = llm.tokenizer_encode(llm.apply_chat_template(messages))
            new = len(ids) - llm.cached_prefix(ids)
            answer = llm.generate(ids, 16)
            messages.append({"role": "assistant", "content": llm.tokenizer_decode(
                [t for t in answer if not llm.tokenizer.is_stop(t)])})
        turns.append({"reuse": reuse, "prefill_s": llm.context.prefill_us / 1e6, "prompt_tokens": len(ids),
                      "prefilled_tokens": new, "answer": answer})
    out["turns"] = turns
print(json.dumps(out))
"""

QUESTIONS = ["What is the capital of France?", "And what is it famous for?", "Name three of its museums.",
             "Which of them is the oldest?"]
FACTS = ("Clock {i}: built in {year} in {town}; it has {n} wheels, a {metal} case, and it strikes every {h} hours. ")


def long_system_prompt(sentences: int = 30) -> str:
    towns, metals = ["Leiden", "Prague", "Bern", "Lyon", "Turin"], ["brass", "silver", "iron"]
    text = "You are the guide of a museum of clocks. Here is the catalogue. "
    return text + "".join(FACTS.format(i=i, year=1600 + 7 * i, town=towns[i % 5], n=3 + i % 9, metal=metals[i % 3],
                                       h=1 + i % 4) for i in range(sentences))


def run(job: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", WORKER, json.dumps(job)], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def median(rows: list[dict], key) -> float:
    return statistics.median(key(r) for r in rows)


def bench_chat(config: str, n: int) -> dict:
    order = [True, False, False, True] * ((n + 1) // 2)
    turns = run({"mode": "chat", "config": config, "keys": {}, "order": order[:2 * n], "questions": QUESTIONS})["turns"]
    on = [t for t in turns if t["reuse"]]
    off = [t for t in turns if not t["reuse"]]
    assert all(t["answer"] == on[0]["answer"] for t in turns), "reuse changed the greedy tokens"
    reused, whole = median(on, lambda t: t["prefill_s"]), median(off, lambda t: t["prefill_s"])
    return {"turn4_prompt_tokens": on[0]["prompt_tokens"], "prefilled_with_reuse": on[0]["prefilled_tokens"],
            "prefill_s_reuse": round(reused, 3), "prefill_s_no_reuse": round(whole, 3),
            "saved_s": round(whole - reused, 3), "ratio": round(whole / reused, 1)}


def bench_prefix(config: str, n: int) -> dict:
    system = long_system_prompt()
    folder = tempfile.mkdtemp(prefix="prefix-bench-")
    cached = {"prefix_cache_path": folder}
    fill = run({"mode": "prefix", "config": config, "keys": cached, "system": system, "question": "Hello!"})
    cold, warm = [], []
    for _ in range(n):
        job = {"mode": "prefix", "config": config, "system": system, "question": "Which clock is the oldest?"}
        cold.append(run({**job, "keys": {}}))
        warm.append(run({**job, "keys": cached}))
        for path in Path(folder).rglob("*.kv"):  # keep only the shared-prefix file the first process made
            if path.name.split("-")[0] != str(fill["prompt_tokens"]):
                path.unlink()
    assert all(r["tokens"] == cold[0]["tokens"] for r in cold + warm), "the prefix cache changed the tokens"
    without, with_cache = median(cold, lambda r: r["first_token_s"]), median(warm, lambda r: r["first_token_s"])
    return {"prompt_tokens": cold[0]["prompt_tokens"], "first_token_s_no_cache": round(without, 3),
            "first_token_s_prefix_cache": round(with_cache, 3), "saved_s": round(without - with_cache, 3),
            "ratio": round(without / with_cache, 1), "filling_run_first_token_s": round(fill["first_token_s"], 3)}


def bench_load(config: str, n: int) -> dict:
    rows = {"plain": [], "mmap_first": [], "mmap_second": []}
    for _ in range(n):
        folder = tempfile.mkdtemp(prefix="mmap-bench-")
        keys = {"use_mmap": True, "tmp_path": folder}
        rows["plain"].append(run({"mode": "load", "config": config, "keys": {}}))
        rows["mmap_first"].append(run({"mode": "load", "config": config, "keys": keys}))
        rows["mmap_second"].append(run({"mode": "load", "config": config, "keys": keys}))
    result = {}
    for name, runs in rows.items():
        result[name] = {"load_s": round(median(runs, lambda r: r["load_s"]), 3),
                        **{f"{k}_mib_after_generate": round(median(runs, lambda r: r["after_generate_mib"][k]), 1)
                           for k in ("VmRSS", "RssAnon", "RssFile")}}
    result["second_vs_first_load"] = round(result["mmap_second"]["load_s"] / result["mmap_first"]["load_s"], 2)
    result["second_vs_plain_load"] = round(result["mmap_second"]["load_s"] / result["plain"]["load_s"], 2)
    return result


def main() -> None:
    default = SHARED_MODEL
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="*", default=[str(default)])
    parser.add_argument("-n", type=int, default=3)
    parser.add_argument("--only", default="chat,prefix,load")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    benches = {"chat": bench_chat, "prefix": bench_prefix, "load": bench_load}
    results = {config: {name: benches[name](config, args.n) for name in args.only.split(",")}
               for config in args.configs}
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for config, parts in results.items():
        print(f"## {config}")
        for name, values in parts.items():
            print(f"{name}: {json.dumps(values)}")


if __name__ == "__main__":
    main()
