"""Packed weights written once and memory-mapped by later loads (MNN's `use_mmap` with `tmp_path`).

A backend that makes its own layout of a weight at load (cpu's interleaved int4 codes, fp32
dequantized rows) asks its runtime's `weight_cache` (None unless `use_mmap` is true) for the
arrays of one op: `arrays(op_name, version, make)`. The first load calls `make()`, writes the
arrays beside and renames the file into place, then maps it; later loads map the file and never
pack. The pages are the file's: read once at load (by the checksum), shared by every process on
the machine, and the kernel may drop them under memory pressure (they are clean), so a second load
neither packs nor holds the packed weights in private memory.

Files live in `<tmp_path>/packed/<key>/` (tmp_path empty: `$MNNLLM_CACHE` or ~/.cache/mnnllm),
the key a hash of the model files' identity (file_identity.py), the backend's name and mnnllm's
version; each file's header repeats the op name and the backend's layout `version`, so a changed
model, mnnllm or layout never reuses a file. A file holds its magic, its JSON header's length, a
checksum (checksum.py) of every other byte, the header, then the arrays (aligned); the checksum
is checked when the file is mapped, before anything in it is believed (~0.08 s for the 918 MiB
of a 1.7B model's packs, ~3% of its warm load). A file whose checksum, header or size is wrong
is removed with a warning and the weights packed again.

A file is written beside and renamed into place, never rewritten where it lies, so a process
that maps it keeps valid pages whatever a later load writes. One truncated in place by something
else while mapped (`truncate`, a shell's `>`) kills the process that maps it with SIGBUS when it
touches a page past the new end: a shared mapping cannot be protected from that; clear the
cache by removing files (or the folder), never by writing into them. Nothing checks a file again
after it is mapped: an edit in place while mapped is seen by the running process (the next load
refuses the file).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from ...files import open_regular_file, written_beside
from ...version import __version__
from ..checksum import SIZE as CHECKSUM_SIZE, checksum
from ..runtime_hints import RuntimeHints

log = logging.getLogger(__name__)

MAGIC = b"MNNLLMP2"
ALIGN = 64
_PREFIX = struct.Struct("<8sI")  # magic, the JSON header's length; then the checksum, then the header
_START = _PREFIX.size + CHECKSUM_SIZE  # where the header starts


class _Rejected(Exception):
    pass


def default_folder() -> Path:
    return Path(os.environ.get("MNNLLM_CACHE") or Path.home() / ".cache" / "mnnllm")


class WeightCache:
    def __init__(self, folder: str | os.PathLike[str], key_parts: dict):
        key = hashlib.sha256(json.dumps(key_parts, sort_keys=True).encode()).hexdigest()[:16]
        self.folder = Path(folder) / "packed" / key
        self.hits = self.misses = 0

    @classmethod
    def from_hints(cls, hints: RuntimeHints | Mapping[str, Any], backend_name: str) -> "WeightCache | None":
        """The cache a runtime's hints ask for: `use_mmap` true and the model's identity known."""
        hints = RuntimeHints.of(hints)
        if not hints.use_mmap or not hints.model_identity:
            return None
        return cls(hints.tmp_path or default_folder(),
                   {"model": hints.model_identity, "backend": backend_name, "mnnllm": __version__})

    def arrays(self, name: str, version: str, make: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The arrays of op `name` in layout `version`: mapped from the file, else made, saved and mapped
        (never to be written). A write that fails (a full disk) is logged and the made arrays used."""
        path = self.folder / f"{hashlib.sha256(name.encode()).hexdigest()[:20]}.pw"
        if path.exists():
            try:
                mapped = _map(path, name, version)
                self.hits += 1
                return mapped
            except (_Rejected, OSError) as why:
                log.warning("packed-weight cache: not using %s (%s): %s; packing again", path, name, why)
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)
        self.misses += 1
        made = make()
        try:
            _write(path, name, version, made)
            return _map(path, name, version)
        except (OSError, _Rejected) as err:
            log.warning("packed-weight cache: cannot keep %s in %s: %s", name, path, err)
            return made


def _layout(arrays: dict[str, np.ndarray], start: int) -> tuple[list[dict], int]:
    entries, at = [], start
    for key, array in arrays.items():
        at = -(-at // ALIGN) * ALIGN
        entries.append({"key": key, "dtype": array.dtype.str, "shape": list(array.shape), "offset": at})
        at += array.nbytes
    return entries, at


def _write(path: Path, name: str, version: str, arrays: dict[str, np.ndarray]) -> None:
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    # the header's length depends on the offsets and they on it: grow the room it gets until it fits
    room, header = 256, b""
    while True:
        entries, size = _layout(arrays, _START + room)
        header = json.dumps({"name": name, "version": version, "arrays": entries, "size": size}).encode()
        if len(header) <= room:
            break
        room = 2 * len(header)
    prefix, body, at = _PREFIX.pack(MAGIC, len(header)), [header], _START + len(header)
    for entry, array in zip(entries, arrays.values()):
        body += [bytes(entry["offset"] - at), array.reshape(-1).view(np.uint8)]
        at = entry["offset"] + array.nbytes
    with written_beside(path) as f:
        f.write(prefix + checksum([prefix, *body]))
        for part in body:
            f.write(part)


def _map(path: Path, name: str, version: str) -> dict[str, np.ndarray]:
    with open_regular_file(path) as f:
        size = os.fstat(f.fileno()).st_size
        prefix = f.read(_START)
        if len(prefix) < _START or _PREFIX.unpack_from(prefix)[0] != MAGIC:
            raise _Rejected("not a packed-weight file")
        length = _PREFIX.unpack_from(prefix)[1]
        if length > size - _START:
            raise _Rejected(f"truncated: a {length}-byte header in a {size}-byte file")
        # copy-on-write: the arrays look writable (jit kernels compiled for writable arrays take them)
        # and nothing writes them, so every page stays the file's; plain ndarray views, not np.memmap,
        # so the kernels see the array types they were compiled for. Mapped from the file opened
        # here, so the bytes checked are the file's whatever is renamed over its path meanwhile.
        whole = np.memmap(f, np.uint8, mode="c", shape=(size,)).view(np.ndarray)
    # every byte but the stored checksum's, before any of them is believed
    if checksum([whole[:_PREFIX.size], whole[_START:]]) != whole[_PREFIX.size:_START].tobytes():
        raise _Rejected("corrupt: its bytes do not match their checksum")
    try:
        header = json.loads(whole[_START:_START + length].tobytes())
        entries = header["arrays"]
    except (ValueError, KeyError, TypeError) as err:
        raise _Rejected(f"a malformed header ({err})") from err
    if header.get("name") != name or header.get("version") != version:
        raise _Rejected(f"made for {header.get('name')!r} layout {header.get('version')!r}, "
                        f"wanted {name!r} layout {version!r}")
    if header.get("size") != size:
        raise _Rejected(f"truncated: {size} bytes, the header says {header.get('size')}")
    arrays = {}
    try:
        for entry in entries:
            dtype, shape = np.dtype(entry["dtype"]), tuple(entry["shape"])
            count = int(np.prod(shape, dtype=np.int64))
            start = entry["offset"]
            if start + count * dtype.itemsize > size:
                raise _Rejected(f"array {entry['key']} runs past the end of the file")
            arrays[entry["key"]] = whole[start:start + count * dtype.itemsize].view(dtype).reshape(shape)
    except (KeyError, TypeError, ValueError) as err:
        raise _Rejected(f"a malformed header ({err})") from err
    return arrays
