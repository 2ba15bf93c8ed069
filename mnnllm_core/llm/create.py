"""MNN's Llm::createLLM in a file of its own: it chooses among Llm and the classes that build on it
(Omni, Embedding), so it cannot live beside Llm without an import circle."""
from __future__ import annotations

import os

from ..errors import UnsupportedError
from . import arguments
from .config import LlmConfig, resolve_config_path
from .llm import Llm
from .omni import Omni
from .text_embedding import Embedding


def create(config_path: str | os.PathLike, embedding_model: bool = False, base: Llm | None = None) -> Llm:
    """MNN's Llm::createLLM: read the config and pick Llm or Omni (not loaded yet); with
    `embedding_model`, pymnn's flag, Embedding::createEmbedding's text encoder (text_embedding.py).

    `config_path` is a config.json, or a model folder (its config.json, else llm_config.json).
    `base`: a loaded Llm (same architecture, same runtime keys) whose packed weights this model
    shares for every op whose weights are the same (e.g. an export merged with a LoRA adapter);
    each Llm keeps its own KV cache and conversation.
    """
    config_path = arguments.path(config_path, "config_path")
    embedding_model = arguments.flag(embedding_model, "embedding_model")
    base = arguments.instance(base, Llm, "base")
    config = LlmConfig.from_file(resolve_config_path(config_path))
    multimodal = config.is_visual or config.is_audio or config.has_talker
    if base is not None and (embedding_model or multimodal):
        raise UnsupportedError("a base is supported for text LLMs only (not embedding or multimodal models)",
                               file=config.source, field="base")
    if embedding_model:
        return Embedding(config)
    if multimodal:
        return Omni(config)
    return Llm(config, base=base)
