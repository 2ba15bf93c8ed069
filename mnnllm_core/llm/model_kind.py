"""Which kind of model an export is, from its graph: MNN's embedding models (text encoders, loaded
with embedding_model=True) output `sentence_embeddings`, where an LLM outputs `logits`. The config
does not say; `mnnllm serve` chooses what it serves by this, and Llm.load says how to load an encoder."""
from __future__ import annotations

import os

from ..errors import MnnllmError
from .config import LlmConfig, resolve_config_path

SENTENCE_EMBEDDINGS = "sentence_embeddings"


def is_text_encoder(graph: str | os.PathLike) -> bool:
    """Whether the llm.mnn at `graph` outputs sentence_embeddings (a FormatError when it is unreadable)."""
    from ..schema.reader import read_net_file
    names = read_net_file(str(graph)).outputName or []
    return SENTENCE_EMBEDDINGS in [name.decode() if isinstance(name, bytes) else name for name in names]


def is_embedding_model(config_path: str | os.PathLike) -> bool:
    """Whether the model a config names is an embedding model; False when its graph cannot be read,
    which its load then reports."""
    try:
        return is_text_encoder(LlmConfig.from_file(resolve_config_path(config_path)).llm_model)
    except MnnllmError:
        return False
