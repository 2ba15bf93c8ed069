"""MNN's Executor::RuntimeManager: one Runtime (plus the backup cpu one) shared by modules.

It carries what MNN passes through runtime hints (attention mode, dynamic quant option,
tmp/prefix-cache paths, mmap sizes, the config's `backend_hints`), the KV meta every
Attention of its runtimes reads, whether the backend has static shapes (its RuntimeCreator
says so), and the external weight file override.
"""
from __future__ import annotations

import logging
from typing import Any

from ..core.backend import HINT_SETTINGS, SETTINGS, Backend, Runtime, RuntimeCreator, ScheduleConfig
from ..core.kv_meta import KVMeta
from ..core.runtime_hints import RuntimeHints, check_hints
from ..errors import BackendError, cut_at_clause
from ..plugins.manager import registry

log = logging.getLogger(__name__)

_REPORTED: set[tuple[str, str, str]] = set()  # (backend, setting, value) already logged as ignored


class RuntimeManager:
    def __init__(self, config: ScheduleConfig, runtime: Runtime, backup: Runtime, static_shapes: bool = False,
                 owns_runtimes: bool = True):
        self.config = config
        self.runtime = runtime
        self.backup_runtime = backup
        self.static_shapes = static_shapes
        self.external_file: str | None = None
        self.allow_fallback = True
        self.kv_meta = KVMeta()
        self.owns_runtimes = owns_runtimes
        if owns_runtimes:
            for each in {runtime, backup}:
                each.kv_meta = self.kv_meta

    def derive(self) -> "RuntimeManager":
        """A manager on the same runtimes (device state, packed weights a module over a base
        shares) with a KV meta of its own: a second model, e.g. a LoRA, with its own conversation."""
        twin = RuntimeManager(self.config, self.runtime, self.backup_runtime, self.static_shapes, owns_runtimes=False)
        twin.allow_fallback = self.allow_fallback
        return twin

    @classmethod
    def create(cls, config: ScheduleConfig | None = None,
               hints: RuntimeHints | dict[str, Any] | None = None) -> "RuntimeManager":
        """Create the Runtime for `config.backend_type` through the plugin registry; every key of
        `hints` must be a RuntimeHints field of an installed backend (ConfigError)."""
        config = config or ScheduleConfig()
        creator = registry().get(config.backend_type)
        check_hints(hints or {}, [each.hints_type for each in registry().runtime_creators().values()])
        runtime = _create_runtime(creator, config, hints)
        report_ignored_settings(creator, config, hints)
        backup = runtime if config.backup_type == config.backend_type else _create_runtime(
            registry().get(config.backup_type), config, hints)
        return cls(config, runtime, backup, bool(creator.static_shapes))

    def set_external_file(self, path: str) -> None:
        """Read external weights from `path` instead of `<model>.weight`."""
        self.external_file = str(path)

    def create_backends(self) -> tuple[Backend, Backend]:
        backend = self.runtime.create_backend(self.config.backend_config)
        backup = backend if self.backup_runtime is self.runtime else self.backup_runtime.create_backend(
            self.config.backend_config)
        if not self.owns_runtimes:
            for each in (backend, backup):
                each.own_kv_meta = self.kv_meta
        return backend, backup


def report_ignored_settings(creator: RuntimeCreator, config: ScheduleConfig,
                            hints: RuntimeHints | dict[str, Any] | None = None) -> list[str]:
    """Log, once per process per value, each setting the backend does not honour (and each of
    HINT_SETTINGS set to other than its default); returns them."""
    values = {name: config.setting(name) for name in SETTINGS}
    given = RuntimeHints.of(hints)
    values.update({name: getattr(given, name) for name in HINT_SETTINGS
                   if getattr(given, name) != getattr(RuntimeHints, name)})
    ignored = [name for name in values if name not in creator.settings]
    for name in ignored:
        key = (creator.name, name, str(values[name]))
        if key not in _REPORTED:
            _REPORTED.add(key)
            log.info("backend %s ignores %s=%s (it honours: %s)", creator.name, name, key[2],
                     ", ".join(sorted(creator.settings)) or "none of thread_num, precision, memory, power")
    return ignored


def unavailable_message(name: str, reason: str, after: str = "") -> str:
    """Why backend `name` cannot be used, its probe's reason cut to a readable length (the CLI's
    checks before a run say it as creating the runtime does); `after` ends the message, and its
    length comes off the reason's, so the whole stays under an error line's limit uncut."""
    shown = cut_at_clause(reason, min(160, 180 - len(after)), "`mnnllm backends` shows it whole")
    return f"backend {name!r} is not available: {shown}{after}"


def _create_runtime(creator: RuntimeCreator, config: ScheduleConfig, hints: dict[str, Any] | None) -> Runtime:
    available, reason = creator.is_available()
    if not available:
        others = [n for n in registry().runtime_creators() if n != creator.name]
        after = f"; other registered backends: {', '.join(sorted(others)) or 'none'}"
        raise BackendError(unavailable_message(creator.name, reason, after), field="backend_type")
    runtime = creator.create(config, hints)
    runtime.op_creators.update(registry().op_creators(creator.name))
    log.info("created %s runtime (%s)", creator.name, runtime.device_name())
    return runtime
