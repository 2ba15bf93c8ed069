"""Models named by a hub id (`org/name`, `org/name@revision`), fetched with huggingface_hub.

huggingface_hub does the work and keeps its rules: its cache (`$HF_HUB_CACHE`, else
`$HF_HOME/hub`, else ~/.cache/huggingface/hub), its offline mode (`HF_HUB_OFFLINE=1`: the cache
only), its endpoint (`HF_ENDPOINT`, e.g. a mirror), its token and its progress bars. It is an
optional dependency (`pip install 'mnnllm[hub]'`): only hub ids need it.

The repository's config.json (and llm_config.json) come first, to tell its format: an MNN-format
repository (what MNN's exporter writes: config.json naming `llm_model`) is then fetched whole but
for MNN's JSON dumps of the graph; a HuggingFace-format one only what an export reads (configs,
tokenizer, *.safetensors), never *.bin / *.pt / *.gguf / *.onnx copies of the same weights.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from .errors import ConfigError
from .steps import announce

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install huggingface_hub (or pip install 'mnnllm[hub]')"
_FORMAT_FILES = ["config.json", "llm_config.json"]
_MNN_IGNORE = ["*.mnn.json", "*.md", ".gitattributes", "*.onnx", "*.onnx.data", "*.png", "*.jpg"]
_HF_ALLOW = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.txt"]


def download(spec: str) -> Path:
    """The local snapshot folder of the repository `spec` names, downloaded (or completed) first."""
    try:
        import huggingface_hub
        from huggingface_hub import constants, errors
    except ImportError:
        raise ConfigError(f"{spec!r} is not a local file or folder; as a hub id it needs huggingface_hub: "
                          f"{INSTALL_HINT}", file=spec) from None
    repo, _, revision = spec.partition("@")
    where = "huggingface_hub's cache (offline: HF_HUB_OFFLINE is set)" if constants.HF_HUB_OFFLINE \
        else constants.ENDPOINT

    def fetch(**patterns) -> Path:
        return Path(huggingface_hub.snapshot_download(repo, revision=revision or None, **patterns))

    try:
        head = fetch(allow_patterns=_FORMAT_FILES)
        mnn = _names_graph(head)
        announce(f"fetching {spec} ({'MNN' if mnn else 'HuggingFace'} format) from {where} into "
                 f"{constants.HF_HUB_CACHE} (once; progress below)")
        folder = fetch(ignore_patterns=_MNN_IGNORE) if mnn else fetch(allow_patterns=_HF_ALLOW)
    except errors.RevisionNotFoundError:
        raise ConfigError(f"hub id {repo}: the repository at {where} has no revision {revision!r}", file=spec) from None
    except errors.RepositoryNotFoundError:
        raise ConfigError(f"not found: no local file or folder {spec!r}, and {where} has no repository {repo!r} "
                          f"(or it is private: set HF_TOKEN)", file=spec) from None
    except errors.LocalEntryNotFoundError as err:
        why = "HF_HUB_OFFLINE=1 forbids fetching it" if constants.HF_HUB_OFFLINE else \
            f"it could not be fetched from {constants.ENDPOINT} ({_first_line(err)})"
        raise ConfigError(f"not found: no local file or folder {spec!r}, and hub id {repo!r} is not in "
                          f"{constants.HF_HUB_CACHE}, and {why}", file=spec) from None
    except (errors.HfHubHTTPError, OSError) as err:
        raise ConfigError(f"hub id {repo!r}: fetching it from {where} failed: {_first_line(err)}", file=spec) from None
    if not (folder / "config.json").is_file():
        raise ConfigError(f"hub repository {repo!r} holds no config.json: neither an MNN nor a HuggingFace model",
                          file=str(folder))
    return folder


def _names_graph(folder: Path) -> bool:
    """Whether a repository's configs are an MNN model's (llm_config.json, or llm_model named)."""
    if (folder / "llm_config.json").is_file():
        return True
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "llm_model" in config


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
