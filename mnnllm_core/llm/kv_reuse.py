"""Whether a generation reuses the KV cache the previous one left: MNN's `reuse_kv` and `prompt_cache`.

mnnllm's `response`/`generate` always take the whole conversation and, with reuse, prefill only
what follows the longest common token prefix with the history (`Llm.cached_prefix`): the greedy
tokens are those of a fresh prefill. MNN's two keys say whether to do that:

* neither key set: reuse (mnnllm's default; MNN's is false for both, because its `response`
  is handed only the new turn and keeps the history itself);
* either key true: reuse;
* set, but none true (`"reuse_kv": false`): every prompt is prefilled whole from an empty cache.
"""
from __future__ import annotations

from .config import LlmConfig

REUSE_KEYS = ("reuse_kv", "prompt_cache")


def reuse_enabled(config: LlmConfig) -> bool:
    given = [config.get(key) for key in REUSE_KEYS if config.get(key) is not None]
    return any(given) if given else True
