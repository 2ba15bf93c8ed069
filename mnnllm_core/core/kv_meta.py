"""MNN's KVMeta: how the LLM tells every Attention what to do with its KV cache this step."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ..errors import KVStateError

if TYPE_CHECKING:
    from .kv_slots import BatchMeta


@dataclass
class KVMeta:
    """`previous` tokens are cached; this step drops `remove` of them from the end and
    appends `add` new ones. `reserve` (MNN's reserve / n_reserve) names (begin, size) runs of
    the removed tail, counted from its first row, that stay after all: they move down to follow
    the kept prefix, in order (a verified token tree keeps its accepted path, rows that are not
    contiguous). `sync()` commits the step, as MNN's KVMeta::sync does."""

    previous: int = 0
    remove: int = 0
    add: int = 0
    reserve: tuple[tuple[int, int], ...] = ()
    steps: int = 0  # syncs so far: a step run again after an interrupt has the same number
    batch: "BatchMeta | None" = None  # a step of several sequences' rows (kv_slots.py); None: one sequence

    @property
    def reserved(self) -> int:
        return sum(size for _, size in self.reserve)

    @property
    def kept(self) -> int:
        """Cached tokens that stay before this step's new ones."""
        return self.previous - self.remove + self.reserved

    def sync(self) -> None:
        self.previous = self.kept + self.add
        self.steps += 1
        self.remove = 0
        self.add = 0
        self.reserve = ()

    def reset(self) -> None:
        self.remove = self.previous
        self.add = 0
        self.reserve = ()

    def keep_rows(self, prefix: int, rows: Sequence[int]) -> None:
        """Keep the first `prefix` cached rows, then the rows `rows` (ascending, beyond the
        prefix), and drop the rest: a remove of everything after the prefix, with the rows as
        reserve runs (adjacent rows join one run, one move)."""
        runs: list[list[int]] = []
        for row in rows:
            offset = row - prefix
            if runs and runs[-1][0] + runs[-1][1] == offset:
                runs[-1][1] += 1
            else:
                runs.append([offset, 1])
        self.remove = self.previous - prefix
        self.reserve = tuple((begin, size) for begin, size in runs)
        self.check_reserve()

    def cut_to(self, length: int) -> None:
        """Keep only the first `length` tokens of what this step keeps (the history is the
        truth: a shorter one drops reserved rows from the end, then prefix rows)."""
        base = self.previous - self.remove
        if not self.reserve or length <= base:
            self.remove, self.reserve = self.previous - length, ()
            return
        runs, left = [], length - base
        for begin, size in self.reserve:
            if left <= 0:
                break
            runs.append((begin, min(size, left)))
            left -= size
        self.reserve = tuple(runs)

    def check_reserve(self) -> None:
        """Each run lies inside the removed tail, after the run before it: a KVStateError otherwise."""
        end = 0
        for begin, size in self.reserve:
            if begin < end or size < 1 or begin + size > self.remove:
                raise KVStateError(f"KV meta reserve {list(self.reserve)} is not ascending runs inside the "
                                   f"{self.remove} removed tokens", field="reserve")
            end = begin + size
