"""`mnnllm list` and `mnnllm rm`: the models a user has in the caches, and removing one.

Two caches hold models: mnnllm's own (`<cache>/models/NAME`: the default model and every GGUF
file or HuggingFace folder exported on first use, model_cache.py) and huggingface_hub's, for the
MNN-format repositories fetched by hub id (hub.py; listed when huggingface_hub is installed, only
repositories holding an MNN model). `rm` removes only inside them: a NAME of mnnllm's cache is a
plain folder name there (no separator, not hidden), a hub repository is removed through
huggingface_hub's own cache API.
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError
from .export.default_model import DEFAULT_MODEL_NAME, DEFAULT_SOURCE
from .export.model_cache import damage_of, models_folder, read_manifest

log = logging.getLogger(__name__)


@dataclass
class CachedModel:
    name: str       # what `mnnllm rm` and the MODEL argument take
    size: int       # bytes on disk
    source: str     # where it came from
    path: str       # its folder
    state: str = "ready"


def cached_models(cache_dir: str | None = None) -> list[CachedModel]:
    """Every model of both caches, mnnllm's first, each sorted by name."""
    return _exported(cache_dir) + _hub_models()


def _exported(cache_dir: str | None) -> list[CachedModel]:
    folder = models_folder(cache_dir)
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or not path.is_dir():
            continue  # staging folders of an export at work
        manifest = read_manifest(path) or {}
        damage = damage_of(path, manifest.get("identity", ""))
        source = manifest.get("source") or (DEFAULT_SOURCE if path.name == DEFAULT_MODEL_NAME
                                            else "unknown (exported by an earlier mnnllm)")
        found.append(CachedModel(path.name, _size(path), source, str(path), "ready" if damage is None else damage))
    return found


def _hub_models() -> list[CachedModel]:
    try:
        from huggingface_hub import scan_cache_dir
        from huggingface_hub.errors import CacheNotFound
    except ImportError:
        return []
    try:
        info = scan_cache_dir()
    except (CacheNotFound, OSError):
        return []
    from .model_source import is_mnn_folder
    found = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        snapshots = [r for r in repo.revisions if is_mnn_folder(Path(r.snapshot_path))]
        if repo.repo_type == "model" and snapshots:
            commits = ", ".join(r.commit_hash[:10] for r in snapshots)
            found.append(CachedModel(repo.repo_id, repo.size_on_disk, f"hub (huggingface_hub's cache, {commits})",
                                     str(repo.repo_path)))
    return found


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def remove_model(name: str, cache_dir: str | None = None) -> CachedModel:
    """Remove the cached model `name` (as `cached_models` names it); what was removed."""
    root = models_folder(cache_dir)
    if name and "/" not in name and "\\" not in name and not name.startswith(".") and name not in ("", ".."):
        target = root / name
        if target.is_dir() and not target.is_symlink() and target.resolve().parent == root.resolve():
            entry = next(m for m in _exported(cache_dir) if m.name == name)
            shutil.rmtree(target)
            return entry
    for entry in _hub_models():
        if entry.name == name:
            _remove_hub_repo(name)
            return entry
    known = ", ".join(m.name for m in cached_models(cache_dir)) or "none"
    raise ConfigError(f"no cached model {name!r} (cached: {known}; `mnnllm list` shows them)", field="NAME")


def _remove_hub_repo(repo_id: str) -> None:
    from huggingface_hub import scan_cache_dir
    info = scan_cache_dir()
    hashes = [r.commit_hash for repo in info.repos if repo.repo_id == repo_id for r in repo.revisions]
    info.delete_revisions(*hashes).execute()
