"""Bounds-checked readers for MNN's tokenizer files: the text header and the binary `.mtok` body.

Every read names the field it is for, so a truncated or corrupt file fails with a
`TokenizerError` that says where, instead of an IndexError or a huge allocation.
"""
from __future__ import annotations

import base64
import binascii
import enum
import struct
from dataclasses import dataclass

import numpy as np

from mnnllm_core.errors import TokenizerError

from .base import SpecialIds

MAGIC_NUMBER = 430


class TokenizerType(enum.IntEnum):
    """The type after the magic number (MNN's `Tokenizer::TokenizerType`)."""

    SENTENCEPIECE = 0
    TIKTOKEN = 1
    BERT = 2
    HUGGINGFACE = 3
    PIPELINE = 4


@dataclass
class Header:
    """The three text lines every MNN tokenizer file starts with."""

    type: TokenizerType
    ids: SpecialIds
    body_offset: int


class TextLines:
    """Reads a text body line by line, naming the field of a missing or malformed line."""

    def __init__(self, data: bytes, offset: int, file: str) -> None:
        self.data = data
        self.pos = offset
        self.file = file

    def line(self, field: str) -> bytes:
        if self.pos >= len(self.data):
            raise TokenizerError("file ends before this line", file=self.file, field=field)
        end = self.data.find(b"\n", self.pos)
        end = len(self.data) if end < 0 else end
        text = self.data[self.pos:end]
        self.pos = end + 1
        return text.rstrip(b"\r")

    def ints(self, field: str, count: int | None = None) -> list[int]:
        """A line of whitespace-separated integers (exactly `count` when given)."""
        parts = self.line(field).split()
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise TokenizerError(f"expected a line of integers ({len(parts)} words)", file=self.file,
                                 field=field) from None
        if count is not None and len(values) != count:
            raise TokenizerError(f"expected {count} integers, got {len(values)}", file=self.file, field=field)
        return values

    def base64(self, field: str) -> bytes:
        """A line holding one base64 token."""
        return decode_base64(self.line(field), self.file, field)

    def count(self, field: str, min_line_bytes: int = 1) -> int:
        """A line holding one entry count; refuses counts the rest of the file cannot hold."""
        (value,) = self.ints(field, 1)
        if value < 0 or value * min_line_bytes > len(self.data) - self.pos:
            raise TokenizerError(f"count {value} does not fit in the file", file=self.file, field=field)
        return value


def decode_base64(text: bytes, file: str, field: str) -> bytes:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except binascii.Error as exc:
        raise TokenizerError(f"invalid base64: {exc}", file=file, field=field) from None


def read_header(data: bytes, file: str) -> Header:
    """Parse `430 <type>`, `<special> <stop> <prefix>` and the id line (MNN's `load_special`)."""
    lines = TextLines(data, 0, file)
    head = lines.line("magic").split()
    try:
        magic = int(head[0]) if head else None
    except ValueError:
        magic = None
    if magic != MAGIC_NUMBER:
        raise TokenizerError(f"not an MNN tokenizer: it does not start with the magic number {MAGIC_NUMBER}",
                             file=file, field="magic")
    try:
        kind = TokenizerType(int(head[1]))
    except (IndexError, ValueError):
        raise TokenizerError("unknown tokenizer type (MNN knows 0-4)", file=file, field="type") from None
    special_num, stop_num, prefix_num = lines.ints("counts", 3)
    if min(special_num, stop_num, prefix_num) < 0:
        raise TokenizerError("negative id count", file=file, field="counts")
    total = special_num + stop_num + prefix_num
    values = lines.ints("special_ids", total)
    ids = SpecialIds(special=values[:special_num], stop=values[special_num:special_num + stop_num],
                     prefix=values[special_num + stop_num:])
    return Header(kind, ids, lines.pos)


class BinaryReader:
    """Little-endian reads from the `.mtok` body with a bounds check on each."""

    def __init__(self, data: bytes, offset: int, file: str) -> None:
        self.data = data
        self.pos = offset
        self.file = file

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def _take(self, size: int, field: str) -> int:
        if size > self.remaining:
            raise TokenizerError(f"file ends: needs {size} bytes, {self.remaining} left", file=self.file,
                                 field=field)
        start = self.pos
        self.pos += size
        return start

    def u8(self, field: str) -> int:
        return self.data[self._take(1, field)]

    def u16(self, field: str) -> int:
        return struct.unpack_from("<H", self.data, self._take(2, field))[0]

    def u32(self, field: str) -> int:
        return struct.unpack_from("<I", self.data, self._take(4, field))[0]

    def raw(self, size: int, field: str) -> bytes:
        start = self._take(size, field)
        return self.data[start:start + size]

    def string(self, field: str) -> str:
        """A u16-length-prefixed UTF-8 string."""
        raw = self.raw(self.u16(field), field)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TokenizerError(f"invalid UTF-8: {exc}", file=self.file, field=field) from None

    def count(self, field: str, min_entry_bytes: int) -> int:
        """A u32 entry count, refused when the rest of the file cannot hold that many entries."""
        value = self.u32(field)
        if value * min_entry_bytes > self.remaining:
            raise TokenizerError(f"count {value} does not fit in the {self.remaining} bytes left",
                                 file=self.file, field=field)
        return value

    def u32_table(self, rows: int, cols: int, field: str) -> np.ndarray:
        """`rows` x `cols` little-endian uint32 values, read in one go."""
        start = self._take(rows * cols * 4, field)
        return np.frombuffer(self.data, dtype="<u4", count=rows * cols, offset=start).reshape(rows, cols)
