"""MNN's Executor::RuntimeManager: one Runtime (plus the backup cpu one) shared by modules.

It carries what MNN passes through runtime hints: the KV meta, attention mode, dynamic
quant option, tmp/prefix-cache paths, mmap sizes, and the external weight file override.
"""
from __future__ import annotations

import logging
from typing import Any

from ..core.backend import Backend, Runtime, ScheduleConfig
from ..core.kv_meta import KVMeta
from ..errors import BackendError
from ..plugins.manager import registry

log = logging.getLogger(__name__)


class RuntimeManager:
    def __init__(self, config: ScheduleConfig, runtime: Runtime, backup: Runtime):
        self.config = config
        self.runtime = runtime
        self.backup_runtime = backup
        self.external_file: str | None = None
        self.allow_fallback = True
        self.kv_meta = KVMeta()
        self.set_hint("kv_meta", self.kv_meta)

    @classmethod
    def create(cls, config: ScheduleConfig | None = None, hints: dict[str, Any] | None = None) -> "RuntimeManager":
        """Create the Runtime for `config.backend_type` through the plugin registry."""
        config = config or ScheduleConfig()
        runtime = _create_runtime(config.backend_type, config, hints)
        backup = runtime if config.backup_type == config.backend_type else _create_runtime(
            config.backup_type, config, hints)
        return cls(config, runtime, backup)

    @property
    def static_shapes(self) -> bool:
        return bool(self.runtime.static_shapes)

    def set_hint(self, name: str, value: Any) -> None:
        for runtime in {self.runtime, self.backup_runtime}:
            runtime.hints[name] = value

    def set_external_file(self, path: str) -> None:
        """Read external weights from `path` instead of `<model>.weight`."""
        self.external_file = str(path)

    def create_backends(self) -> tuple[Backend, Backend]:
        backend = self.runtime.create_backend(self.config.backend_config)
        backup = backend if self.backup_runtime is self.runtime else self.backup_runtime.create_backend(
            self.config.backend_config)
        return backend, backup


def _create_runtime(name: str, config: ScheduleConfig, hints: dict[str, Any] | None) -> Runtime:
    creator = registry().get(name)
    available, reason = creator.is_available()
    if not available:
        others = [n for n, c in registry().runtime_creators().items() if n != name]
        raise BackendError(f"backend {name!r} is not available: {reason}; other registered backends: "
                           f"{', '.join(sorted(others)) or 'none'}", field="backend_type")
    runtime = creator.create(config, hints)
    runtime.op_creators.update(registry().op_creators(name))
    log.info("created %s runtime (%s)", name, runtime.device_name())
    return runtime
