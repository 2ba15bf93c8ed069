"""MNN's module pool: one clone of the loaded module per (seq_len, all_logits).

Clones share packed weights and the KV cache; each keeps its own resized session, so a
static-shape backend never resizes between prefill and decode. The pool is bounded: the
least recently used clone is dropped when a new key would exceed `capacity`.
"""
from __future__ import annotations

from collections import OrderedDict

from ..express.module import NetModule


class ModulePool:
    def __init__(self, base: NetModule, capacity: int = 8):
        self.base = base
        self.capacity = max(2, capacity)
        self._pool: OrderedDict[tuple[int, bool], NetModule] = OrderedDict()

    def get(self, seq_len: int, all_logits: bool) -> NetModule:
        key = (int(seq_len), bool(all_logits))
        module = self._pool.get(key)
        if module is None:
            module = self.base.clone()
            self._pool[key] = module
            while len(self._pool) > self.capacity:
                self._pool.popitem(last=False)
        self._pool.move_to_end(key)
        return module

    def discard(self, seq_len: int, all_logits: bool) -> None:
        """Drop one clone (the next `get` makes a fresh one), e.g. after its run was interrupted."""
        self._pool.pop((int(seq_len), bool(all_logits)), None)

    def modules(self) -> list[NetModule]:
        """The clones, least recently used first."""
        return list(self._pool.values())

    def keys(self) -> list[tuple[int, bool]]:
        return list(self._pool)

    def resize_counts(self) -> dict[tuple[int, bool], int]:
        return {k: m.static_module.resize_count for k, m in self._pool.items()}

    def clear(self) -> None:
        self._pool.clear()
