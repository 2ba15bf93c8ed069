"""The `list` and `rm` verbs of the `mnnllm` command (model_list.py does the work)."""
from __future__ import annotations

import argparse
import json

from .model_list import cached_models, remove_model

MODEL_HELP = ("the model: an MNN model folder or its config.json, a .gguf file, a HuggingFace folder, or a hub id "
              "org/name (GGUF and HuggingFace models are exported once into the cache), or a NAME `mnnllm list` shows")


def add_model_commands(sub: argparse._SubParsersAction) -> None:
    """Register `list` and `rm` on the command's subparsers."""
    listing = sub.add_parser("list", help="the cached models (exported on first use, or fetched by hub id)")
    listing.add_argument("--json", action="store_true", help="the list as JSON")
    listing.set_defaults(func=cmd_list)
    rm = sub.add_parser("rm", help="remove a cached model (a NAME `mnnllm list` shows)")
    rm.add_argument("name", metavar="NAME", help="the model's name as `mnnllm list` shows it")
    rm.set_defaults(func=cmd_rm)


def cmd_list(args) -> int:
    models = cached_models()
    if args.json:
        print(json.dumps([vars(m) for m in models], indent=2))
        return 0
    if not models:
        print("no cached models (a .gguf file, a HuggingFace folder or a hub id given to run/chat/serve is "
              "cached on first use)")
        return 0
    width = max(len(m.name) for m in models)
    print(f"{'NAME':<{width}}  {'SIZE':>9}  SOURCE")
    for m in models:
        state = "" if m.state == "ready" else f"  [{m.state}]"
        print(f"{m.name:<{width}}  {_size(m.size):>9}  {m.source}{state}")
    return 0


def cmd_rm(args) -> int:
    removed = remove_model(args.name)
    print(f"removed {removed.name} ({_size(removed.size)}, from {removed.source})")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
