"""Model folders are written beside their destination, then renamed into place.

A reader (or a crash) never sees half a model at the destination: the files go into a hidden
temporary sibling (`.NAME-xxxx`, on the same file system, so the rename is atomic), and only a
finished folder is renamed to NAME. An existing folder is replaced whole: moved aside in one
rename, then removed. The staging folders an export killed with SIGKILL leaves behind are removed
by the next export beside the same destination.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from mnnllm_core.errors import ConfigError

logger = logging.getLogger(__name__)


def check_destination(target: Path, force: bool) -> None:
    """Refuse a destination that holds something, unless `force` (then it will be replaced)."""
    if target.exists() and not target.is_dir():
        raise ConfigError("the export destination is a file, not a folder", file=str(target), field="dst")
    if not force and target.is_dir() and any(target.iterdir()):
        raise ConfigError("the export destination is not empty; pass --force (force=True) to replace it",
                          file=str(target), field="dst")


def check_apart(target: Path, inputs: dict[str, str | os.PathLike[str]]) -> None:
    """Refuse a destination that is one of the export's inputs (argument name -> path), lies inside
    one, or holds one: replacing it would delete what is being read. Symlinks are resolved."""
    dst = target.resolve()
    for argument, path in inputs.items():
        src = Path(path).resolve()
        if dst == src or dst.is_relative_to(src) or src.is_relative_to(dst):
            where = "is" if dst == src else "lies inside" if dst.is_relative_to(src) else "holds"
            raise ConfigError(f"the export destination {where} the {argument} {str(path)!r}, which the export would "
                              f"delete; choose a folder apart from it", file=str(target), field="dst")


def remove_orphaned_staging(target: Path) -> None:
    """Remove what exports to `target` that were killed left beside it (see `orphaned_staging`)."""
    for orphan in orphaned_staging(target):
        logger.info("removing %s, left by an export that was killed", orphan)
        shutil.rmtree(orphan, ignore_errors=True)


@contextlib.contextmanager
def staging_folder(target: Path) -> Iterator[Path]:
    """A new empty sibling of `target` to write into (its name holds this process's id, see
    `orphaned_staging`); removed on exit unless renamed away. A file-system error names `target`,
    the folder the user asked for, not the hidden sibling."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-{os.getpid()}-", dir=target.parent))
    except OSError as err:
        raise ConfigError(f"cannot create the export destination: {err.strerror or err}", file=str(target),
                          field="dst") from None
    os.chmod(tmp, 0o755)  # mkdtemp makes it private to this user; a model folder is not
    try:
        yield tmp
    except OSError as err:
        inside = err.filename and Path(os.fsdecode(err.filename)).is_relative_to(tmp)
        if not inside:
            raise
        name = Path(os.fsdecode(err.filename)).relative_to(tmp)
        raise ConfigError(f"cannot write {name} of the export destination: {err.strerror or err}",
                          file=str(target), field="dst") from err
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def orphaned_staging(target: Path) -> list[Path]:
    """Staging folders of `target` (and folders moved aside) whose process has ended: what a
    `kill -9` during an export leaves behind. A folder of a process still running is kept."""
    if not target.parent.is_dir():
        return []
    # `staging_folder`'s names (mkdtemp adds 8 characters), and `replace_folder`'s "-old"; not another
    # destination's, such as `.NAME-2-...` of NAME-2
    ours = re.compile(rf"\.{re.escape(target.name)}-(\d+)-[a-z0-9_]{{8}}(-old)?")
    orphans = []
    for path in target.parent.iterdir():
        match = ours.fullmatch(path.name)
        if match and path.is_dir() and not _alive(int(match.group(1))):
            orphans.append(path)
    return orphans


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def replace_folder(finished: Path, target: Path) -> None:
    """Rename `finished` to `target`; an existing `target` is moved aside first, then removed.

    Raises OSError when another process puts a folder at `target` between the two renames.
    """
    aside = finished.with_name(finished.name + "-old")
    if target.exists():
        os.replace(target, aside)
    try:
        os.replace(finished, target)
    except OSError:
        if aside.exists() and not target.exists():  # put the old folder back
            os.replace(aside, target)
        raise
    finally:
        if aside.exists():
            shutil.rmtree(aside, ignore_errors=True)
