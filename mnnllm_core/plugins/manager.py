"""Finding backends: the pluggy manager, entry-point discovery, and the runtime registry.

Loading is lazy: nothing is imported or probed until a backend is asked for (creating a
runtime, `mnnllm backends`). A plugin that fails to import, or whose hook raises, is recorded
with its error and the last frames of its traceback (see `load_errors()`) and skipped; the
other plugins and `import mnnllm_core` are never affected.

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
    """A plugin that could not be used: `error` is "ExceptionType: message", `traceback`
    the plugin's own last frames (importlib's are left out)."""

    name: str
    error: str
    traceback: str


def _error_of(name: str, err: BaseException) -> PluginLoadError:
    summary = "".join(traceback.format_exception_only(type(err), err)).strip()
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith("<frozen")]
    return PluginLoadError(name, summary, "".join(traceback.format_list(frames[-3:])).rstrip())


class Registry:
    def __init__(self) -> None:
        self.manager = pluggy.PluginManager(GROUP)
        self.manager.add_hookspecs(hookspecs)
        self._creators: dict | None = None
        self._plugin_of: dict[str, str] = {}  # backend name -> plugin name
        self._origins: dict[str, str] = {}  # plugin name -> distribution (or module) name
        self.errors: list[PluginLoadError] = []

    def _load(self) -> None:
        if self._creators is not None:
            return
        if not os.environ.get("MNNLLM_DISABLE_PLUGIN_AUTOLOAD"):
            for entry in metadata.entry_points(group=GROUP):
                self._register(entry.name, entry.load, entry.dist.name if entry.dist else entry.value)
        for name in filter(None, (n.strip() for n in os.environ.get("MNNLLM_PLUGINS", "").split(","))):
            self._register(name, lambda n=name: importlib.import_module(n), name)
        creators: dict = {}
        for plugin_name, plugin_creators in self._call_each("mnnllm_register_runtime_creators"):
            for creator in plugin_creators or []:
                if creator.name in creators:
                    self._fail(plugin_name, BackendError(
                        f"backend {creator.name!r} is already registered by plugin "
                        f"{self._plugin_of[creator.name]!r}; this one is ignored", field="backend_type"))
                    continue
                creators[creator.name] = creator
                self._plugin_of[creator.name] = plugin_name
        self._creators = creators

    def _register(self, name: str, loader, dist: str) -> None:
        if self.manager.has_plugin(name):
            return
        try:
            plugin = loader()
            if not self.manager.is_registered(plugin):  # named both by an entry point and MNNLLM_PLUGINS
                self.manager.register(plugin, name=name)
                self._origins[name] = dist
        except Exception as err:  # a broken plugin must not break the others
            self._fail(name, err)

    def _fail(self, name: str, err: BaseException) -> None:
        error = _error_of(name, err)
        self.errors.append(error)
        log.warning("mnnllm plugin %r failed: %s", name, error.error)

    def _call_each(self, hook_name: str, **kwargs) -> list[tuple[str, object]]:
        """Call a hook plugin by plugin, in registration order, so one that raises is
        recorded and skipped instead of failing the call for every plugin."""
        results = []
        for impl in getattr(self.manager.hook, hook_name).get_hookimpls():
            try:
                results.append((impl.plugin_name, impl.function(**{a: kwargs[a] for a in impl.argnames})))
            except Exception as err:
                self._fail(impl.plugin_name, err)
        return results

    def runtime_creators(self) -> dict:
        self._load()
        return dict(self._creators)

    def op_creators(self, backend_name: str) -> dict:
        """Extra op creators plugins add to `backend_name`; later-registered plugins win."""
        self._load()
        merged: dict = {}
        for _, extra in self._call_each("mnnllm_register_op_creators", backend_name=backend_name):
            merged.update(extra or {})
        return merged

    def plugin_of(self, backend_name: str) -> str:
        """The plugin (entry point or module) that registered `backend_name`."""
        self._load()
        return self._plugin_of.get(backend_name, "?")

    def version_of(self, backend_name: str) -> str:
        dist = self._origins.get(self.plugin_of(backend_name))
        try:
            return metadata.version(dist) if dist else "?"
        except metadata.PackageNotFoundError:
            return "?"

    def describe_others(self, name: str) -> str:
        """The registered backends other than `name`, available ones first (this probes them)."""
        available, unavailable = [], []
        for other, creator in sorted(self.runtime_creators().items()):
            if other == name:
                continue
            ok, reason = creator.is_available()
            (available if ok else unavailable).append(other if ok else f"{other} ({reason})")
        text = f"available backends: {', '.join(available) or 'none'}"
        return text + (f"; registered but unavailable: {'; '.join(unavailable)}" if unavailable else "")

    def get(self, name: str):
        creators = self.runtime_creators()
        if name not in creators:
            raise BackendError(f"unknown backend {name!r}; {self.describe_others(name)}", field="backend_type")
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
