"""Models exported on first use, kept in a cache folder: the default model, and any GGUF file or
HuggingFace folder (local, or downloaded from a hub) a command is given instead of an MNN model.

Each lives in `<cache>/models/NAME/` (the cache: `$MNNLLM_CACHE`, else ~/.cache/mnnllm). The
export is written into a temporary sibling folder and renamed into place, so an interrupted
export never leaves a half model. It records each file's size, time and SHA-256 in `MANIFEST`,
with where the model came from (`source`: what to show in `mnnllm list`) and the source's
identity (`identity`: a fingerprint of its files, or a hub commit). A later use reuses the folder
only when the identity is the same and every file has its recorded size (and, for a file whose
time changed, its recorded checksum); else it exports again over it. Staging folders left by a
killed export (their process is gone) are removed.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from mnnllm_core.core.weights.cache import default_folder
from mnnllm_core.steps import announce

from .folder import remove_orphaned_staging, replace_folder, staging_folder

logger = logging.getLogger(__name__)

MANIFEST = "mnnllm-manifest.json"
COMPLETE = ("config.json", "llm_config.json", "llm.mnn", "llm.mnn.weight", "tokenizer.mtok")

Export = Callable[[Path], None]
"""Writes a complete model into the (empty, existing) folder it is given."""


def models_folder(cache_dir: str | Path | None = None) -> Path:
    """`<cache>/models`, where exported models live."""
    return Path(cache_dir or default_folder()) / "models"


def ensure_exported(target: Path, export: Export, *, source: str, identity: str = "",
                    estimate: Callable[[], float] | None = None) -> str:
    """The config.json path of the model at `target`, exported first by `export` when the cache
    lacks it, holds it damaged (a file cut short or changed since the export) or holds another
    source's export (`identity` differs). `estimate()`: the seconds the export should take, asked
    only when it runs and said before it (the progress bar then counts the work)."""
    remove_orphaned_staging(target)
    damage = damage_of(target, identity)
    if damage is None:
        return str(target / "config.json")
    if target.exists():
        logger.warning("the cached model at %s is %s: exporting it again", target, damage)
    expected = f", about {max(2, round(estimate()))} s" if estimate is not None else ""
    announce(f"exporting {source} into {target} (once{expected})")
    with staging_folder(target) as tmp:
        export(tmp)
        write_manifest(tmp, source=source, identity=identity)
        if damage_of(target, identity) is not None:  # another process may have finished first: keep its model
            try:
                replace_folder(tmp, target)  # a damaged or incomplete leftover is replaced whole
            except OSError:  # a concurrent export renamed its complete model into place meanwhile
                if damage_of(target, identity) is not None:
                    raise
    return str(target / "config.json")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(folder: Path, source: str = "", identity: str = "") -> None:
    """Record every file's size, modification time and SHA-256 (see `damage_of`), and the source."""
    entries = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name != MANIFEST:
            info = path.stat()
            entries[path.name] = {"size": info.st_size, "mtime_ns": info.st_mtime_ns, "sha256": _sha256(path)}
    (folder / MANIFEST).write_text(json.dumps({"files": entries, "source": source, "identity": identity,
                                               "exported": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1))


def read_manifest(folder: Path) -> Mapping[str, Any] | None:
    """The manifest of a cached model folder, None when it has no readable one."""
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def damage_of(folder: Path, identity: str = "") -> str | None:
    """What is wrong with a cached model folder, None when it is intact: every file of the
    manifest there with its size; a file whose time changed must still have its checksum
    (hashing all of it on every run would cost a tenth of a second); the same source identity."""
    manifest = read_manifest(folder)
    if manifest is None:
        return "without a readable manifest"
    try:
        files = manifest["files"]
        if not isinstance(files, dict) or not set(COMPLETE) <= set(files):
            return "incomplete (its manifest lists too few files)"
        if manifest.get("identity", "") != identity:
            return "the export of an earlier version of its source"
        for name, entry in files.items():
            path = folder / name
            if not path.is_file():
                return f"damaged ({name} is missing)"
            info = path.stat()
            if info.st_size != entry["size"]:
                return f"damaged ({name} has {info.st_size} bytes, the export wrote {entry['size']})"
            if info.st_mtime_ns != entry["mtime_ns"] and _sha256(path) != entry["sha256"]:
                return f"damaged ({name} was changed since the export)"
    except (OSError, KeyError, TypeError):
        return "without a readable manifest"
    return None
