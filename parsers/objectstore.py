"""A data root on an S3-compatible object store: ``s3://bucket/prefix`` wherever a local path is taken.

:func:`as_path` resolves a root (or any location under it) once: a local path stays a
:class:`pathlib.Path`; ``s3://bucket/key`` becomes an :class:`S3Path`, a small pathlib-like object
with the operations the data root's writers and readers use (``/``, ``name``, ``parent``,
``with_name``, ``exists``, ``is_dir``, ``glob`` / ``rglob``, ``read_bytes``, ``write_bytes``,
``unlink``, ``stat``, ``upload``), so parsers.storage and the ingests run unchanged on both. An
S3Path has no ``__fspath__``: code that would open it as a local file fails loudly instead of
writing a folder called ``s3:``.

Credentials and the endpoint come from the standard AWS environment (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``), read by boto3 here and
by polars (its native ``s3://`` reader, parsers.storage.scan_objects), so any S3-compatible store
serves (AWS, MinIO, moto's server in the tests).

Atomicity: an object PUT (one request, or a multipart upload completed in one request) is atomic
for readers -- they see the old object or the new one -- so a Parquet part is written to a local
temp file and uploaded over its key; no temp object is ever visible under the root.

Mutual exclusion without flock: :func:`lease` holds ``<key>`` as a *lease object* created with a
conditional write (``If-None-Match: *``; S3 answers 412 to the second creator). The object says
who holds it and until when (``expires``, epoch seconds, ``ttl_s`` ahead); the holder renews it
every ``ttl_s / 3`` with ``If-Match: <its ETag>`` and deletes it (``If-Match``) when done. A
waiter that finds an expired lease (a killed holder) takes it over with ``If-Match`` on the ETag
it read, so of several waiters exactly one wins. Clocks: expiry is compared with the waiter's
clock; keep ``ttl_s`` well above any clock skew between workers (the default, 300 s, is).
A holder that finds its lease taken (it could not renew in time) raises :class:`LeaseLost` when
its block ends. Needs a store with conditional writes (AWS S3 since 2024, MinIO, moto).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

logger = logging.getLogger(__name__)

SCHEME = "s3://"
LEASE_TTL_S = 300.0  # a lease not renewed for this long is taken over (a killed holder)
_CLIENT_LOCK = threading.Lock()
_CLIENTS: dict[tuple, object] = {}


class ObjectStoreError(ValueError):
    """The object store cannot be used as given (no credentials, no endpoint, no bucket): a user's
    fix, one line (the CLI prints ValueErrors so)."""


class LeaseLost(RuntimeError):
    """Another holder took over a lease this process held (it was not renewed within its TTL)."""


def is_remote(location) -> bool:
    """True for ``s3://...`` (a string or an :class:`S3Path`)."""
    return isinstance(location, S3Path) or (isinstance(location, str) and location.startswith(SCHEME))


def as_path(location) -> Path | S3Path:
    """``s3://bucket/key`` -> :class:`S3Path`; anything else -> ``Path`` (as the local code always did)."""
    if isinstance(location, S3Path):
        return location
    if isinstance(location, str) and location.startswith(SCHEME):
        return S3Path(location)
    return Path(location)


def client():
    """A boto3 S3 client for the current AWS environment (one per endpoint, region and key id)."""
    import boto3

    key = tuple(os.environ.get(v) for v in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION",
                                            "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"))
    with _CLIENT_LOCK:
        if key not in _CLIENTS:
            _CLIENTS[key] = boto3.session.Session().client("s3")
        return _CLIENTS[key]


def _error_code(err) -> str:
    return str(getattr(err, "response", {}).get("Error", {}).get("Code", ""))


def _missing(err) -> bool:
    return _error_code(err) in ("404", "NoSuchKey", "NotFound")


class S3Path:
    """``s3://bucket/key``: the pathlib operations the data root needs, over boto3 (see the module
    docstring). Folders do not exist on S3: a "folder" exists while a key lies under it."""

    __slots__ = ("bucket", "key")

    def __init__(self, uri: str):
        if not uri.startswith(SCHEME):
            raise ObjectStoreError(f"not an s3:// URI: {uri!r}")
        bucket, _, key = uri[len(SCHEME):].partition("/")
        if not bucket:
            raise ObjectStoreError(f"no bucket in {uri!r}: write s3://BUCKET/PREFIX")
        parts = [p for p in key.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ObjectStoreError(f"'..' in an object key: {uri!r}")
        self.bucket, self.key = bucket, "/".join(parts)

    # -- pure path operations
    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}" if self.key else f"{SCHEME}{self.bucket}"

    def __repr__(self) -> str:
        return f"S3Path({str(self)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, S3Path) and (self.bucket, self.key) == (other.bucket, other.key)

    def __hash__(self) -> int:
        return hash((self.bucket, self.key))

    def __lt__(self, other: S3Path) -> bool:
        return str(self) < str(other)

    def __truediv__(self, part) -> S3Path:
        return S3Path(f"{self}/{part}")

    @property
    def name(self) -> str:
        return PurePosixPath(self.key).name

    @property
    def stem(self) -> str:
        return PurePosixPath(self.key).stem

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.key).suffix

    @property
    def parent(self) -> S3Path:
        return S3Path(f"{SCHEME}{self.bucket}/{PurePosixPath(self.key).parent}".removesuffix("/."))

    def with_name(self, name: str) -> S3Path:
        return self.parent / name

    def is_absolute(self) -> bool:
        return True

    def relative_to(self, other: S3Path) -> PurePosixPath:
        return PurePosixPath(self.key).relative_to(other.key)

    # -- the store
    def _prefix(self) -> str:
        return f"{self.key}/" if self.key else ""

    def _head(self):
        try:
            return client().head_object(Bucket=self.bucket, Key=self.key)
        except Exception as err:
            if _missing(err):
                return None
            raise

    def _keys(self, recursive: bool = True) -> Iterator[dict]:
        """The objects under this "folder" (``Key``, ``LastModified``, ``Size``)."""
        kwargs = {"Bucket": self.bucket, "Prefix": self._prefix()}
        if not recursive:
            kwargs["Delimiter"] = "/"
        for page in client().get_paginator("list_objects_v2").paginate(**kwargs):
            yield from page.get("Contents", [])
            for sub in page.get("CommonPrefixes", []):
                yield {"Key": sub["Prefix"], "dir": True}

    def is_file(self) -> bool:
        return bool(self.key) and self._head() is not None

    def is_dir(self) -> bool:
        return next(iter(self._keys()), None) is not None

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to do: a key's "folders" exist with it."""

    def rmdir(self) -> None:
        """Nothing to do: an empty "folder" does not exist."""

    def iterdir(self) -> Iterator[S3Path]:
        for item in self._keys(recursive=False):
            yield S3Path(f"{SCHEME}{self.bucket}/{item['Key']}")

    def glob(self, pattern: str) -> Iterator[S3Path]:
        """Keys (and "folders" one level down) under this one matching ``pattern``: ``*`` within a
        name, a leading ``**/`` for any depth (pathlib's rules for the patterns used here)."""
        deep = pattern.startswith("**/")
        tail = pattern.removeprefix("**/")
        if not deep and "/" not in tail:
            for item in self._keys(recursive=False):
                path = S3Path(f"{SCHEME}{self.bucket}/{item['Key']}")
                if fnmatch.fnmatchcase(path.name, tail):
                    yield path
            return
        if "/" in tail:
            raise NotImplementedError(f"S3Path.glob: pattern {pattern!r} (a name, or **/ and a name)")
        seen = set()
        for item in self._keys():
            parts = item["Key"][len(self._prefix()):].strip("/").split("/")
            for depth in range(1, len(parts) + 1):  # the key and each "folder" above it
                sub = "/".join(parts[:depth])
                if sub not in seen and fnmatch.fnmatchcase(parts[depth - 1], tail):
                    seen.add(sub)
                    yield self / sub

    def rglob(self, pattern: str) -> Iterator[S3Path]:
        return self.glob(f"**/{pattern}")

    def stat(self) -> SimpleNamespace:
        head = self._head()
        if head is None:
            raise FileNotFoundError(str(self))
        return SimpleNamespace(st_size=head["ContentLength"], st_mtime=head["LastModified"].timestamp(),
                               st_mtime_ns=int(head["LastModified"].timestamp() * 1e9))

    def read_bytes(self) -> bytes:
        try:
            return client().get_object(Bucket=self.bucket, Key=self.key)["Body"].read()
        except Exception as err:
            if _missing(err):
                raise FileNotFoundError(str(self)) from err
            raise

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> int:
        """One PUT: readers see the old object or the new one."""
        client().put_object(Bucket=self.bucket, Key=self.key, Body=data)
        return len(data)

    def write_text(self, text: str, encoding: str = "utf-8") -> int:
        return self.write_bytes(text.encode(encoding))

    def download(self, local: str | os.PathLike) -> None:
        """This key to a local file (streamed: a large file never sits in memory whole)."""
        if self._head() is None:
            raise FileNotFoundError(str(self))
        client().download_file(self.bucket, self.key, str(local))

    def upload(self, local: str | os.PathLike) -> None:
        """A local file to this key (a multipart upload for a large file: it appears only when complete)."""
        client().upload_file(str(local), self.bucket, self.key)

    def unlink(self, missing_ok: bool = False) -> None:
        if not missing_ok and not self.is_file():
            raise FileNotFoundError(str(self))
        client().delete_object(Bucket=self.bucket, Key=self.key)

    def rmtree(self) -> None:
        """Delete every key under this one."""
        keys = [item["Key"] for item in self._keys()]
        for start in range(0, len(keys), 1000):
            client().delete_objects(Bucket=self.bucket,
                                    Delete={"Objects": [{"Key": k} for k in keys[start:start + 1000]], "Quiet": True})


def rmtree(path) -> None:
    """``shutil.rmtree(path, ignore_errors=True)`` for a local path or an S3 prefix."""
    if isinstance(path, S3Path):
        path.rmtree()
    else:
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def check_root(root) -> None:
    """Fail early, in one line, when an ``s3://`` root cannot be reached: no credentials, no
    endpoint answering, or no such bucket (a local root: nothing to check)."""
    if not is_remote(root):
        return
    path = as_path(root)
    try:
        client().head_bucket(Bucket=path.bucket)
    except Exception as err:
        name, code = type(err).__name__, _error_code(err)
        if name in ("NoCredentialsError", "PartialCredentialsError"):
            why = "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        elif name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError"):
            why = f"no S3 endpoint answers at {os.environ.get('AWS_ENDPOINT_URL') or 'the default AWS endpoint'}"
        elif code in ("404", "NoSuchBucket", "NotFound"):
            why = f"bucket {path.bucket!r} does not exist"
        elif code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            why = f"access to bucket {path.bucket!r} denied ({code}): check the AWS credentials"
        else:
            why = f"{name}: {err}".splitlines()[0]
        raise ObjectStoreError(f"data root {root}: {why}") from err


# --------------------------------------------------------------------------- lease


@contextmanager
def lease(path: S3Path, holder: str = "another process", ttl_s: float | None = None,
          poll_s: float = 1.0, timeout_s: float | None = None) -> Iterator[dict]:
    """Hold the lease object ``path`` (see the module docstring) for the block; wait while another
    live holder has it (one warning names it), take it over once expired. ``timeout_s``: give up
    waiting with TimeoutError (None: wait as long as it takes, as a file lock does). Yields the
    lease's record (``holder``, ``expires``)."""
    ttl = float(ttl_s if ttl_s is not None else os.environ.get("SEQENC_LEASE_TTL_S", LEASE_TTL_S))
    me = f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"
    s3 = client()
    state = {"etag": _acquire(s3, path, me, ttl, holder, poll_s, timeout_s), "lost": False}
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(ttl / 3):
            try:
                state["etag"] = _put(s3, path, me, ttl, IfMatch=state["etag"])
            except Exception as err:  # 412: taken over; anything else: try again at the next tick
                if _error_code(err) in ("412", "PreconditionFailed"):
                    state["lost"] = True
                    logger.error("lease %s was taken over by another holder", path)
                    return
                logger.warning("could not renew lease %s: %s", path, err)

    beat = threading.Thread(target=renew, name=f"lease-{path.name}", daemon=True)
    beat.start()
    try:
        yield {"holder": me, "key": str(path)}
    finally:
        stop.set()
        beat.join()
        if not state["lost"]:
            try:
                s3.delete_object(Bucket=path.bucket, Key=path.key, IfMatch=state["etag"])
            except Exception as err:  # taken over meanwhile (412) or gone: not ours to delete
                logger.warning("lease %s not released: %s", path, err)
    if state["lost"]:
        raise LeaseLost(f"lease {path} was taken over while held (not renewed within {ttl:g} s)")


def _put(s3, path: S3Path, me: str, ttl: float, **condition) -> str:
    body = json.dumps({"holder": me, "expires": time.time() + ttl}).encode()
    return s3.put_object(Bucket=path.bucket, Key=path.key, Body=body, **condition)["ETag"]


def _acquire(s3, path: S3Path, me: str, ttl: float, holder: str, poll_s: float, timeout_s: float | None) -> str:
    start, warned = time.monotonic(), False
    while True:
        try:
            return _put(s3, path, me, ttl, IfNoneMatch="*")  # created: ours
        except Exception as err:
            if _error_code(err) not in ("412", "PreconditionFailed", "409", "ConditionalRequestConflict"):
                raise
        try:
            got = s3.get_object(Bucket=path.bucket, Key=path.key)
            record, etag = json.loads(got["Body"].read() or b"{}"), got["ETag"]
        except Exception as err:
            if _missing(err):
                continue  # released meanwhile: create it again
            raise
        if time.time() > float(record.get("expires", 0)):
            try:
                new = _put(s3, path, me, ttl, IfMatch=etag)  # only one waiter's If-Match holds
                logger.warning("took over the expired lease %s of %s", path, record.get("holder"))
                return new
            except Exception as err:
                if _error_code(err) not in ("412", "PreconditionFailed", "404", "NoSuchKey", "409",
                                            "ConditionalRequestConflict"):
                    raise
                continue
        if not warned:
            logger.warning("%s holds %s (%s): waiting for it to finish", holder, path, record.get("holder"))
            warned = True
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise TimeoutError(f"lease {path} still held by {record.get('holder')} after {timeout_s:g} s")
        time.sleep(poll_s)
