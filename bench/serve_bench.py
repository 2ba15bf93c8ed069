"""`mnnllm serve` measured side by side with the Python API, in one run:

1. overhead: time to first token (TTFT) and decode tok/s of the same greedy answers, streamed
   through the server (a `mnnllm serve` subprocess, the official openai client) and from
   `Llm.stream_text` in this process, taking turns so both see the same load;
2. prompt cache: a 4-turn chat through the server, each turn once extending the previous
   conversation (its KV cache reused) and once after an unrelated request (prefilled whole);
   the server's log gives each request's prefill time.

    python bench/serve_bench.py [CONFIG] [-rep 5] [-n 64] [--backend cpu] [-t 2] [--json]
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import threading
import time

import openai

import mnnllm_core
from shared_models import SHARED_MODEL  # beside this script

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "1+1="]
TURNS = ["What is the capital of France?", "And of Italy?", "Which of the two cities is older?",
         "Name a famous building in each of them."]
EOS_BANNED = {"2": -100}  # every answer runs to its budget: the same token count on both paths
PREFILL_LOG = re.compile(r"((?:chat)?cmpl-\w+): [^;]*; \d+ prompt tokens "
                         r"\((\d+) from the KV cache, (\d+) prefilled in (\d+) ms\)")


class Server:
    """`mnnllm serve` in a subprocess on a free port; its log is read as it comes."""

    def __init__(self, config: str, overrides: dict, options: tuple[str, ...] = ()):
        command = [sys.executable, "-m", "mnnllm_core.cli", "serve", config, "--port", "0", *options]
        for key, value in overrides.items():
            command += ["--set", f"{key}={json.dumps(value)}"]
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.process.stderr), daemon=True).start()
        deadline = time.monotonic() + 600
        while not (found := re.search(r"Uvicorn running on (http://\S+)", "".join(self.lines))):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start:\n" + "".join(self.lines))
            time.sleep(0.1)
        self.client = openai.OpenAI(base_url=found.group(1) + "/v1", api_key="-", max_retries=0, timeout=600)

    def prefill(self, request_id: str) -> tuple[int, int, float]:
        """(cached, prefilled, ms) of a request, from the server's log."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for line in self.lines:
                found = PREFILL_LOG.search(line)
                if found and found.group(1) == request_id:
                    return int(found.group(2)), int(found.group(3)), float(found.group(4))
            time.sleep(0.05)
        raise SystemExit(f"no log line for {request_id}")

    def forget(self) -> None:
        """An unrelated request: the next conversation shares no prefix with the server's history."""
        self.client.completions.create(model="-", prompt="x", max_tokens=1)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def _timed(pieces) -> tuple[float, float, int, str]:
    """(TTFT s, seconds from the first to the last piece, pieces, text) of a stream."""
    start = time.perf_counter()
    first = last = None
    text = []
    for piece in pieces:
        last = time.perf_counter()
        first = first or last
        text.append(piece)
    return first - start, last - first, len(text), "".join(text)


def _server_answer(server: Server, messages: list[dict], n: int, **fields) -> dict:
    usage = {}
    request_id = []

    def pieces():
        for chunk in server.client.chat.completions.create(
                model="-", messages=messages, temperature=0, max_tokens=n, stream=True,
                stream_options={"include_usage": True}, **fields):
            request_id[:] = [chunk.id]
            if chunk.usage:
                usage.update(chunk.usage.model_dump())
            if chunk.choices and chunk.choices[0].delta.content:
                yield chunk.choices[0].delta.content
    ttft, span, _, text = _timed(pieces())
    return {"ttft": ttft, "span": span, "tokens": usage["completion_tokens"], "text": text,
            "prompt": usage["prompt_tokens"], "id": request_id[0]}


def _direct_answer(llm, messages: list[dict], n: int, sampler) -> dict:
    ids = llm.tokenizer_encode(llm.apply_chat_template(messages))
    ttft, span, _, text = _timed(llm.stream_text(ids, n, sampler))
    return {"ttft": ttft, "span": span, "tokens": llm.context.gen_seq_len, "text": text, "prompt": len(ids)}


def _tok_s(run: dict) -> float:
    return (run["tokens"] - 1) / run["span"]


def overhead(server: Server, llm, reps: int, n: int) -> dict:
    sampler = llm.make_sampler({"sampler_type": "greedy", "logit_bias": {int(k): v for k, v in EOS_BANNED.items()}})
    runs = {"server": [], "direct": []}
    for rep in range(reps + 1):  # the first round warms both up (a module clone per prompt length)
        for question in QUESTIONS:
            messages = [{"role": "user", "content": question}]
            via_server = _server_answer(server, messages, n, logit_bias=EOS_BANNED)
            direct = _direct_answer(llm, messages, n, sampler)
            assert via_server["text"] == direct["text"], (via_server["text"], direct["text"])
            if rep:
                runs["server"].append(via_server)
                runs["direct"].append(direct)
    summary = {}
    for path, items in runs.items():
        summary[path] = {"ttft_ms": statistics.median(r["ttft"] for r in items) * 1e3,
                         "decode_tok_s": statistics.median(_tok_s(r) for r in items)}
    summary["ratio"] = {"ttft": summary["server"]["ttft_ms"] / summary["direct"]["ttft_ms"],
                        "decode": summary["server"]["decode_tok_s"] / summary["direct"]["decode_tok_s"]}
    summary["runs"] = len(runs["server"])
    return summary


def prompt_cache(server: Server, reps: int, n: int) -> list[dict]:
    conversation: list[dict] = []
    for question in TURNS:  # the replies, once, so both ways send the same conversations
        conversation.append({"role": "user", "content": question})
        reply = server.client.chat.completions.create(model="-", messages=conversation, temperature=0, max_tokens=n)
        conversation.append({"role": "assistant", "content": reply.choices[0].message.content})
    rows = [{"turn": i + 1, "reuse": [], "cold": []} for i in range(len(TURNS))]
    for _ in range(reps):
        for way in ("reuse", "cold"):
            server.forget()  # turn 1 starts cold either way
            for i, row in enumerate(rows):
                if way == "cold" and i:
                    server.forget()
                answer = _server_answer(server, conversation[:2 * i + 1], n)
                cached, prefilled, prefill_ms = server.prefill(answer["id"])
                row[way].append({"ttft": answer["ttft"], "prompt": answer["prompt"], "cached": cached,
                                 "prefilled": prefilled, "prefill_ms": prefill_ms})
    return [{"turn": row["turn"], "prompt_tokens": row["reuse"][0]["prompt"],
             **{f"{way}_{key}": statistics.median(r[key] for r in row[way])
                for way in ("reuse", "cold") for key in ("cached", "prefilled", "prefill_ms", "ttft")}}
            for row in rows]


def render(result: dict) -> str:
    o = result["overhead"]
    lines = [f"### Server overhead ({o['runs']} greedy answers of {result['n']} tokens per path, medians)", "",
             "| path | TTFT (ms) | decode (tok/s) |", "|---|---:|---:|",
             f"| Python API (`Llm.stream_text`) | {o['direct']['ttft_ms']:.0f} | {o['direct']['decode_tok_s']:.1f} |",
             f"| `mnnllm serve` + openai client (SSE) | {o['server']['ttft_ms']:.0f} | "
             f"{o['server']['decode_tok_s']:.1f} |",
             f"| server / API | {o['ratio']['ttft']:.2f}x | {o['ratio']['decode']:.2f}x |", "",
             f"### Prompt cache on a 4-turn chat (replies of up to {result['chat_n']} tokens, medians of "
             f"{result['reps']})",
             "", "| turn | prompt tokens | from the KV cache | prefilled | prefill (ms) | TTFT (ms) "
                 "| prefilled, no reuse | prefill, no reuse (ms) | TTFT, no reuse (ms) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["prompt_cache"]:
        lines.append(f"| {r['turn']} | {r['prompt_tokens']} | {r['reuse_cached']:.0f} | {r['reuse_prefilled']:.0f} "
                     f"| {r['reuse_prefill_ms']:.0f} | {r['reuse_ttft'] * 1e3:.0f} | {r['cold_prefilled']:.0f} "
                     f"| {r['cold_prefill_ms']:.0f} | {r['cold_ttft'] * 1e3:.0f} |")
    turns = result["prompt_cache"]
    saved = sum(r["cold_prefill_ms"] - r["reuse_prefill_ms"] for r in turns)
    cold = sum(r["cold_prefill_ms"] for r in turns)
    lines += ["", f"prefill over the 4 turns: {cold - saved:.0f} ms with the cache vs {cold:.0f} ms without "
                  f"({saved / cold:.0%} saved); tokens prefilled: {sum(r['reuse_prefilled'] for r in turns):.0f} "
                  f"vs {sum(r['cold_prefilled'] for r in turns):.0f}"]
    return "\n".join(lines)


def main() -> None:
    default = SHARED_MODEL
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default=str(default))
    parser.add_argument("-rep", type=int, default=5, help="repetitions (after one warm-up round)")
    parser.add_argument("-n", type=int, default=64, help="tokens per answer")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("-t", type=int, default=2, help="thread_num")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    overrides = {"backend_type": args.backend, "thread_num": args.t, "memory": "normal"}
    server = Server(args.config, overrides)
    try:
        llm = mnnllm_core.create(args.config)
        llm.set_config(overrides)
        llm.load()
        result = {"n": args.n, "chat_n": args.n // 2, "reps": args.rep, "backend": args.backend, "threads": args.t,
                  "overhead": overhead(server, llm, args.rep, args.n)}
        del llm
        result["prompt_cache"] = prompt_cache(server, args.rep, result["chat_n"])
    finally:
        server.close()
    print(json.dumps(result, indent=2) if args.json else render(result))


if __name__ == "__main__":
    main()
