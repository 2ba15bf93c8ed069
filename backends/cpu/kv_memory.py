"""Where the cpu backend's KV caches live: MNN's `kvcache_mmap` and `kvcache_limit`.

With `kvcache_mmap` every layer's cache is a file-backed mapping in `tmp_path` (the system's
temporary folder when unset). `kvcache_limit` (MNN's KVCACHE_SIZE_LIMIT hint: "size limit of
kvcache in memory (for a single layer); if the size of kvcache exceeds the limit, it will be
moved to disk") is in bytes of one layer's keys and values together; -1 (the default) means no
limit. A layer whose storage would grow past it is grown into a file-backed mapping, the rows so
far copied there, as MNN's KVCacheManager moves it from memory to disk. Otherwise a layer lives in
anonymous mappings (`host_memory.py`): a capacity beyond the tokens written costs no memory.
"""
from __future__ import annotations

import functools
import logging
import tempfile
from typing import Callable

from mnnllm_core.backend_api import file_backed_zeros

from .host_memory import mapped_zeros

log = logging.getLogger(__name__)


class KVMemory:
    def __init__(self, mmap: bool = False, limit: int = -1, folder: str = "") -> None:
        self.mmap = mmap
        self.limit = limit
        self.on_disk = functools.partial(file_backed_zeros, folder=folder or tempfile.gettempdir())
        self._told = False

    def zeros_for(self, layer_bytes: int) -> Callable:
        """The allocator (np.zeros's signature) for a layer whose keys and values take `layer_bytes`."""
        if self.mmap:
            return self.on_disk
        if 0 <= self.limit < layer_bytes:
            if not self._told:
                log.info("kvcache_limit: a layer's KV cache of %d bytes exceeds %d: kept in a file-backed mapping",
                         layer_bytes, self.limit)
                self._told = True
            return self.on_disk
        return mapped_zeros  # committed as written, given back when the cache grows past it (host_memory.py)
