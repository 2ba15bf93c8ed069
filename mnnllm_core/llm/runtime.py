"""MNN's Llm::initRuntime: config -> ScheduleConfig/BackendConfig -> RuntimeManager, plus hints.

`backend_type` may list alternatives, tried in order: "opencl,cpu" means opencl when it
is available, else cpu (logged). A single name never falls back silently.
`allow_fallback: false` makes an op the chosen backend cannot run an error instead of a
fallback to cpu; `backend_hints` passes backend-specific options to the Runtime.
"""
from __future__ import annotations

import logging

from ..core.backend import BackendConfig, ScheduleConfig
from ..errors import BackendError, ConfigError
from ..express.runtime_manager import RuntimeManager
from ..plugins.manager import registry
from .config import LlmConfig

log = logging.getLogger(__name__)

STATIC_SHAPE_BACKENDS = {"opencl", "vulkan", "npu"}


def backend_choices(config: LlmConfig) -> list[str]:
    names = [n.strip() for n in str(config.backend_type).split(",") if n.strip()]
    if not names:
        raise ConfigError("backend_type is empty", file=config.origin("backend_type"), field="backend_type")
    return names


def schedule_config(config: LlmConfig, backend_type: str) -> ScheduleConfig:
    for key, allowed in (("precision", {"low", "normal", "high"}), ("memory", {"low", "normal", "high"}),
                         ("power", {"low", "normal", "high"})):
        if str(getattr(config, key)) not in allowed:
            raise ConfigError(f"{key} must be one of {sorted(allowed)}, got {getattr(config, key)!r}",
                              file=config.origin(key), field=key)
    if config.thread_num < 1:
        raise ConfigError(f"thread_num must be >= 1, got {config.thread_num}", file=config.origin("thread_num"),
                          field="thread_num")
    return ScheduleConfig(backend_type=backend_type, thread_num=config.thread_num,
                          backend_config=BackendConfig(config.precision, config.memory, config.power))


def runtime_hints(config: LlmConfig) -> dict:
    """What MNN's setRuntimeHint passes to the backends, over the config's `backend_hints`
    (options for a plugin backend, e.g. {"torch_device": "cuda:1"}; the core's keys win)."""
    hints = config.get("backend_hints")
    if hints is not None and not isinstance(hints, dict):
        raise ConfigError(f"backend_hints must be a JSON object, got {hints!r}", file=config.origin("backend_hints"),
                          field="backend_hints")
    return {
        **(hints or {}),
        "attention_mode": config.attention_mode, "dynamic_option": config.dynamic_option,
        "kvcache_mmap": config.kvcache_mmap, "use_mmap": config.use_mmap, "mmap_size": config.mmap_size,
        "tmp_path": config.tmp_path, "prefix_cache_path": config.prefix_cache_path,
        "attention_type": config.attention_type, "sliding_window": config.sliding_window,
        "attn_scale": config.attn_scale,
    }


def init_runtime(config: LlmConfig) -> RuntimeManager:
    choices = backend_choices(config)
    allow_fallback = config.get("allow_fallback")
    allow_fallback = True if allow_fallback is None else allow_fallback  # null means unset, as for every key
    if not isinstance(allow_fallback, bool):
        raise ConfigError(f"allow_fallback must be true or false, got {allow_fallback!r}",
                          file=config.origin("allow_fallback"), field="allow_fallback")
    errors = []
    for name in choices:
        try:
            manager = RuntimeManager.create(schedule_config(config, name), runtime_hints(config))
        except BackendError as err:
            if len(choices) == 1:
                raise BackendError(err.reason, file=config.origin("backend_type"),
                                   field="backend_type") from err
            errors.append(str(err))
            log.warning("backend %s unavailable, trying the next one in backend_type: %s", name, err)
            continue
        manager.allow_fallback = allow_fallback
        return manager
    raise BackendError("no backend of backend_type is available: " + "; ".join(errors),
                       file=config.origin("backend_type"), field="backend_type")


def is_static_shape(manager: RuntimeManager) -> bool:
    """opencl, vulkan and npu, and any plugin backend that declares static_shapes."""
    name = manager.config.backend_type
    creator = registry().runtime_creators().get(name)
    return name in STATIC_SHAPE_BACKENDS or manager.static_shapes or bool(getattr(creator, "static_shapes", False))
