"""Read and verify MNN's `Net` flatbuffer (llm.mnn) into the object API.

The Python flatbuffers runtime trusts its input: a bad offset either raises
some arbitrary exception deep in generated code or silently reads garbage.
MNN's C++ loader runs `VerifyNetBuffer` first; `verify_net_buffer` is the
same idea here, a bounds-checking walk of every table, vector, string and
union reachable from the root. It is driven by `mnn.fbs` itself (parsed
once), so the schema stays the single source of truth.

Work is bounded: the walk only follows offsets, depth is capped at 64 like
flatbuffers' C++ verifier, and the number of objects visited is capped by
what the buffer could hold without shared sub-objects (one 4-byte offset
per visit), so a crafted DAG of shared tables cannot blow up the walk or the
unpack that follows it.
"""
from __future__ import annotations

import dataclasses
import importlib.resources
import logging
import re
import struct
from functools import lru_cache

from mnnllm_core.errors import FormatError
from mnnllm_core.files import GRAPH_LIMIT, read_bounded
from mnnllm_core.schema.MNN.Net import Net, NetT
from mnnllm_core.schema.MNN.OpParameter import OpParameter
from mnnllm_core.schema.MNN.OpType import OpType

__all__ = ["read_net", "read_net_file", "verify_net_buffer", "op_type_name", "op_param_name", "MAX_DEPTH"]

logger = logging.getLogger(__name__)

MAX_DEPTH = 64
_MIN_SIZE = 12  # root offset + table soffset + the smallest vtable

_SCALAR_SIZES = {
    "bool": 1, "byte": 1, "ubyte": 1, "int8": 1, "uint8": 1,
    "short": 2, "ushort": 2, "int16": 2, "uint16": 2,
    "int": 4, "uint": 4, "int32": 4, "uint32": 4, "float": 4, "float32": 4,
    "long": 8, "ulong": 8, "int64": 8, "uint64": 8, "double": 8, "float64": 8,
}

_U16 = struct.Struct("<H").unpack_from
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from


# ---------------------------------------------------------------------------
# the schema, as the verifier needs it
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Field:
    """One field of a table: where its slot is and what it points at."""

    name: str
    id: int
    kind: str  # "scalar" | "string" | "table" | "union" | "vector"
    size: int = 0  # scalar size; for vectors of scalars, the element size
    ref: str = ""  # table or union name; for vectors, the element's table
    elem: str = ""  # for vectors: "scalar" | "string" | "table"
    type: str = ""  # the type as written in mnn.fbs, e.g. "DataType", "[int]"


@dataclasses.dataclass(frozen=True)
class _Schema:
    """Tables (fields sorted by id) and unions (member table by type value)."""

    tables: dict[str, tuple[_Field, ...]]
    unions: dict[str, dict[int, str]]
    root: str


_COMMENT = re.compile(r"//[^\n]*")
_BLOCK = re.compile(r"\b(table|struct|enum|union)\s+(\w+)\s*(?::\s*(\w+))?\s*\{([^}]*)\}")
_FIELD = re.compile(
    r"^\s*(\w+)\s*:\s*(\[?\s*\w+\s*\]?)\s*(?:=\s*[^()]*?)?\s*(?:\(([^)]*)\))?\s*$")


def _parse_fbs(text: str) -> _Schema:
    """Parse the subset of the .fbs grammar that mnn.fbs uses."""
    text = _COMMENT.sub("", text)
    enums: dict[str, int] = {}
    unions: dict[str, dict[int, str]] = {}
    raw_tables: dict[str, str] = {}
    for kind, name, base, body in _BLOCK.findall(text):
        if kind == "enum":
            enums[name] = _SCALAR_SIZES[base]
        elif kind == "union":
            unions[name] = _union_members(body)
        elif kind == "table":
            raw_tables[name] = body
        else:
            raise ValueError(f"mnn.fbs: structs are not supported ({name})")
    tables: dict[str, tuple[_Field, ...]] = {}
    for name, body in raw_tables.items():
        fields = []
        for decl in body.split(";"):
            if not decl.strip():
                continue
            m = _FIELD.match(decl)
            if m is None:
                raise ValueError(f"mnn.fbs: cannot parse field {decl.strip()!r} in {name}")
            fname, ftype, attrs = m.group(1), m.group(2).replace(" ", ""), m.group(3) or ""
            fid = re.search(r"\bid\s*:\s*(\d+)", attrs)
            if fid is None:
                raise ValueError(f"mnn.fbs: {name}.{fname} has no explicit id")
            if "deprecated" in attrs:
                continue
            field = _make_field(fname, int(fid.group(1)), ftype, enums, unions, raw_tables)
            fields.append(dataclasses.replace(field, type=ftype))
        tables[name] = tuple(sorted(fields, key=lambda f: f.id))
    root = re.search(r"\broot_type\s+(\w+)\s*;", text)
    if root is None:
        raise ValueError("mnn.fbs: no root_type")
    return _Schema(tables, unions, root.group(1))


def _union_members(body: str) -> dict[int, str]:
    """Type value -> member: `A = 4` says its value, a bare member follows the previous one."""
    members, value = {}, 0
    for item in (m.strip() for m in body.split(",")):
        if not item:
            continue
        member, _, number = (part.strip() for part in item.partition("="))
        value = int(number) if number else value + 1
        members[value] = member
    return members


def _make_field(name: str, fid: int, ftype: str, enums: dict[str, int],
                unions: dict[str, dict[int, str]], tables: dict[str, str]) -> _Field:
    if ftype.startswith("["):
        inner = ftype[1:-1]
        if inner == "string":
            return _Field(name, fid, "vector", elem="string")
        if inner in tables:
            return _Field(name, fid, "vector", elem="table", ref=inner)
        size = _SCALAR_SIZES.get(inner) or enums.get(inner)
        if size is None:
            raise ValueError(f"mnn.fbs: unknown vector element type {inner} of {name}")
        return _Field(name, fid, "vector", elem="scalar", size=size)
    if ftype == "string":
        return _Field(name, fid, "string")
    if ftype in tables:
        return _Field(name, fid, "table", ref=ftype)
    if ftype in unions:
        return _Field(name, fid, "union", ref=ftype)
    size = _SCALAR_SIZES.get(ftype) or enums.get(ftype)
    if size is None:
        raise ValueError(f"mnn.fbs: unknown type {ftype} of {name}")
    return _Field(name, fid, "scalar", size=size)


@lru_cache(maxsize=1)
def _schema() -> _Schema:
    text = importlib.resources.files("mnnllm_core.schema").joinpath("mnn.fbs").read_text("utf-8")
    return _parse_fbs(text)


# ---------------------------------------------------------------------------
# the verifier
# ---------------------------------------------------------------------------

class _Fail(Exception):
    """Internal: carries the message; the path is attached on the way out."""


class _Verifier:
    """Walks one buffer; `path` names where it is, for the error message."""

    def __init__(self, buf: memoryview, schema: _Schema):
        self.buf = buf
        self.size = len(buf)
        self.schema = schema
        self.path: list[str] = []
        self.budget = self.size // 4 + 16

    def where(self) -> str:
        """The field path, e.g. "Net.oplists[12].main<Convolution2D>.common"."""
        return "".join(p if p.startswith("[") or i == 0 else "." + p for i, p in enumerate(self.path))

    def _visit(self) -> None:
        self.budget -= 1
        if self.budget < 0:
            raise _Fail("more objects reachable than the buffer can hold (shared or cyclic offsets)")

    def _in(self, pos: int, length: int, what: str) -> None:
        if pos < 0 or pos + length > self.size:
            raise _Fail(f"{what} at {pos}..{pos + length} runs past the end of the buffer ({self.size} bytes)")

    def _deref(self, pos: int, what: str) -> int:
        """Follow the uoffset stored at pos, as flatbuffers' VerifyOffset does."""
        self._in(pos, 4, f"offset to {what}")
        off = _U32(self.buf, pos)[0]
        if off == 0 or off >= 0x80000000:
            raise _Fail(f"bad offset {off} to {what} at {pos}")
        target = pos + off
        self._in(target, 1, what)
        return target

    def table(self, pos: int, name: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise _Fail(f"nesting deeper than {MAX_DEPTH}")
        self._visit()
        buf = self.buf
        self._in(pos, 4, f"table {name}")
        vt = pos - _I32(buf, pos)[0]
        self._in(vt, 2, f"vtable of {name}")
        vt_size = _U16(buf, vt)[0]
        if vt_size & 1:
            raise _Fail(f"vtable of {name} has an odd size {vt_size}")
        self._in(vt, vt_size, f"vtable of {name}")
        # As in flatbuffers' C++ verifier, a vtable shorter than 4 bytes just
        # has no fields, and each field is checked on its own, not against
        # the table size.
        slots = max(vt_size - 4, 0) // 2
        for field in self.schema.tables[name]:
            if field.id >= slots:
                break
            voff = _U16(buf, vt + 4 + 2 * field.id)[0]
            if voff == 0:
                continue
            self.path.append(field.name)
            self.field(pos, pos + voff, vt, slots, field, depth)
            self.path.pop()

    def field(self, table: int, at: int, vt: int, slots: int, field: _Field, depth: int) -> None:
        kind = field.kind
        if kind == "scalar":
            self._in(at, field.size, "scalar")
        elif kind == "string":
            self.string(self._deref(at, "string"))
        elif kind == "table":
            self.table(self._deref(at, field.ref), field.ref, depth + 1)
        elif kind == "vector":
            self.vector(self._deref(at, "vector"), field, depth)
        else:
            self.union(table, at, vt, slots, field, depth)

    def string(self, pos: int) -> None:
        self._visit()
        self._in(pos, 4, "string length")
        n = _U32(self.buf, pos)[0]
        self._in(pos + 4, n + 1, "string")
        if self.buf[pos + 4 + n] != 0:
            raise _Fail(f"string at {pos} is not zero-terminated")

    def vector(self, pos: int, field: _Field, depth: int) -> None:
        self._visit()
        self._in(pos, 4, "vector length")
        n = _U32(self.buf, pos)[0]
        elem = field.elem
        self._in(pos + 4, n * (field.size if elem == "scalar" else 4), "vector")
        if elem == "scalar":
            return
        start = pos + 4
        for i in range(n):
            self.path.append(f"[{i}]")
            slot = start + 4 * i
            if elem == "string":
                self.string(self._deref(slot, "string"))
            else:
                self.table(self._deref(slot, field.ref), field.ref, depth + 1)
            self.path.pop()

    def union(self, table: int, at: int, vt: int, slots: int, field: _Field, depth: int) -> None:
        # The union's type byte sits in the slot just before its value.
        tid = field.id - 1
        voff = _U16(self.buf, vt + 4 + 2 * tid)[0] if tid < slots else 0
        utype = 0
        if voff:
            self._in(table + voff, 1, "union type")
            utype = self.buf[table + voff]
        members = self.schema.unions[field.ref]
        if utype == 0:
            return
        name = members.get(utype)
        if name is None:
            # A member this schema leaves out (or a newer one): MNN's C++ verifier accepts
            # unknown members for forward compatibility; the unpacked value is simply None.
            logger.debug("%s: %s member %d left unread", self.where(), field.ref, utype)
            return
        self.path[-1] = f"{field.name}<{name}>"
        self.table(self._deref(at, name), name, depth + 1)


def verify_net_buffer(data: bytes | bytearray | memoryview, path: str = "<memory>") -> memoryview:
    """Check that every offset reachable from the root `Net` stays in bounds.

    Mirrors MNN's `VerifyNetBuffer`; returns the buffer as a flat byte view.
    Raises FormatError naming the file and the field path that is wrong.
    """
    try:
        buf = memoryview(data).cast("B")
    except TypeError as e:
        raise FormatError(f"not a byte buffer: {e}", file=path) from e
    if len(buf) < _MIN_SIZE:
        raise FormatError(f"file too small to be an MNN model ({len(buf)} bytes)", file=path)
    schema = _schema()
    v = _Verifier(buf, schema)
    v.path.append(schema.root)
    try:
        v.table(v._deref(0, schema.root), schema.root, 0)
    except _Fail as e:
        raise FormatError(f"corrupt MNN model: {e}", file=path, field=v.where()) from None
    return buf


def read_net(data: bytes | bytearray | memoryview, path: str = "<memory>") -> NetT:
    """Verify an llm.mnn buffer and unpack it into the object API (`NetT`).

    Strings come back as str; scalar vectors as numpy arrays (int64 for
    `external`). Only FormatError is raised for bad input.
    """
    buf = verify_net_buffer(data, path)
    try:
        return NetT.InitFromObj(Net.GetRootAs(buf, 0))
    except (struct.error, IndexError, ValueError, OverflowError) as e:
        # The verifier should make this unreachable; keep the promise anyway.
        raise FormatError(f"corrupt MNN model: {e}", file=path, field="Net") from e


# ---------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------

def _names(enum_class: type) -> dict[int, str]:
    return {v: k for k, v in vars(enum_class).items() if not k.startswith("_") and isinstance(v, int)}


_OP_TYPE_NAMES = _names(OpType)
_OP_PARAM_NAMES = _names(OpParameter)


def op_type_name(op_type: int) -> str:
    """MNN's name of an OpType value (e.g. 306 -> "RoPE")."""
    return _OP_TYPE_NAMES.get(op_type, f"OpType({op_type})")


def op_param_name(main_type: int) -> str:
    """MNN's name of an OpParameter union member (e.g. 98 -> "AttentionParam")."""
    return _OP_PARAM_NAMES.get(main_type, f"OpParameter({main_type})")


def read_net_file(path: str) -> NetT:
    """read_net of a file; an unreadable file is a FormatError naming it."""
    return read_net(read_bounded(path, GRAPH_LIMIT, FormatError, "model graph"), str(path))
