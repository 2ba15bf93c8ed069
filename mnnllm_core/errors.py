"""One small hierarchy of errors; each carries the file and the field it is about."""
from __future__ import annotations


class Origin(str):
    """Where a value came from when that is not a file: a call (`set_config`) or a CLI option (`--set`)."""


NOT_ERRORS = (KeyboardInterrupt, SystemExit, GeneratorExit)  # BaseExceptions that are not faults

MAX_MESSAGE = 300  # characters of an error's message: a bad value is quoted, never echoed whole


def shorten(text: str, limit: int = 80) -> str:
    """`text` cut to `limit` characters with the count of what was left out."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def cut_at_clause(text: str, limit: int, whole: str = "") -> str:
    """`text` of at most about `limit` characters, cut after its last whole clause (". ", "; ", ": ",
    ", ") that fits, never inside a word; `whole` says where the uncut text is."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    head = text[:limit]
    ends = [head.rfind(mark) for mark in (". ", "; ", ": ", ", ")]
    end = max(ends)
    if end < limit // 3:
        end = head.rfind(" ")
    end = end if end > 0 else limit
    return f"{text[:end].rstrip(' .;:,')} (cut{'; ' + whole if whole else ''})"


class MnnllmError(Exception):
    """Base of every error mnnllm raises on purpose.

    `reason` is the message alone; str() adds where: "(file F, field K)", or "(from --set, field K)"
    when the value came from an `Origin` rather than a file.
    """

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        self.reason = message
        self.file = str(file) if file is not None else None
        self.field = field
        source = (f"from {file}" if isinstance(file, Origin) else f"file {file}") if self.file else ""
        where = ", ".join(p for p in (source, f"field {field}" if field else "") if p)
        super().__init__(f"{message} ({where})" if where else message)

    def at(self, *, file: str | None = None, field: str | None = None) -> "MnnllmError":
        """The same error, placed at another file and field (e.g. the config key that chose it)."""
        return type(self)(self.reason, file=file, field=field)


class FormatError(MnnllmError):
    """A model file (llm.mnn, weights, tokenizer, embeddings) is corrupt or truncated."""


class WeightFileError(FormatError):
    """An external weight read falls outside the weight file, or the file is short."""


class ConfigError(MnnllmError):
    """config.json / llm_config.json is malformed or names something that does not exist."""


class TokenizerError(MnnllmError):
    """The tokenizer file cannot be parsed."""


class BackendError(MnnllmError):
    """A backend is unknown, unavailable, or refused an op where no fallback is allowed."""


class ExecutionError(MnnllmError):
    """An op failed while its shapes were computed or it ran (a corrupt graph or a backend
    fault); the field is the op, the message names its type and the original error."""


class UnsupportedError(MnnllmError):
    """The model uses something mnnllm does not implement (op, architecture, modality)."""


class ContextLengthError(MnnllmError):
    """A prompt (plus generation) does not fit in the model's context."""


class ArgumentError(MnnllmError):
    """A public call got an argument of the wrong type or shape; the field names the argument
    (e.g. `prompt[1].role`). Raised before anything changes, so the Llm stays as it was."""


class NotLoadedError(MnnllmError):
    """A call that needs the model (generation, the tokenizer, the graph) made before `load()`."""


class ConcurrentUseError(MnnllmError):
    """One `Llm` used by two callers at once (two threads, or a second stream started while
    one is live): refused, so the conversation and the KV cache stay in agreement."""


class KVStateError(MnnllmError):
    """The KV cache's length disagrees with the history after a step (an internal fault):
    the conversation is forgotten rather than answered from a stale cache."""
