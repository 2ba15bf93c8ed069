"""MNN's KVMeta: how the LLM tells every Attention what to do with its KV cache this step."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class KVMeta:
    """`previous` tokens are cached; this step drops `remove` of them from the end and
    appends `add` new ones. `sync()` commits the step, as MNN's KVMeta::sync does."""

    previous: int = 0
    remove: int = 0
    add: int = 0

    def sync(self) -> None:
        self.previous = self.previous - self.remove + self.add
        self.remove = 0
        self.add = 0

    def reset(self) -> None:
        self.remove = self.previous
        self.add = 0
