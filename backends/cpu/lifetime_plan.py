"""Offsets of a step's big buffers in one arena, placed by lifetime (greedy by size, as TFLite's
arena planner and MNN's static memory planning do): the biggest first, each at the lowest offset
whose bytes no placed buffer of an overlapping lifetime holds.

A released buffer handed to the next tensor that fits it (`SizedBufferPool` alone) leaves the
bytes of a [rows, 1536] buffer serving a [rows, 576] tensor, the rest idle: the 8,192-row step of
the shared model held 260 MiB of buffers where at most 184 were live at once. Placed by lifetime,
the arena is the live peak (184 MiB there); with the MLP's MUL_SILU writing over its gate
(`Execution.output_may_share`) 154, with the graph's input free after its last reader 136; with
the MLP run in slabs of rows (the core's row_slabs.py) and RoPE and the norms writing over their
inputs, 70.
"""
from __future__ import annotations

from dataclasses import dataclass

ALIGN = 64  # bytes: each offset a multiple of a cache line (and of any dtype's size)


@dataclass
class Lifetime:
    """A buffer live from event `start` until event `stop` (exclusive), of `nbytes` bytes."""

    start: int
    stop: int
    nbytes: int

    def overlaps(self, other: "Lifetime") -> bool:
        return self.start < other.stop and other.start < self.stop


def aligned(nbytes: int) -> int:
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)


def place(lifetimes: list[Lifetime]) -> tuple[list[int], int]:
    """Each lifetime's byte offset, and the arena's size: two buffers whose lifetimes overlap never
    share a byte."""
    offsets = [0] * len(lifetimes)
    placed: list[int] = []
    end = 0
    for i in sorted(range(len(lifetimes)), key=lambda i: (-lifetimes[i].nbytes, lifetimes[i].start)):
        own = lifetimes[i]
        size = aligned(own.nbytes)
        offset = 0
        for j in sorted((j for j in placed if lifetimes[j].overlaps(own)), key=offsets.__getitem__):
            if offset + size <= offsets[j]:
                break
            offset = max(offset, offsets[j] + aligned(lifetimes[j].nbytes))
        offsets[i] = offset
        placed.append(i)
        end = max(end, offset + size)
    return offsets, end
