"""The slash commands of `mnnllm chat`. A line starting with "/" is a command, handled here and never
sent to the model (an unknown one is refused with a pointer to /help); "//" sends a line that
starts with "/". What a command says goes to stderr, so stdout holds only the replies."""
from __future__ import annotations

import json
import os
import sys
from typing import Callable

from .errors import ArgumentError, ConfigError, MnnllmError

HELP = """commands:
  /help              this list
  /set KEY VALUE     change a config key (VALUE as JSON when it parses), e.g. /set temperature 0.7
  /show              model, backend, settings and how much of the context is used
  /save FILE         write the conversation as JSON (messages with role and content)
  /load FILE         replace the conversation with one /save wrote
  /reset             start over
  /image PATH        add an image to the next message (vision-language models)
  /exit, /quit       leave (also Ctrl-D, or Ctrl-C at the prompt)
  //text             send "/text" as a message"""

SHOWN_KEYS = ("sampler_type", "temperature", "top_k", "top_p", "min_p", "seed", "max_new_tokens", "max_all_tokens",
              "system_prompt")
SAVE_LIMIT = 64 << 20  # a saved conversation is text: 64 MiB is far beyond any context


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class ChatSession:
    """A chat's state: the conversation (messages), images for the next message, and the reply budget."""

    def __init__(self, llm, max_new_tokens: int | None, image_tags: Callable[[str], str]):
        self.llm = llm
        self.messages: list[dict] = []
        self.images = ""
        self.max_new_tokens = max_new_tokens
        self._image_tags = image_tags
        self._commands: dict[str, Callable[[str], bool]] = {
            "/help": self._help, "/?": self._help, "/exit": self._quit, "/quit": self._quit, "/bye": self._quit,
            "/reset": self._reset, "/clear": self._reset, "/set": self._set, "/show": self._show,
            "/save": self._save, "/load": self._load, "/image": self._image,
        }

    def command(self, line: str) -> bool | None:
        """Run `line` if it is a command: False to quit, True to read the next line; None when it is
        a message (a "//" line comes back as a message without its first "/", see `message`)."""
        stripped = line.strip()
        if not stripped.startswith("/") or stripped.startswith("//"):
            return None
        name, _, rest = stripped.partition(" ")
        handler = self._commands.get(name.lower())
        if handler is None:
            say(f"mnnllm: unknown command {name[:40]}; /help lists the commands (start a message with // to "
                f"send a line beginning with /)")
            return True
        try:
            return handler(rest.strip())
        except MnnllmError as err:
            say(f"mnnllm: {err}")
            return True

    @staticmethod
    def message(line: str) -> str:
        """The text a message line sends: "//x" sends "/x"."""
        return line.strip()[1:] if line.strip().startswith("//") else line

    def _help(self, _rest: str) -> bool:
        say(HELP)
        return True

    def _quit(self, _rest: str) -> bool:
        return False

    def _reset(self, _rest: str) -> bool:
        count = len(self.messages)
        self.messages.clear()
        self.images = ""
        self.llm.reset()
        say(f"[conversation reset: {count} messages forgotten]")
        return True

    def _set(self, rest: str) -> bool:
        from .llm.config_keys import check_keys
        key, _, raw = rest.partition(" ")
        if not key or not raw.strip():
            raise ArgumentError("usage: /set KEY VALUE, e.g. /set temperature 0.7", field="/set")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw.strip()
        check_keys({key: value}, self.llm.config.to_dict(), "/set")
        self.llm.set_config({key: value}, source="/set")
        if key == "max_new_tokens":
            self.max_new_tokens = None  # the config's value now; it overrides a -n given at start
        say(f"[{key} = {json.dumps(value, ensure_ascii=False)}]")
        return True

    def _show(self, _rest: str) -> bool:
        llm, cfg = self.llm, self.llm.config.to_dict()
        settings = ", ".join(f"{k} {json.dumps(cfg.get(k), ensure_ascii=False)}" for k in SHOWN_KEYS if k in cfg)
        if self.max_new_tokens is not None:
            settings += f" (this chat: max_new_tokens {self.max_new_tokens})"
        used, limit = len(llm.conversation), llm.config.max_all_tokens
        say(f"model: {llm.config.source}\nbackend: {llm.runtime_manager.config.backend_type}\nsettings: {settings}\n"
            f"context: {used} of {limit} tokens used ({100 * used / limit:.0f}%), {len(self.messages)} messages")
        return True

    def _save(self, path: str) -> bool:
        from .files import written_beside
        if not path:
            raise ArgumentError("usage: /save FILE", field="/save")
        data = json.dumps({"messages": self.messages}, ensure_ascii=False, indent=1).encode()
        try:
            with written_beside(os.path.expanduser(path)) as f:
                f.write(data)
        except OSError as err:
            raise ConfigError(f"cannot write the conversation: {err.strerror or err}", file=path,
                              field="/save") from None
        say(f"[saved {len(self.messages)} messages to {path}]")
        return True

    def _load(self, path: str) -> bool:
        from .files import read_bounded
        from .llm import arguments
        if not path:
            raise ArgumentError("usage: /load FILE", field="/load")
        data = read_bounded(os.path.expanduser(path), SAVE_LIMIT, ConfigError, "saved conversation", field="/load")
        try:
            document = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ConfigError(f"not a saved conversation: not JSON ({err})", file=path, field="/load") from None
        messages = document.get("messages") if isinstance(document, dict) else document
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ConfigError("not a saved conversation: expected {\"messages\": [{\"role\", \"content\"}, ...]}",
                              file=path, field="/load")
        arguments.messages(messages, "messages")
        self.messages = [dict(m) for m in messages]
        say(f"[loaded {len(self.messages)} messages from {path}]")
        return True

    def _image(self, path: str) -> bool:
        self.images += self._image_tags(path)
        return True
