"""A short fingerprint of model files, for caches that must never outlive the files they came from.

Per file: its size, its modification and status-change times (ns), its inode number and a sha256
of its first and last MiB, so a re-exported, edited, truncated or replaced model gets a new
identity without reading gigabytes (hashing a whole weight file would read all of it at every
load, from disk when it is not in the page cache). The status-change time (ctime) is what a plain
edit cannot keep: writing a file, or putting its mtime back with `touch`/`os.utime`, sets it
to now, and a file replaced by another has another inode. What is not caught: an edit that keeps
size, mtime, ctime and inode (the system clock set back, the disk written underneath the file
system), or a file system that does not keep ctime. A chmod, chown or new hard link changes
ctime too: the caches are then made again, needlessly but safely.
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
        digest.update(f"{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ctime_ns}:{stat.st_ino}".encode())
        with open(path, "rb") as f:
            digest.update(f.read(EDGE))
            if stat.st_size > EDGE:
                f.seek(max(EDGE, stat.st_size - EDGE))
                digest.update(f.read(EDGE))
    return digest.hexdigest()
