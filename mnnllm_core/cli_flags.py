"""The flags people know from llama.cpp and ollama, as aliases of config keys, and the options
every verb accepts after its name (`mnnllm run --debug ...` as well as `mnnllm --debug run ...`).

Each alias sets one config key, exactly as `--set KEY=VALUE` does (same checks, same error
naming the flag); `--set` given too wins, since it is the explicit form.
"""
from __future__ import annotations

import argparse
from typing import Callable

# (option strings, config key, value type, metavar, help)
ALIASES: tuple[tuple[tuple[str, ...], str, Callable, str, str], ...] = (
    (("--temp",), "temperature", float, "T",
     "sampling temperature (--set temperature=T); 0 picks the likeliest token (--set sampler_type=greedy)"),
    (("--top-k",), "top_k", int, "K", "keep the K most likely tokens (--set top_k=K)"),
    (("--top-p",), "top_p", float, "P", "nucleus sampling threshold (--set top_p=P)"),
    (("--min-p",), "min_p", float, "P", "drop tokens below P x the top probability (--set min_p=P)"),
    (("--seed",), "seed", int, "N", "the sampler's random seed (--set seed=N)"),
    (("-c", "--ctx-size"), "max_all_tokens", int, "N", "context size in tokens (--set max_all_tokens=N)"),
    (("-sys", "--system"), "system_prompt", str, "TEXT", "the system prompt (--set system_prompt=TEXT)"),
)


def _typed(kind: Callable) -> Callable[[str], object]:
    def parse(text: str):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
    return parse


def add_config_aliases(parser: argparse.ArgumentParser) -> None:
    """The alias flags of the config keys, each stored under `alias_<key>`."""
    for flags, key, kind, metavar, help_text in ALIASES:
        parser.add_argument(*flags, dest=f"alias_{key}", type=_typed(kind), metavar=metavar,
                            default=None, help=help_text)


def alias_updates(args: argparse.Namespace) -> dict[str, tuple[object, str]]:
    """{config key: (value, the flag that set it)} for the alias flags given."""
    updates = {}
    for flags, key, _kind, _metavar, _help in ALIASES:
        value = getattr(args, f"alias_{key}", None)
        if value is not None:
            updates[key] = (value, flags[-1])
    if updates.get("temperature", (None,))[0] == 0:  # llama.cpp's --temp 0: greedy
        del updates["temperature"]
        updates["sampler_type"] = ("greedy", "--temp")
    return updates


def add_global_options(parser: argparse.ArgumentParser, top_level: bool) -> None:
    """--debug and -v on the top-level parser and on every verb. A verb's copy defaults to
    SUPPRESS, so it sets the value only when given there and never hides the top-level one."""
    verbose = {"default": 0} if top_level else {"default": argparse.SUPPRESS}
    debug = {"default": False} if top_level else {"default": argparse.SUPPRESS}
    parser.add_argument("-v", "--verbose", action="count", help="more logging (-vv for debug)", **verbose)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error", **debug)


def parse_command_line(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """parse_args, with an unknown option blamed on the verb it follows, whose --help lists the right
    options (argparse's own message names the top-level parser)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        verb = verb_parser(parser, getattr(args, "command", None))
        (verb or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def verb_parser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return None
