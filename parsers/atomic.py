"""Atomic, durable file operations and a file lock: what the data root's writers share.

* :func:`durable_replace`: ``os.replace`` with the file fsync'ed before and the folder after, so
  a power cut never leaves a name pointing at unwritten blocks (parsers.storage's Parquet and
  JSON writes go through it);
* :func:`replacing_dir`: build a folder's next version beside it and swap it in with renames (the task's value sequences, a model bundle): readers see the old folder or the
  new one, never a mix, and a failed or killed writer leaves the old one;
* :func:`file_lock`: an exclusive ``fcntl`` lock (parsers.storage.source_lock: one log ingest of
  a source at a time).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger(__name__)


def durable_replace(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """``os.replace(tmp, path)`` that survives a power cut: the temp file's data is flushed to
    disk first (fsync), and the folder after the rename, so the new name never points at a file
    whose blocks were not written (a rename is atomic for processes, not for the disk)."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    try:
        dir_fd = os.open(Path(path).parent, os.O_RDONLY)
    except OSError:  # a platform without directory handles (Windows): the rename is what it has
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextmanager
def replacing_dir(path: str | os.PathLike) -> Iterator[Path]:
    """``with replacing_dir(path) as out:`` -- write the next version of the folder ``path`` into
    ``out``, a fresh hidden folder beside it; when the block ends, ``out`` takes the place of
    ``path`` (the old folder renamed aside, the new one renamed in, the old one removed), so a
    reader sees the whole old folder or the whole new one, never a mix of their files. A block
    that raises removes ``out`` and leaves ``path`` as it was. Build folders that a killed writer
    left beside ``path`` are removed first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in [*path.parent.glob(f".{path.name}.building-*"), *path.parent.glob(f".{path.name}.old-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    built = Path(tempfile.mkdtemp(prefix=f".{path.name}.building-", dir=path.parent))
    try:
        yield built
    except BaseException:
        shutil.rmtree(built, ignore_errors=True)
        raise
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    if path.exists():
        os.replace(path, old)
    os.replace(built, path)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def file_lock(path: str | os.PathLike, holder: str = "another process") -> Iterator[None]:
    """Hold ``path`` exclusively (``fcntl.flock``; created when missing). When another process
    holds it, one warning says who (``holder``) and this waits. The lock goes with the process
    (a killed holder releases it). Where ``fcntl`` is missing (Windows) nothing is locked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.warning("%s holds %s: waiting for it to finish", holder, path)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
