"""Finding backends: the pluggy manager, entry-point discovery, and the runtime registry.

Loading is lazy: nothing is imported or probed until a backend is asked for. A plugin that
fails to load is recorded with its error (see `load_errors()`), never fatal to the others.

Environment:
  MNNLLM_DISABLE_PLUGIN_AUTOLOAD=1  do not load entry points (only plugins named below)
  MNNLLM_PLUGINS=mod.a,mod.b        import and register these modules as plugins too
"""
from __future__ import annotations

import importlib
import logging
import os
import traceback
from dataclasses import dataclass
from importlib import metadata

import pluggy

from ..errors import BackendError
from . import hookspecs

log = logging.getLogger(__name__)
GROUP = "mnnllm"


@dataclass
class PluginLoadError:
    name: str
    error: str
    traceback: str


class Registry:
    def __init__(self) -> None:
        self.manager = pluggy.PluginManager(GROUP)
        self.manager.add_hookspecs(hookspecs)
        self._creators: dict | None = None
        self._origins: dict[str, str] = {}
        self.errors: list[PluginLoadError] = []

    def _load(self) -> None:
        if self._creators is not None:
            return
        if not os.environ.get("MNNLLM_DISABLE_PLUGIN_AUTOLOAD"):
            for entry in metadata.entry_points(group=GROUP):
                self._register(entry.name, entry.load, entry.dist.name if entry.dist else entry.value)
        for name in filter(None, os.environ.get("MNNLLM_PLUGINS", "").split(",")):
            self._register(name.strip(), lambda n=name.strip(): importlib.import_module(n), name.strip())
        creators: dict = {}
        for plugin_creators in self.manager.hook.mnnllm_register_runtime_creators():
            for creator in plugin_creators or []:
                if creator.name in creators:
                    raise BackendError(f"two plugins register a backend named {creator.name!r}",
                                       field="backend_type")
                creators[creator.name] = creator
        self._creators = creators

    def _register(self, name: str, loader, dist: str) -> None:
        if self.manager.has_plugin(name):
            return
        try:
            self.manager.register(loader(), name=name)
            self._origins[name] = dist
        except Exception as err:  # a broken plugin must not break the others
            summary = "".join(traceback.format_exception_only(type(err), err)).strip()
            self.errors.append(PluginLoadError(name, summary, traceback.format_exc(limit=3)))
            log.warning("mnnllm plugin %r failed to load: %s", name, summary)

    def runtime_creators(self) -> dict:
        self._load()
        return dict(self._creators)

    def op_creators(self, backend_name: str) -> dict:
        self._load()
        merged: dict = {}
        for extra in reversed(self.manager.hook.mnnllm_register_op_creators(backend_name=backend_name)):
            merged.update(extra or {})
        return merged

    def plugin_of(self, backend_name: str) -> str:
        """The plugin (entry point or module) that registered `backend_name`."""
        self._load()
        for plugin_name, plugin in self.manager.list_name_plugin():
            impl = getattr(plugin, "mnnllm_register_runtime_creators", None)
            if impl is not None and any(c.name == backend_name for c in impl() or []):
                return plugin_name
        return "?"

    def version_of(self, backend_name: str) -> str:
        dist = self._origins.get(self.plugin_of(backend_name))
        try:
            return metadata.version(dist) if dist else "?"
        except metadata.PackageNotFoundError:
            return "?"

    def get(self, name: str):
        creators = self.runtime_creators()
        if name not in creators:
            known = ", ".join(sorted(creators)) or "none"
            raise BackendError(f"unknown backend {name!r}; registered backends: {known}", field="backend_type")
        return creators[name]

    def load_errors(self) -> list[PluginLoadError]:
        self._load()
        return list(self.errors)


_REGISTRY: Registry | None = None


def registry() -> Registry:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = Registry()
    return _REGISTRY


def reset_registry() -> None:
    """Forget loaded plugins (tests, or after installing a plugin at run time)."""
    global _REGISTRY
    _REGISTRY = None
