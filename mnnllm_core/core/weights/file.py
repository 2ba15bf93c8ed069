"""The external weight file (`llm.mnn.weight`), memory-mapped and read by bound-checked views.

MNN's exporter writes every Convolution's and LayerNorm's data back to back into
one file and stores `external = [offset, size, size, ...]` on the op. The file is
as large as the model, so it is mapped, never read whole: a read is a zero-copy
view and only the pages a caller touches are ever loaded (the tied lm_head used
as the embedding table relies on this).
"""
from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import numpy as np

from mnnllm_core.errors import WeightFileError
from mnnllm_core.files import open_regular

logger = logging.getLogger(__name__)


class ExternalWeightFile:
    """A read-only mapping of an external weight file with bound-checked reads."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        with open_regular(self.path, WeightFileError, "external weight file") as f:
            self._size = os.fstat(f.fileno()).st_size
            # mmap refuses empty files; an empty file still answers `size` and fails every read.
            try:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if self._size else None
            except OSError as e:
                raise WeightFileError(f"cannot map the external weight file: {e.strerror or e}",
                                      file=str(self.path)) from e
        self._bytes: np.ndarray | None = (
            np.frombuffer(self._mmap, dtype=np.uint8) if self._mmap is not None else np.empty(0, np.uint8))
        logger.debug("mapped %s (%d bytes)", self.path, self._size)

    @property
    def size(self) -> int:
        """The file's length in bytes."""
        return self._size

    @property
    def closed(self) -> bool:
        return self._bytes is None

    def read(self, offset: int, nbytes: int, *, op_name: str, field: str) -> np.ndarray:
        """A zero-copy uint8 view of `nbytes` at `offset`; raises WeightFileError outside the file."""
        if self._bytes is None:
            raise WeightFileError(f"op {op_name!r}: read of {field} after the weight file was closed",
                                  file=str(self.path), field=field)
        offset, nbytes = int(offset), int(nbytes)
        if offset < 0 or nbytes < 0:
            raise WeightFileError(
                f"op {op_name!r}: {field} has a negative offset or size (offset {offset}, size {nbytes})",
                file=str(self.path), field=field)
        if offset + nbytes > self._size:
            raise WeightFileError(
                f"op {op_name!r}: {field} at offset {offset} with size {nbytes} runs past the end of the "
                f"weight file ({self._size} bytes; the file is truncated or the op is corrupt)",
                file=str(self.path), field=field)
        return self._bytes[offset:offset + nbytes]

    def read_sections(self, external: Sequence[int], fields: Sequence[str], *,
                      op_name: str) -> tuple[np.ndarray, ...]:
        """Split an op's `external = [offset, size_1, size_2, ...]` into consecutive views named `fields`.

        Convolution: fields ("weight", "alpha", "bias"); LayerNorm: ("gamma", "beta").
        """
        if len(external) < len(fields) + 1:
            raise WeightFileError(
                f"op {op_name!r}: external has {len(external)} entries, {len(fields) + 1} needed "
                f"(offset, {', '.join(fields)})", file=str(self.path), field="external")
        offset = int(external[0])
        views = []
        for name, nbytes in zip(fields, external[1:]):
            views.append(self.read(offset, nbytes, op_name=op_name, field=name))
            offset += int(nbytes)
        return tuple(views)

    def release(self, offset: int, nbytes: int) -> None:
        """Tell the kernel the pages of this range are no longer needed (they leave the resident
        set; a later read simply faults them in again). Used once a backend has packed an op."""
        if self._mmap is None or nbytes <= 0 or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = int(offset) // mmap.PAGESIZE * mmap.PAGESIZE
        end = min(int(offset) + int(nbytes), self._size)
        if end > start:
            self._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)

    def close(self) -> None:
        """Drop the mapping; views already handed out keep their pages alive until they are freed."""
        self._bytes = None
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                # Views still export the buffer: the mapping is released when the last one is freed.
                pass
            self._mmap = None

    def __enter__(self) -> ExternalWeightFile:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self._size} bytes"
        return f"ExternalWeightFile({str(self.path)!r}, {state})"
