"""A short fingerprint of model files, for caches that must never outlive the files they came from.

Per file: its size, its modification time (ns) and a sha256 of its first and last MiB, so a
re-exported, edited, truncated or replaced model gets a new identity without hashing gigabytes.
A missing file counts as absent (an optional embeddings file), not as an error.
"""
from __future__ import annotations

import hashlib
import os
from typing import Iterable

EDGE = 1 << 20  # bytes hashed at each end of a file


def file_identity(paths: Iterable[str | os.PathLike[str]]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(b"|")
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            digest.update(b"absent")
            continue
        digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
        with open(path, "rb") as f:
            digest.update(f.read(EDGE))
            if stat.st_size > EDGE:
                f.seek(max(EDGE, stat.st_size - EDGE))
                digest.update(f.read(EDGE))
    return digest.hexdigest()
