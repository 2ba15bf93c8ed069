"""What a user names as a model, turned into the config.json of an MNN model: the MODEL argument
of `run`, `chat`, `serve`, `bench`, `inspect` (and `create()` callers who want the same).

- an MNN model folder or its config.json / llm_config.json: used as it is;
- a `.gguf` file, or a HuggingFace folder (config.json + *.safetensors + tokenizer.json): exported
  once into the cache (model_cache.py), 4-bit blocks of 64 and greedy sampling as the default
  model, and reused while the source is unchanged;
- the NAME of a model in the cache, as `mnnllm list` shows it;
- a hub id `org/name` (optionally `org/name@revision`): downloaded with huggingface_hub (hub.py);
  an MNN-format repository is used from huggingface_hub's cache, a HuggingFace-format one is then
  exported as a local folder would be.
A local path wins over a hub id of the same spelling; anything else is a ConfigError saying what
was tried.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from .core.file_identity import file_identity
from .errors import ConfigError
from .export.default_model import DEFAULT_RUNTIME_CONFIG
from .export.model_cache import ensure_exported, models_folder

HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+(@[A-Za-z0-9._/-]+)?")
_HF_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
             "chat_template.jinja")
EXPORT_SECONDS_PER_M_VALUES = {"gguf": 0.04, "hf": 0.03}
"""Measured on the 2-core reference machine, quiet: SmolLM2-135M from its Q4_1 GGUF in ~5 s
(dequantizing with the gguf package; ~15 s with other work on the machine), from an fp32
HuggingFace folder in ~4 s (for the line announcing an export)."""


def resolve_model(spec: str, cache_dir: str | None = None) -> str:
    """The config.json path `spec` names (see the module doc), exporting or downloading first."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if is_mnn_folder(path):
            from .llm.config import resolve_config_path
            return resolve_config_path(path)
        if is_hf_folder(path):
            return export_once(path, "hf", cache_dir)
        raise ConfigError("the folder is neither an MNN model (config.json naming llm_model, or llm_config.json) "
                          "nor a HuggingFace model (config.json, *.safetensors, tokenizer.json)", file=spec)
    if path.is_file():
        if path.suffix == ".gguf":
            return export_once(path, "gguf", cache_dir)
        from .llm.config import resolve_config_path
        return resolve_config_path(path)
    cached = models_folder(cache_dir) / spec
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec) and (cached / "config.json").is_file():
        return str(cached / "config.json")  # a NAME `mnnllm list` shows
    if HUB_ID.fullmatch(spec) and not spec.startswith((".", "/")):
        from .hub import download
        folder = download(spec)
        if is_mnn_folder(folder):
            from .llm.config import resolve_config_path
            return resolve_config_path(folder)
        return export_once(folder, "hf", cache_dir, source=f"{spec} (hub, commit {folder.name})",
                           identity=folder.name, name=cache_name(spec.replace("/", "--"), spec))
    hint = "" if "/" not in spec or spec.startswith((".", "/")) else \
        "; as a hub id it must read org/name or org/name@revision"
    raise ConfigError(f"not found: no such file or folder{hint}", file=spec)


def is_mnn_folder(folder: Path) -> bool:
    """A folder an MNN model loads from: llm_config.json, or a config.json naming its graph."""
    if (folder / "llm_config.json").is_file():
        return True
    return "llm_model" in _json_keys(folder / "config.json") or (folder / "llm.mnn").is_file()


def is_hf_folder(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _json_keys(path: Path) -> set[str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    return set(data) if isinstance(data, dict) else set()


def cache_name(label: str, where: str) -> str:
    """The cache folder of a source: its name made safe, then a hash of where it is (its absolute
    path, or its hub id): the same source always exports to the same place, an edit over it."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", label.lower()).strip("-._") or "model"
    return f"{slug[:60]}-{hashlib.sha256(where.encode()).hexdigest()[:8]}"


def source_files(path: Path, kind: str) -> list[Path]:
    """The files whose identity decides whether an export is still current."""
    if kind == "gguf":
        return [path]
    return sorted([path / n for n in _HF_FILES] + list(path.glob("*.safetensors")))


def export_once(path: Path, kind: str, cache_dir: str | None = None, *, source: str | None = None,
                identity: str | None = None, name: str | None = None) -> str:
    """The config.json of the cached export of a GGUF file or HF folder, exported first when needed."""
    from .export.exporter import write_model
    from .export.sources import open_source
    resolved = [f.resolve() for f in source_files(path, kind)]  # a hub snapshot's files are links to blobs
    label = path.name[:-len(".gguf")] if kind == "gguf" else path.name
    target = models_folder(cache_dir) / (name or cache_name(label, str(path.resolve())))
    return ensure_exported(
        target, lambda out: write_model(str(path), out, quant_bit=4, quant_block=64,
                                        runtime_config=DEFAULT_RUNTIME_CONFIG),
        source=source or str(path.resolve()), identity=identity or file_identity(resolved),
        estimate=lambda: open_source(path).elements() / 1e6 * EXPORT_SECONDS_PER_M_VALUES[kind])
