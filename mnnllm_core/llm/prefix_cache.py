"""The prefix cache on disk (MNN's `prefix_cache_path`): a prompt's KV cache, saved after its
prefill, so a later process with the same model and the same leading tokens loads it instead of
prefilling them again.

On when `prefix_cache_path` is set in the config (MNN's default value, "prefixcache", names the
folder MNN would use; mnnllm writes nothing unless asked). A file lives in
`<prefix_cache_path>/<key>/<tokens>-<hash>.kv`: the key is a hash of everything the cached values
depend on (the model files' identity, backend, precision and memory mode, the layer count, this
format's version), the name the number and a hash of the exact token ids. A later prompt takes the
longest run of leading tokens it shares with any saved file (a shared system prompt, or the
conversation so far). The file holds a JSON
header (the same facts in full, the token ids, each layer's shape and dtype), a checksum
(checksum.py) of the whole file but itself (the header's token ids included), then every layer's
keys and values as the cache's `snapshot` gave them (cpu: float32 [tokens, kv_heads, dim], or
its stored rows below fp32, whose keys and values may differ in width; a device cache: its raw
rows). It is written beside and renamed into place. A file that is stale,
truncated or corrupt (any byte changed after it was written) is never used: a warning says why,
it is removed, and the prompt is prefilled (and saved again). A file is chosen by the tokens its
header lists, then read whole and checked before anything in it is used.

A prompt is saved when its prefill computed at least `MIN_NEW_TOKENS` tokens; a prompt that
extends a saved file's tokens replaces that file (a chat keeps one file, its latest turn); other
prompts add files, which nothing evicts: clear the folder when it grows too big. Only
backends whose caches are `saveable` (`snapshot` and `restore`: cpu, opencl) take part; for others
(vulkan; a model with a short-convolution history) it is logged and off.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..core.checksum import SIZE as CHECKSUM_SIZE, checksum
from ..core.file_identity import file_identity
from ..core.kv_cache import KVCache
from ..files import open_regular_file, written_beside

if TYPE_CHECKING:
    from ..express.module import NetModule
    from .config import LlmConfig
    from .conversation import Conversation

log = logging.getLogger(__name__)

MAGIC = b"MNNLLMKV"
VERSION = 2  # 2: the checksum covers the header too
MIN_NEW_TOKENS = 16
_HEADER = struct.Struct("<8sI")  # magic, header length; then the header, the checksum, the payload


class RejectedFile(Exception):
    """Why a prefix-cache file cannot be used."""


def token_hash(tokens: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, "<i4").tobytes()).hexdigest()[:16]


def model_caches(module: "NetModule") -> list[KVCache]:
    """Every per-token state the executions keep (Attention's KV caches, a short convolution's
    history, ...: each a KVCache the module pool's clones share with the loaded module)."""
    executions = module.static_module.session.pipeline.executions.values()
    return [value for _, e in executions for value in vars(e).values() if isinstance(value, KVCache)]


class PrefixCache:
    def __init__(self, folder: str, identity: dict, conversation: "Conversation"):
        self.identity = identity
        self.folder = os.path.join(folder, hashlib.sha256(json.dumps(identity, sort_keys=True).encode())
                                   .hexdigest()[:16])
        self.caches = conversation.caches
        self.conversation = conversation
        self._pending: list[int] | None = None  # the prompt whose prefill is under way
        self._restored = 0  # how many of its tokens came from the caches
        self._superseded: str | None = None  # the file it extends: removed once it is saved

    @classmethod
    def for_model(cls, cfg: "LlmConfig", backend: str, conversation: "Conversation") -> "PrefixCache | None":
        """The model's prefix cache, or None when `prefix_cache_path` is unset or its backend's
        KV cache cannot be saved."""
        folder = cfg.get("prefix_cache_path")
        if not folder:
            return None
        caches = conversation.caches
        unsaveable = sorted({type(c).__name__ for c in caches if not c.saveable})
        if not caches or unsaveable:
            log.warning("prefix cache off: the KV cache (%s) of backend %s cannot be saved",
                        ", ".join(unsaveable) or "none found", backend)
            return None
        options = cfg.runtime_options()
        identity = {"format": VERSION, "model": file_identity([cfg.llm_model, cfg.llm_weight, cfg.embedding_file]),
                    "backend": backend, "precision": options.precision,
                    "memory": options.memory, "layers": len(caches)}
        if cfg.attention_mode % 8:  # quantized keys or values: another file (fp32 files keep their key)
            identity["attention_mode"] = cfg.attention_mode
        if (cfg.get("backend_hints") or {}).get("kv_fp16"):  # fp16 rows: another file too
            identity["kv_fp16"] = True
        return cls(str(folder), identity, conversation)

    # -- the Llm's two calls -------------------------------------------------------------
    def restore(self, prompt_ids: list[int], common: int) -> int:
        """Load the longest prefix of `prompt_ids` a saved file holds, when it is longer than the
        `common` tokens the in-memory cache already holds (at most all but the last token, which
        must run for its logits: a key or value depends only on the tokens before it, so a file
        saved for a longer or different prompt gives its common prefix); the number of leading
        tokens now cached. Also notes the prompt for `saved_after`."""
        self._pending, self._restored, self._superseded = list(prompt_ids), common, None
        limit = len(prompt_ids) - 1
        for path in self._candidates(prompt_ids, common):
            try:
                header, keys, values = self._read(path)
            except RejectedFile as why:
                self._reject(path, why)
                continue
            shared = _shared_length(header["tokens"], prompt_ids)  # as checked: it may have been replaced
            use = min(shared, limit)
            if use <= common:
                continue
            for cache, k, v in zip(self.caches, keys, values):
                cache.restore(k[:use], v[:use])
            self.conversation.restore(prompt_ids[:use])
            self._restored = use
            if shared == len(header["tokens"]):  # the new prompt extends that file's: it replaces it
                self._superseded = path
            log.info("prefix cache: %d of %d prompt tokens from %s", use, len(prompt_ids), path)
            return use
        return common

    def saved_after(self, history: Sequence[int]) -> None:
        """After a forward: when it completed the noted prompt's prefill, save that prompt's cache."""
        pending = self._pending
        if pending is None or len(history) != len(pending) or list(history) != pending:
            return
        self._pending = None
        if len(pending) - self._restored < MIN_NEW_TOKENS:
            return
        path = os.path.join(self.folder, f"{len(pending)}-{token_hash(pending)}.kv")
        if os.path.exists(path):
            return
        try:
            self._write(path, pending)
        except OSError as err:
            log.warning("prefix cache: cannot write %s: %s", path, err)
            return
        if self._superseded is not None:
            _remove(self._superseded)

    # -- files ------------------------------------------------------------------------------
    def _reject(self, path: str, why: Exception) -> None:
        log.warning("prefix cache: not using %s: %s; prefilling instead", path, why)
        _remove(path)

    def _candidates(self, prompt_ids: Sequence[int], common: int) -> list[str]:
        """The saved files whose headers list more than `common` leading tokens of the prompt,
        most first (their headers unchecked: `_read` checks the one it uses)."""
        try:
            names = [n for n in os.listdir(self.folder) if n.endswith(".kv")]
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            path = os.path.join(self.folder, name)
            try:
                header = _read_header(path)
            except RejectedFile as why:
                self._reject(path, why)
                continue
            shared = _shared_length(header["tokens"], prompt_ids)
            if min(shared, len(prompt_ids) - 1) > common:
                found.append((shared, path))
        return [path for _, path in sorted(found, key=lambda item: item[0], reverse=True)]

    def _write(self, path: str, tokens: list[int]) -> None:
        arrays = [tuple(np.ascontiguousarray(a) for a in c.snapshot()) for c in self.caches]
        if any(k.shape[0] != len(tokens) or v.shape[0] != len(tokens) or k.dtype != v.dtype for k, v in arrays):
            log.warning("prefix cache: the KV cache does not hold the prompt's %d tokens; not saved", len(tokens))
            return
        header = json.dumps({"identity": self.identity, "tokens": tokens,
                             "layers": [{"shape": list(k.shape[1:]), "dtype": k.dtype.str,
                                         **({} if v.shape == k.shape else {"value_shape": list(v.shape[1:])})}
                                        for k, v in arrays]
                             }).encode()
        prefix = _HEADER.pack(MAGIC, len(header))
        payload = [a.reshape(-1).view(np.uint8) for pair in arrays for a in pair]
        with written_beside(path) as f:
            f.write(prefix + header + checksum([prefix, header, *payload]))
            for part in payload:
                f.write(part)
        log.info("prefix cache: saved %d tokens to %s", len(tokens), path)

    def _read(self, path: str) -> tuple[dict, list[np.ndarray], list[np.ndarray]]:
        """A file's header and every layer's keys and values, read at one go and checked."""
        try:
            with open_regular_file(path) as f:
                prefix, text, header = _header_of(f)
                if header["identity"] != self.identity:
                    changed = sorted(k for k in set(header["identity"]) | set(self.identity)
                                     if header["identity"].get(k) != self.identity.get(k))
                    raise RejectedFile(f"stale: made for another {', '.join(changed)}")
                layers, count = header["layers"], len(header["tokens"])
                if len(layers) != len(self.caches):
                    raise RejectedFile(f"{len(layers)} layers, the model has {len(self.caches)}")
                per_layer = [tuple(count * int(np.prod(s, dtype=np.int64)) * dtype.itemsize for s in (shape, v_shape))
                             for shape, dtype, v_shape in layers]
                stored = _regular_size(f) - header["payload_at"]
                expected_size = sum(k + v for k, v in per_layer)
                if stored != expected_size:  # checked before reading: the file may be any size
                    raise RejectedFile(f"truncated: {stored} bytes of keys and values, expected {expected_size}")
                expected = f.read(CHECKSUM_SIZE)
                payload = memoryview(f.read(stored))
        except OSError as err:
            raise RejectedFile(f"cannot read it ({err.strerror or err})") from err
        if checksum([prefix, text, payload]) != expected:
            raise RejectedFile("corrupt: its header, keys and values do not match their checksum")
        keys, values, at = [], [], 0
        for (shape, dtype, v_shape), (k_bytes, v_bytes) in zip(layers, per_layer):
            keys.append(np.frombuffer(payload[at:at + k_bytes], dtype).reshape(count, *shape))
            values.append(np.frombuffer(payload[at + k_bytes:at + k_bytes + v_bytes], dtype).reshape(count, *v_shape))
            at += k_bytes + v_bytes
        return header, keys, values


def _shared_length(saved: Sequence[int], prompt: Sequence[int]) -> int:
    """How many leading tokens two token lists share."""
    saved, prompt = np.asarray(saved, np.int64), np.asarray(prompt, np.int64)
    common = min(len(saved), len(prompt))
    differ = np.flatnonzero(saved[:common] != prompt[:common])
    return int(differ[0]) if differ.size else common


def _regular_size(f) -> int:
    return os.fstat(f.fileno()).st_size


def _read_header(path: str) -> dict:
    """A file's JSON header, its fields checked for type (not yet its checksum)."""
    try:
        with open_regular_file(path) as f:
            return _header_of(f)[2]
    except OSError as err:
        raise RejectedFile(f"cannot read it ({err.strerror or err})") from err


def _header_of(f) -> tuple[bytes, bytes, dict]:
    """The magic and length, the JSON text and the parsed header (`payload_at` added) at the
    start of an open file; its fields checked for type."""
    file_size = _regular_size(f)
    prefix = f.read(_HEADER.size)
    if len(prefix) < _HEADER.size:
        raise RejectedFile("truncated: no header")
    magic, size = _HEADER.unpack(prefix)
    if magic != MAGIC:
        raise RejectedFile("not a prefix-cache file")
    if size > file_size - _HEADER.size:  # read(n) allocates n bytes first: never trust n
        raise RejectedFile(f"truncated: a {size}-byte header in a {file_size}-byte file")
    text = f.read(size)
    try:
        header = json.loads(text)
        header["tokens"] = [int(t) for t in header["tokens"]]
        header["layers"] = [(tuple(int(x) for x in layer["shape"]), np.dtype(layer["dtype"]),
                             tuple(int(x) for x in layer.get("value_shape", layer["shape"])))
                            for layer in header["layers"]]
        if not isinstance(header["identity"], dict):
            raise TypeError("identity of the wrong type")
    except (ValueError, KeyError, TypeError) as err:
        raise RejectedFile(f"a malformed header ({err})") from err
    header["payload_at"] = _HEADER.size + size + CHECKSUM_SIZE
    return prefix, text, header


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as err:
        log.warning("prefix cache: cannot remove %s: %s", path, err)
