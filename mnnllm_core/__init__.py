"""mnnllm: run LLMs exported in the MNN-LLM format on pluggable backends."""
from .errors import MnnllmError
from .version import __version__


def create(config_path, embedding_model=False, base=None):
    """MNN's Llm::createLLM, or with `embedding_model` its Embedding (see mnnllm_core.llm.llm.create;
    `base`: a loaded Llm to share weights with)."""
    from .llm.llm import create as _create
    return _create(config_path, embedding_model, base=base)


__all__ = ["create", "MnnllmError", "__version__"]
