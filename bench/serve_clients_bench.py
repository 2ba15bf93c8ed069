"""Many clients at once against `mnnllm serve --parallel N` (continuous batching), in one
command: C concurrent official `openai` clients, each its own question and seed, greedy, streamed;
then the same requests one at a time through the same server ("alone").

Prints: whether every concurrent answer equals its alone answer (text and token count), how many
requests got 503 (the queue is sized to hold every client beyond the slots unless --queue-size
says otherwise, so there should be none), time to first token (TTFT: from sending the request to
its first streamed piece, queueing included; p90: 90 % of requests had it sooner) and per-stream
decode rate ((completion tokens - 1) / the time from the first piece to the last; p90: 90 % of
streams decoded at least this fast, i.e. the 10th percentile) at p50 / p90 / p99 (numpy's linear
interpolation over the C requests), concurrent against alone, and the aggregate decode rate (all
completion tokens / the wall time from the first request sent to the last answer ended). End of
sequence is banned (logit_bias), so every answer runs its whole budget.

    python bench/serve_clients_bench.py [CONFIG] [--clients 16] [--parallel 4] [-n 32] [-t 2]
                                        [--backend cpu] [--set KEY=JSON] [--queue-size Q]
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import openai

from serve_bench import EOS_BANNED, Server  # beside this script

SUBJECTS = ["the sea", "a mountain", "the moon", "a city at night", "autumn leaves", "a old clock", "the desert",
            "a river", "snow", "a lighthouse", "the forest", "a train", "the stars", "a garden", "rain", "a bridge"]
ASKS = ["Write a short poem about {}.", "Describe {} in three sentences.", "Tell a very short story about {}.",
        "List four facts about {}."]
PERCENTILES = (50, 90, 99)


def questions(count: int) -> list[str]:
    """`count` different questions."""
    return [ASKS[i % len(ASKS)].format(SUBJECTS[(i * 7) % len(SUBJECTS)]) + ("" if i < len(SUBJECTS) else f" ({i})")
            for i in range(count)]


def ask(client: openai.OpenAI, question: str, seed: int, n: int) -> dict:
    """One streamed greedy chat answer: its text, completion tokens, send/first/last times, or its error status."""
    sent = time.perf_counter()
    first = last = None
    pieces, usage = [], {}
    try:
        for chunk in client.chat.completions.create(
                model="-", messages=[{"role": "user", "content": question}], temperature=0, seed=seed, max_tokens=n,
                logit_bias=EOS_BANNED, stream=True, stream_options={"include_usage": True}):
            if chunk.usage:
                usage = chunk.usage.model_dump()
            if chunk.choices and chunk.choices[0].delta.content:
                last = time.perf_counter()
                first = first or last
                pieces.append(chunk.choices[0].delta.content)
    except openai.APIStatusError as err:
        return {"status": err.status_code, "sent": sent}
    return {"status": 200, "sent": sent, "first": first, "last": last, "text": "".join(pieces),
            "tokens": usage.get("completion_tokens", 0)}


def concurrent(client: openai.OpenAI, items: list[tuple[str, int]], n: int) -> tuple[list[dict], float]:
    """Every request at once (a thread each, released together); the answers and the wall time."""
    results: list[dict | None] = [None] * len(items)
    gate = threading.Barrier(len(items))

    def client_thread(i: int) -> None:
        gate.wait()
        results[i] = ask(client, *items[i], n)

    threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(len(items))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done = [r for r in results if r["status"] == 200]
    wall = max(r["last"] for r in done) - min(r["sent"] for r in results) if done else float("nan")
    return results, wall


def rates(answers: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT ms, decode tok/s) of each answer."""
    ttft = np.array([(a["first"] - a["sent"]) * 1e3 for a in answers])
    decode = np.array([(a["tokens"] - 1) / (a["last"] - a["first"]) for a in answers])
    return ttft, decode


def cells(values: np.ndarray, digits: int, higher_better: bool = False) -> str:
    """The PERCENTILES of `values`, each its tail: the high end of a time, the low end of a rate."""
    return " | ".join(f"{np.percentile(values, 100 - q if higher_better else q):.{digits}f}" for q in PERCENTILES)


def main() -> None:
    shared = Path(os.environ.get("MNNLLM_SHARED") or Path(__file__).resolve().parents[2] / "shared")
    default = shared / "models/smollm2-135m-instruct-mnn-q4/config.json"
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default=str(default))
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--queue-size", type=int, default=None, help="default: clients - parallel (room for all)")
    parser.add_argument("-n", type=int, default=32, help="tokens per answer")
    parser.add_argument("-t", type=int, default=2, help="thread_num")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                        help="a config override for the server, e.g. backend_hints={\"cpu_int8_activations\":true}")
    args = parser.parse_args()
    queue = args.queue_size if args.queue_size is not None else max(1, args.clients - args.parallel)
    overrides = {"backend_type": args.backend, "thread_num": args.t,
                 **{k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}}
    items = [(q, 1000 + i) for i, q in enumerate(questions(args.clients))]
    load_before = os.getloadavg()
    server = Server(args.config, overrides, ("--parallel", str(args.parallel), "--queue-size", str(queue)))
    try:
        ask(server.client, "Hi", 0, 4)  # warm-up: the first shapes resize and record
        concurrent(server.client, items[:args.parallel], 4)
        together, wall = concurrent(server.client, items, args.n)
        alone = [ask(server.client, q, seed, args.n) for q, seed in items]
    finally:
        server.close()
    refused = sum(r["status"] == 503 for r in together)
    served = [(t, a) for t, a in zip(together, alone) if t["status"] == 200 and a["status"] == 200]
    equal = sum(t["text"] == a["text"] and t["tokens"] == a["tokens"] for t, a in served)
    print(f"load average {' '.join(f'{x:.1f}' for x in load_before)} -> {' '.join(f'{x:.1f}' for x in os.getloadavg())}: "
          f"{Path(args.config).parent.name}, {args.backend}, {args.clients} clients, serve --parallel {args.parallel} "
          f"--queue-size {queue}, -n {args.n}, {args.t} threads, overrides {overrides}")
    print(f"answers equal to the same request alone: {equal} of {len(served)}; 503s: {refused} of {args.clients}; "
          f"other errors: {sum(r['status'] not in (200, 503) for r in together)}")
    for i, (t, a) in enumerate(zip(together, alone)):
        if t["status"] == 200 and a["status"] == 200 and (t["text"], t["tokens"]) != (a["text"], a["tokens"]):
            print(f"  request {i} differs: together {t['text'][:60]!r} alone {a['text'][:60]!r}")
    print()
    print("| requests | TTFT p50 ms | p90 | p99 | decode p50 tok/s | p90 | p99 | aggregate tok/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    ok = [t for t in together if t["status"] == 200]
    ttft, decode = rates(ok)
    print(f"| {len(ok)} concurrent | {cells(ttft, 0)} | {cells(decode, 1, True)} | {sum(r['tokens'] for r in ok) / wall:.1f} |")
    done = [a for a in alone if a["status"] == 200]
    ttft, decode = rates(done)
    busy = sum(a["last"] - a["sent"] for a in done)
    print(f"| {len(done)} one at a time | {cells(ttft, 0)} | {cells(decode, 1, True)} | "
          f"{sum(a['tokens'] for a in done) / busy:.1f} |")


if __name__ == "__main__":
    main()
