"""MNN's Llm::initRuntime: config -> ScheduleConfig/BackendConfig -> RuntimeManager, plus hints.

`backend_type` may list alternatives, tried in order: "opencl,cpu" means opencl when it
is available, else cpu (logged). A single name never falls back silently.
`allow_fallback: false` makes an op the chosen backend cannot run an error instead of a
fallback to cpu; `backend_hints` passes backend-specific options to the Runtime.
"""
from __future__ import annotations

import logging

from ..core.backend import BackendConfig, ScheduleConfig
from ..core.file_identity import file_identity
from ..core.runtime_hints import check_hints
from ..errors import BackendError, ConfigError
from ..express.runtime_manager import RuntimeManager
from ..plugins.manager import registry
from .config import LlmConfig

log = logging.getLogger(__name__)


def backend_choices(config: LlmConfig, mllm: bool = False) -> list[str]:
    names = [n.strip() for n in str(config.runtime_options(mllm).backend_type).split(",") if n.strip()]
    if not names:
        raise ConfigError("backend_type is empty", file=config.origin("backend_type"), field="backend_type")
    return names


def schedule_config(config: LlmConfig, backend_type: str, mllm: bool = False) -> ScheduleConfig:
    """The config's runtime options (the one route for thread_num, precision, memory, power);
    mllm=True: those of the `mllm` object (MNN's processor runtime for the vision/audio encoders)."""
    options = config.runtime_options(mllm)
    for key in ("precision", "memory", "power"):
        allowed = {"low", "normal", "high"}
        if str(getattr(options, key)) not in allowed:
            raise ConfigError(f"{key} must be one of {sorted(allowed)}, got {getattr(options, key)!r}",
                              file=config.origin(key), field=key)
    if options.thread_num < 1:
        raise ConfigError(f"thread_num must be >= 1, got {options.thread_num}", file=config.origin("thread_num"),
                          field="thread_num")
    return ScheduleConfig(backend_type=backend_type, thread_num=options.thread_num,
                          backend_config=BackendConfig(options.precision, options.memory, options.power))


def runtime_hints(config: LlmConfig) -> dict:
    """What MNN's setRuntimeHint passes to the backends, over the config's `backend_hints`
    (options for a plugin backend, e.g. {"torch_device": "cuda:1"}; the core's keys win), each
    key checked against the RuntimeHints fields of the installed backends; every Runtime reads
    its own typed RuntimeHints from this."""
    hints = config.get("backend_hints")
    if hints is not None and not isinstance(hints, dict):
        raise ConfigError(f"backend_hints must be a JSON object, got {hints!r}", file=config.origin("backend_hints"),
                          field="backend_hints")
    creators = registry().runtime_creators().values()
    check_hints(hints or {}, [creator.hints_type for creator in creators], file=config.origin("backend_hints"))
    return {
        **(hints or {}),
        "attention_mode": config.attention_mode, "dynamic_option": config.dynamic_option,
        "kvcache_mmap": config.kvcache_mmap, "kvcache_limit": config.kvcache_limit, "use_mmap": config.use_mmap, "mmap_size": config.mmap_size,
        "tmp_path": config.tmp_path, "prefix_cache_path": config.prefix_cache_path,
        "attention_type": config.attention_type, "sliding_window": config.sliding_window,
        "attn_scale": config.attn_scale,
        "model_identity": file_identity([config.llm_model, config.llm_weight]) if config.use_mmap else None,
    }


def init_runtime(config: LlmConfig, mllm: bool = False) -> RuntimeManager:
    choices = backend_choices(config, mllm)
    allow_fallback = config.get("allow_fallback")
    allow_fallback = True if allow_fallback is None else allow_fallback  # null means unset, as for every key
    if not isinstance(allow_fallback, bool):
        raise ConfigError(f"allow_fallback must be true or false, got {allow_fallback!r}",
                          file=config.origin("allow_fallback"), field="allow_fallback")
    errors = []
    for name in choices:
        try:
            manager = RuntimeManager.create(schedule_config(config, name, mllm), runtime_hints(config))
        except BackendError as err:
            if len(choices) == 1:
                raise err.at(file=config.origin("backend_type"), field="backend_type") from err
            errors.append(str(err))
            log.warning("backend %s unavailable, trying the next one in backend_type: %s", name, err)
            continue
        manager.allow_fallback = allow_fallback
        return manager
    raise BackendError("no backend of backend_type is available: " + "; ".join(errors),
                       file=config.origin("backend_type"), field="backend_type")

