"""MNN's `Prompt`: turn chat messages into the model's prompt text.

With `jinja.chat_template` in the config (what MNN's exporter writes), the template
is rendered with jinja2's immutable sandbox the way MNN 3.6.1 renders it:

* `trim_blocks` and `lstrip_blocks` on, and a trailing newline kept (MNN keeps it;
  Hugging Face drops it);
* variables `messages`, `add_generation_prompt`, `bos_token` / `eos_token` (from
  `jinja.bos` / `jinja.eos`; the tokenizer's own bos string wins where it names one: MNN's
  `Llm::setChatTemplate` hands the tokenizer the template and eos only, so a `.mtok`'s bos is
  what its template renders), `strftime_now(fmt)`, `raise_exception(msg)`, then
  every key of `jinja.context` (context.json), which may override the others;
* messages go to the template as given: a template that skips system messages
  loses them (MNN 3.6.1 has no system-role polyfill).

Values print as Python's jinja2 prints them, as in Hugging Face: `True`, `None`,
`tojson` keeping key order. MNN's own engine prints `true`, `null` and sorts
`tojson` keys; the exported templates print none of these.

Without a jinja template, MNN's legacy fields are used: a `prompt_template` picks
a known model family's turn templates, otherwise `bos` and the
`system/user/assistant_prompt_template` keys ("%s" marks the content). MNN 3.6.1's
binary ignores these legacy keys (it returns the bare contents); mnnllm keeps the
formatting the MNN source defines for them.

A string prompt becomes [system_prompt (only when non-empty), user], as MNN's
`Llm::apply_chat_template` does. Template errors raise ConfigError naming the
field `jinja.chat_template`; MNN returns an empty string instead.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping, Sequence

import jinja2

from mnnllm_core.errors import ArgumentError, ConfigError, shorten
from mnnllm_core.llm.config import LlmConfig
from mnnllm_core.llm.template_sandbox import MAX_ITEMS, BoundedSandbox, render_bounded

logger = logging.getLogger(__name__)

ChatMessage = Mapping[str, Any] | tuple[str, str]
"""A message: a mapping with "role" and "content" (other keys reach the template), or a pair."""

TEMPLATE_FIELD = "jinja.chat_template"


@dataclass(frozen=True)
class LegacyTemplates:
    """MNN's pre-jinja turn templates; "%s" is replaced by a message's content."""

    bos: str
    system: str
    user: str
    assistant: str

    @property
    def assistant_prefix(self) -> str:
        """What opens an assistant turn (and the generation prompt)."""
        return self.assistant.split("%s", 1)[0]

    @property
    def assistant_suffix(self) -> str:
        """What closes an assistant turn."""
        return self.assistant.split("%s", 1)[1] if "%s" in self.assistant else ""


_CHATML = LegacyTemplates("", "<|im_start|>system\n%s<|im_end|>\n",
                          "<|im_start|>user\n%s<|im_end|>\n",
                          "<|im_start|>assistant\n%s<|im_end|>\n")

_LEGACY_FAMILIES: tuple[tuple[str, bool, LegacyTemplates], ...] = (
    # (marker in prompt_template, marker must equal it, templates); first match wins
    ("<reserved_106>", False, LegacyTemplates("", "", "<reserved_106>%s", "<reserved_107>%s")),
    ("[Round 1]", False, LegacyTemplates("", "", "[Round 1]\n\n问：%s\n\n", "答：%s\n\n")),
    ("<|user|>\n%s\n<|assistant|>\n", False, LegacyTemplates(
        "[gMASK]<sop>", "<|system|>\n%s\n", "<|user|>\n%s\n", "<|assistant|>\n%s\n")),
    ("Assistant:", False, LegacyTemplates(
        "<|begin_of_sentence|>", "%s\n", "\nUser: %s\n",
        "\nAssistant: %s\n<|end_of_sentence|>")),
    ("<|begin_of_sentence|><|User|>", False, LegacyTemplates(
        "<|begin_of_sentence|>", "%s", "<|User|>%s", "<|Assistant|>%s<|end_of_sentence|>")),
    ("[INST]", False, LegacyTemplates(
        "[INST] ", "<<SYS>>\n%s\n<</SYS>>\n\n", "%s [/INST]", "%s</s>")),
    ("<|start_header_id|>", False, LegacyTemplates(
        "", "<|start_header_id|>system<|end_header_id|>\n\n%s<|eot_id|>",
        "<|start_header_id|>user<|end_header_id|>\n\n%s<|eot_id|>",
        "<|start_header_id|>assistant<|end_header_id|>\n\n%s<|eot_id|>")),
    ("<s><|system|>", False, LegacyTemplates(
        "<s>", "<|system|>\n%s</s>\n", "<|user|>\n%s</s>\n", "<|assistant|>\n%s</s>\n")),
    ("<start_of_turn>", False, LegacyTemplates(
        "<bos>", "<start_of_turn>system\n%s<end_of_turn>\n",
        "<start_of_turn>user\n%s<end_of_turn>\n", "<start_of_turn>model\n%s<end_of_turn>\n")),
    ("<bos>%s", True, LegacyTemplates("<bos>", "%s", "%s", "%s")),
    ("<|Bot|>", False, LegacyTemplates("", "", "<|User|>:%s<eoh>", "<|Bot|>%s<eoh>\n")),
    ("Instruct:", False, LegacyTemplates("", "", "Instruct: %s\n", "Output:%s\n")),
)


def legacy_templates(config: LlmConfig) -> LegacyTemplates:
    """MNN's `Prompt::setParams` without jinja: prompt_template's family, else the template keys."""
    if "prompt_template" in config:
        marker_text = config.prompt_template
        for marker, exact, templates in _LEGACY_FAMILIES:
            if (marker_text == marker) if exact else (marker in marker_text):
                return templates
        return _CHATML
    return LegacyTemplates(config.bos, config.system_prompt_template,
                           config.user_prompt_template, config.assistant_prompt_template)


class _TemplateFailure(Exception):
    """Raised by the template's `raise_exception` helper."""


def _raise_exception(message: str) -> None:
    raise _TemplateFailure(message)


def _tojson(value: Any, indent: int | None = None, separators: tuple[str, str] | None = None,
            sort_keys: bool = False) -> str:
    """Hugging Face's `tojson`: plain json.dumps, no HTML escaping, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class JinjaChatTemplate:
    """A compiled chat template with the helpers MNN and Hugging Face give templates."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "",
                 file: str | None = None) -> None:
        env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise_exception
        env.filters["tojson"] = _tojson
        self._file = file
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError(f"chat template syntax error at line {exc.lineno}: {exc.message}",
                              file=file, field=TEMPLATE_FIELD) from exc

    def _variables(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
                   context: Mapping[str, Any]) -> dict[str, Any]:
        now = datetime.now()
        variables: dict[str, Any] = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "strftime_now": now.strftime,
        }
        variables.update(context)
        return variables

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
               context: Mapping[str, Any]) -> str:
        """Render `messages`; any failure inside the template (its bounds included: the text it
        builds, what it renders, its time) is a ConfigError on its field."""
        given = sum(len(str(m.get("content", ""))) + len(str(m.get("tool_calls") or "")) for m in messages) \
            + len(str(context.get("tools") or ""))
        try:
            chunks = self._template.generate(self._variables(messages, add_generation_prompt, context))
            return render_bounded(chunks, 4 * given + MAX_ITEMS)
        except Exception as exc:  # raise_exception, sandbox refusals and bounds, type errors in the template
            raise ConfigError(f"chat template failed: {type(exc).__name__}: {shorten(str(exc), 160)}",
                              file=self._file, field=TEMPLATE_FIELD) from exc


def _as_message(message: ChatMessage) -> dict[str, Any]:
    if isinstance(message, tuple):
        role, content = message
        return {"role": role, "content": content}
    if isinstance(message, Mapping) and isinstance(message.get("role"), str) \
            and "content" in message:
        return dict(message)
    raise ArgumentError(f"a chat message needs a string 'role' and a 'content', got {shorten(repr(message), 80)}",
                        field="messages")


class Prompt:
    """Renders chat messages for one model, as MNN's `Prompt` does."""

    def __init__(self, config: LlmConfig, bos_token: str = "") -> None:
        """`bos_token`: the tokenizer's bos string; when non-empty it replaces `jinja.bos`."""
        self.tokenizer_bos = bos_token
        self.set_params(config)

    def set_params(self, config: LlmConfig) -> None:
        """(Re)read the template keys, e.g. after `LlmConfig.set_config`."""
        self.system_prompt = config.system_prompt
        jinja = config.jinja
        source = jinja.get("chat_template")
        self._jinja: JinjaChatTemplate | None = None
        self._context: dict[str, Any] = {}
        self._legacy: LegacyTemplates | None = None
        if source is None:
            self._legacy = legacy_templates(config)
            return
        if not isinstance(source, str):
            raise ConfigError("the chat template must be a string", file=config.origin("jinja"),
                              field=TEMPLATE_FIELD)
        bos, eos = self.tokenizer_bos or jinja.get("bos"), jinja.get("eos")
        self._jinja = JinjaChatTemplate(source, bos if isinstance(bos, str) else "",
                                        eos if isinstance(eos, str) else "",
                                        file=config.origin("jinja"))
        context = jinja.get("context")
        if isinstance(context, dict):
            self._context = context

    @property
    def uses_jinja(self) -> bool:
        """Whether a jinja chat template (not MNN's legacy fields) renders the prompt."""
        return self._jinja is not None

    def apply_chat_template(self, messages: str | Sequence[ChatMessage],
                            add_generation_prompt: bool = True, tools: Sequence[dict] | None = None) -> str:
        """The prompt text for a user string (system prompt added) or a list of messages; `tools`
        (OpenAI's tool objects) reach a jinja template as its `tools` variable."""
        if isinstance(messages, str):
            chat = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            chat.append({"role": "user", "content": messages})
        else:
            chat = [_as_message(m) for m in messages]
        if self._jinja is not None:
            context = {**self._context, "tools": list(tools)} if tools else self._context
            return self._jinja.render(chat, add_generation_prompt, context)
        if tools:
            raise ConfigError("this model has no jinja chat template to render tools with", field=TEMPLATE_FIELD)
        assert self._legacy is not None
        return _render_legacy(self._legacy, chat, add_generation_prompt)


def _fill(template: str, role: str, content: str) -> str:
    """MNN's `buildPrompt`: replace the first "%s", or fall back to "role\\ncontent\\n"."""
    if "%s" not in template:
        return f"{role}\n{content}\n"
    return template.replace("%s", content, 1)


def _render_legacy(templates: LegacyTemplates, chat: list[dict[str, Any]],
                   add_generation_prompt: bool) -> str:
    parts = [templates.bos]
    for message in chat:
        role, content = message["role"], message["content"]
        if not isinstance(content, str):
            raise ArgumentError(f"this model's prompt templates (no jinja) need str content, got "
                                f"{type(content).__name__}", field="content")
        if role == "system" and content:
            parts.append(_fill(templates.system, role, content))
        elif role == "user":
            parts.append(_fill(templates.user, role, content))
        elif role == "assistant":
            parts.append(templates.assistant_prefix + content + templates.assistant_suffix)
        elif role not in ("system", ""):
            logger.debug("legacy templates skip a message with role %r (as MNN does)", role)
    if add_generation_prompt:
        parts.append(templates.assistant_prefix)
    return "".join(parts)
