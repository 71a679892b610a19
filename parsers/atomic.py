"""Atomic, durable file operations and a file lock: what the data root's writers share.

* :func:`durable_replace`: ``os.replace`` with the file fsync'ed before and the folder after, so
  a power cut never leaves a name pointing at unwritten blocks (parsers.storage's Parquet and
  JSON writes go through it);
* :func:`replacing_dir`: build a folder's next version beside it and swap it in with renames (the task's value sequences, a model bundle): readers see the old folder or the
  new one, never a mix, and a failed or killed writer leaves the old one;
* :func:`write_version`: write a folder as a new numbered version that is never changed again,
  and point a symbolic link at it in one rename (a model bundle): a reader that resolves the link
  once reads one version throughout, whatever is saved meanwhile;
* :func:`file_lock`: an exclusive ``fcntl`` lock (parsers.storage.source_lock: one log ingest of
  a source at a time).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
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
    _fsync_dir(Path(path).parent)


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


KEEP_VERSIONS = 5  # versions write_version keeps (the newest); older ones are removed


def versions_dir(path: str | os.PathLike) -> Path:
    """Where :func:`write_version` keeps the versions of ``path``: ``<path>.versions`` beside it."""
    path = Path(path)
    return path.with_name(path.name + ".versions")


def write_version(path: str | os.PathLike, write: Callable[[Path], None], keep: int = KEEP_VERSIONS) -> Path:
    """Save the next version of the folder ``path`` and return it.

    ``write(folder)`` fills a fresh build folder; it then becomes ``<path>.versions/<n>`` (``n``
    one more than the highest so far) and ``path`` becomes a relative symbolic link to it, swapped
    in by a rename. A version's folder is never written again: a reader that resolves ``path``
    once (``os.path.realpath``, as training.serving.scoring.load_bundle does) reads every file from the
    same version even while newer ones are saved. The ``keep`` newest versions stay (and always
    the one ``path`` names); older ones are removed. A ``write`` that raises leaves ``path`` as it
    was. A real folder at ``path`` (an older layout) becomes a version first. Needs symbolic links
    (POSIX; the product's containers)."""
    path = Path(path)
    versions = versions_dir(path)
    versions.mkdir(parents=True, exist_ok=True)
    for stale in versions.glob(".building-*"):  # left by a killed writer
        shutil.rmtree(stale, ignore_errors=True)
    built = Path(tempfile.mkdtemp(prefix=".building-", dir=versions))
    try:
        write(built)
    except BaseException:
        shutil.rmtree(built, ignore_errors=True)
        raise
    if path.is_dir() and not path.is_symlink():  # the unversioned layout: keep it as a version
        _rename_as_next(path, versions)
    final = _rename_as_next(built, versions)
    link = path.with_name(f".{path.name}.link-{os.getpid()}")
    link.unlink(missing_ok=True)
    os.symlink(f"{versions.name}/{final.name}", link)
    os.replace(link, path)
    _fsync_dir(path.parent)
    numbered = sorted((int(p.name) for p in versions.iterdir() if p.name.isdigit()), reverse=True)
    for n in numbered[keep:]:
        if n != int(final.name):
            shutil.rmtree(versions / str(n), ignore_errors=True)
    return final


def _rename_as_next(folder: Path, versions: Path) -> Path:
    """Rename ``folder`` to the next free number under ``versions`` (two writers never share one:
    a rename onto a non-empty folder fails, and the next number is tried)."""
    n = max((int(p.name) for p in versions.iterdir() if p.name.isdigit()), default=0) + 1
    while True:
        target = versions / str(n)
        try:
            os.rename(folder, target)
            return target
        except OSError:
            if not target.exists():
                raise
            n += 1


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a platform without directory handles (Windows): the rename is what it has
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
