"""Runtime hints as one typed, frozen value: MNN's setRuntimeHint options (set by the core from
the config) and the config's `backend_hints` (options of one backend, e.g. "opencl_device").

A backend with hints of its own subclasses RuntimeHints with typed, defaulted fields named
after it and names the subclass as `hints_type` on its RuntimeCreator (so the config is checked
against every installed backend's fields) and on its Runtime (which reads them as attributes).
A value of the wrong type, or a key no installed backend declares, is a ConfigError naming
`backend_hints.<key>` (and the config file where the key came from a config).
"""
from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

from ..errors import ConfigError

HINTS_FIELD = "backend_hints"
Hints = TypeVar("Hints", bound="RuntimeHints")


@dataclass(frozen=True)
class RuntimeHints:
    """The hints every backend may read. `replay`: record a pipeline wholly on one backend
    as one step (pipeline.py); `gpu_tuning`: MNN's tuning levels (TuningCache); the rest are
    the config's options of the same name (`model_identity`: the model files' identity, set
    with use_mmap so packed weights can be cached on disk). `kv_fp16`: keep a float KV cache as
    fp16 (MNN has no attention_mode for it: its float KV follows the backend's precision)."""

    replay: bool = True
    gpu_tuning: str = "none"
    attention_mode: int = 8
    kv_fp16: bool = False
    dynamic_option: int = 0
    kvcache_mmap: bool = False
    kvcache_limit: int = -1
    use_mmap: bool = False
    mmap_size: int = 1024
    tmp_path: str = ""
    prefix_cache_path: str = "prefixcache"
    attention_type: str = "full"
    sliding_window: int = 0
    attn_scale: float = 0.0
    model_identity: str | None = None

    @classmethod
    def of(cls: type[Hints], hints: "RuntimeHints | Mapping[str, Any] | None", file: str | None = None) -> Hints:
        """`hints` as this class: the fields it declares taken from a mapping (type-checked)
        or from hints of another class; keys it does not declare are left to other backends
        (`check_hints` rejects those no backend declares)."""
        if hints is None:
            return cls()
        if isinstance(hints, cls):
            return hints
        values = dataclasses.asdict(hints) if isinstance(hints, RuntimeHints) else dict(hints)
        kinds = field_types(cls)
        known = {}
        for key, value in values.items():
            if key in kinds and value is not None:  # null means unset, as for every config key
                known[key] = checked(key, value, kinds[key], file)
        return cls(**known)


def check_hints(values: "RuntimeHints | Mapping[str, Any]", hint_types: Iterable[type[RuntimeHints]],
                file: str | None = None) -> None:
    """Every key is a field of one of `hint_types` (those of the installed backends) and its
    value is of that field's type (hints already typed pass as they are)."""
    if isinstance(values, RuntimeHints):
        return
    declared: dict[str, Any] = dict(field_types(RuntimeHints))
    for each in hint_types:
        declared.update(field_types(each))
    for key, value in values.items():
        if key not in declared:
            raise ConfigError(f"{HINTS_FIELD} has no key {key!r}: no installed backend reads it (known: "
                              f"{', '.join(sorted(declared))})", file=file, field=f"{HINTS_FIELD}.{key}")
        if value is not None:
            checked(key, value, declared[key], file)


@cache
def field_types(cls: type[RuntimeHints]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def checked(key: str, value: Any, kind: Any, file: str | None) -> Any:
    """`value` when it is of type `kind` (an int is a float too; a bool is not an int)."""
    allowed = typing.get_args(kind) if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union \
        else (kind,)
    for each in allowed:
        if each is type(None) and value is None:
            return value
        if each is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if each is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if each in (bool, str) and isinstance(value, each):
            return value
    names = " or ".join("null" if each is type(None) else {bool: "true or false"}.get(each, each.__name__)
                        for each in allowed)
    raise ConfigError(f"the backend hint {key} must be {names}, got {value!r}", file=file,
                      field=f"{HINTS_FIELD}.{key}")
