"""Reading the files a config names: each must be a regular file no larger than its kind can
be. A config can name anything (`/dev/zero`, a FIFO, a folder, /etc/passwd), so a read never
blocks, never grows past its bound, and its errors never quote the file's bytes. And writing the
project's own files: beside, then renamed into place (`written_beside`)."""
from __future__ import annotations

import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from .errors import MnnllmError

MiB = 1 << 20
CONFIG_LIMIT = 16 * MiB  # config.json, llm_config.json, context.json, tokenizer_config.json
TOKENIZER_LIMIT = 512 * MiB  # a 250k-token tokenizer.json is ~20 MiB
GRAPH_LIMIT = 2 * 1024 * MiB  # a flatbuffer cannot be larger


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


class NotRegularFile(OSError):
    """A path naming a folder, FIFO, device or socket where a regular file was wanted."""


def open_regular_file(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` opened for reading if it is a regular file, else NotRegularFile; opening never
    waits on a FIFO. For the project's own cache files, whose callers turn an OSError into a
    refusal; `open_regular` is the form with the project's typed errors."""
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(f"not a regular file: {_kind(mode)}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def open_regular(path: str | os.PathLike[str], error: type[MnnllmError], what: str,
                 field: str | None = None) -> BinaryIO:
    """`path` opened for reading when it is a regular file, else `error` naming it."""
    name = os.fspath(path)
    try:
        return open_regular_file(name)
    except NotRegularFile as exc:
        raise error(f"the {what} must be a regular file, this is {str(exc).split(': ', 1)[1]}", file=name,
                    field=field) from None
    except OSError as exc:
        raise error(f"cannot read the {what} (cannot open it: {exc.strerror or exc})", file=name,
                    field=field) from None
    except ValueError:  # a NUL byte, or a lone surrogate the file system cannot encode
        raise error(f"cannot read the {what}: the path is not a valid file name", file=name, field=field) from None


def read_bounded(path: str | os.PathLike[str], limit: int, error: type[MnnllmError], what: str,
                 field: str | None = None) -> bytes:
    """The whole of a regular file of at most `limit` bytes, else `error` naming it."""
    with open_regular(path, error, what, field) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(size + 1) if size <= limit else b""  # read(n) allocates n bytes first
        while size <= limit and len(data) > size and len(data) <= limit:  # it grew while being read
            more = f.read(min(MiB, limit + 1 - len(data)))
            if not more:
                break
            data += more
    if size > limit or len(data) > limit:
        raise error(f"the {what} is {max(size, len(data))} bytes, more than a {what} can be ({limit})",
                    file=os.fspath(path), field=field)
    return data


@contextmanager
def written_beside(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A new file beside `path` (its folder made if need be) to write into; renamed over `path`
    when the block ends, removed if it raises. A reader never sees a half-written file, and a
    write cut short (an error, Ctrl-C, a full disk) never replaces a good one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(staging, target)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
