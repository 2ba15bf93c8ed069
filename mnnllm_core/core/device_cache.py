"""A device's compiled-code cache on disk (vulkan's VkPipelineCache data; the marker that the
opencl kernels were built on a device before), one file per backend and device identity.

The file is `<tmp_path>/<backend>/<digest of the device key>.<suffix>` (tmp_path empty:
`$MNNLLM_CACHE`, else ~/.cache/mnnllm: the folder of the tuning and packed-weight caches), the
device key naming the device, its driver and its API version, so another driver never reads it.
It holds a magic, a SHA-256 of the rest, the device key and the payload; it is written beside and
renamed into place. A file that is unreadable, of another device, or whose checksum is wrong
(cut short, edited) is ignored with a warning: the driver then compiles afresh and the file is
written again. The driver never sees bytes this module has not checked.
"""
from __future__ import annotations

import hashlib
import logging
import os
import struct
from pathlib import Path

from ..files import open_regular_file, written_beside
from .runtime_hints import RuntimeHints
from .weights.cache import default_folder

log = logging.getLogger(__name__)

MAGIC = b"MNNLLMDC"
_HEAD = struct.Struct("<8s32sI")  # magic, sha256 of what follows, the device key's length
MAX_BYTES = 256 << 20


class DeviceCache:
    def __init__(self, path: str | os.PathLike[str], device_key: str):
        self.path = Path(path)
        self.device_key = device_key

    @classmethod
    def for_device(cls, hints: RuntimeHints, backend: str, device_key: str, suffix: str) -> "DeviceCache":
        digest = hashlib.sha256(device_key.encode()).hexdigest()[:16]
        return cls(Path(hints.tmp_path or default_folder()) / backend / f"{digest}.{suffix}", device_key)

    def exists(self) -> bool:
        return self.path.is_file()

    def read(self) -> bytes | None:
        """The payload written for this device, None when there is none or it is not to be trusted."""
        try:
            with open_regular_file(self.path) as f:
                data = f.read(MAX_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as err:
            log.warning("device cache %s cannot be read (%s): ignored", self.path, err)
            return None
        try:
            if len(data) > MAX_BYTES or len(data) < _HEAD.size:
                raise ValueError(f"{len(data)} bytes")
            magic, digest, key_length = _HEAD.unpack_from(data)
            if magic != MAGIC:
                raise ValueError("not a device cache file")
            if hashlib.sha256(data[_HEAD.size:]).digest() != digest:
                raise ValueError("its checksum does not match: cut short or changed")
            key = data[_HEAD.size:_HEAD.size + key_length].decode("utf-8")
            if key != self.device_key:
                raise ValueError(f"written for another device or driver ({key})")
        except (ValueError, UnicodeDecodeError, struct.error) as err:
            log.warning("device cache %s is ignored (%s): compiling afresh", self.path, err)
            return None
        return data[_HEAD.size + key_length:]

    def write(self, payload: bytes) -> None:
        """Keep `payload` for the next process; a failed write is only logged."""
        key = self.device_key.encode()
        body = key + bytes(payload)
        try:
            with written_beside(self.path) as f:
                f.write(_HEAD.pack(MAGIC, hashlib.sha256(body).digest(), len(key)) + body)
        except OSError as err:
            log.warning("device cache %s cannot be written (%s): the next process compiles again", self.path, err)
