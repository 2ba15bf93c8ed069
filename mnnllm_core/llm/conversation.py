"""The conversation's state: the token history and the KV cache that mirrors it.

The history is the truth. Every change of it goes through here and tells the model's KV meta
what to do with the cached rows at the next step (MNN's `remove` / `add` / `reserve`), so no other
code writes `LlmContext.history_tokens` or the meta: a forward step appends (`start_step`, then
`commit`), speculative decoding drops guesses the model refused (`rewind`) or keeps the accepted
path of a token tree (`keep_rows`), a prompt rewinds to its common prefix, the prefix cache on disk
`restore`s a prompt's leading tokens, and `forget` empties it all.
"""
from __future__ import annotations

from typing import Sequence

from ..core.kv_cache import KVCache
from ..core.kv_meta import KVMeta
from .context import LlmContext


class Conversation:
    """One Llm's history and KV length. `attach` binds the loaded model's KV meta and caches."""

    def __init__(self, context: LlmContext):
        self.context = context
        self.meta: KVMeta | None = None
        self.caches: list[KVCache] = []  # every per-token state the model's executions keep

    def attach(self, meta: KVMeta, caches: list[KVCache]) -> None:
        self.meta, self.caches = meta, caches

    @property
    def history(self) -> Sequence[int]:
        """The tokens whose KV rows the cache holds (or is told to keep): read, never write."""
        return self.context.history_tokens

    def __len__(self) -> int:
        return len(self.context.history_tokens)

    @property
    def cached(self) -> int:
        """Rows the KV cache held after its last step."""
        return self.meta.previous

    @property
    def reservable(self) -> bool:
        """Whether the cache can keep rows that are not contiguous (a token tree's accepted path)."""
        return all(cache.reservable for cache in self.caches)

    def start_step(self, count: int) -> None:
        """A forward of `count` new tokens follows: the cache is cut back to the history first
        (keeping the reserved rows a verified tree left), so an interrupted step leaves no stale rows."""
        self.meta.cut_to(len(self))
        self.meta.add = count

    def commit(self, ids: Sequence[int]) -> None:
        """The step ran: its tokens join the history (the KV cache holds them now)."""
        self.meta.sync()
        self.context.history_tokens.extend(ids)
        self.context.all_seq_len = len(self)

    def rewind(self, length: int) -> None:
        """Keep the first `length` tokens; the rows after them go at the next step (KV meta remove)."""
        history = self.context.history_tokens
        del history[length:]
        self.context.all_seq_len = len(history)
        if self.meta is not None:
            self.meta.cut_to(length)

    def keep_rows(self, tokens: Sequence[int], rows: Sequence[int]) -> None:
        """After the forward of `tokens` (a tree): only its `rows` (the accepted path) stay in the
        history, and their KV rows after the prefix (KV meta remove + reserve, MNN's way)."""
        history = self.context.history_tokens
        prefix = len(history) - len(tokens)
        history[prefix:] = [tokens[row] for row in rows]
        self.context.all_seq_len = len(history)
        self.meta.keep_rows(prefix, [prefix + row for row in rows])

    def restore(self, ids: Sequence[int]) -> None:
        """The caches were loaded with the rows of `ids` (the prefix cache on disk): they are the history."""
        self.context.history_tokens[:] = ids
        meta = self.meta
        meta.previous, meta.remove, meta.add, meta.reserve = len(ids), 0, 0, ()

    def forget(self) -> None:
        """Empty the history; the KV cache is emptied at the next step."""
        if self.meta is not None:
            self.meta.reset()
        self.context.history_tokens.clear()
        self.context.output_tokens = []
        self.context.all_seq_len = 0
