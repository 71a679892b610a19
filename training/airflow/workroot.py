"""The work root: every path an Airflow param names must lie inside it.

Anyone who may trigger a DAG can set its params, and the stages write, replace and delete
folders under the work directory they are given (a stage's outputs are swapped in whole, the
old ones removed). So the DAGs take the paths of their params -- ``workdir``, ``landing``,
``catalog``, ``config_path`` -- through :func:`confine`: resolved (``~``, relative parts and
symbolic links followed) and refused unless inside the work root. The root is set by whoever
runs Airflow, not by a param: ``$SEQENC_WORK_ROOT``, else ``$SEQENC_WORKDIR``, else
``~/seqenc-work``. A relative param is taken relative to the root. Environment variables
(``$SEQENC_LANDING``, ``$SEQENC_CATALOG``) and Airflow Variables are the operator's and are not
confined.
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_PATH_CHARS = 1024


class OutsideWorkRoot(ValueError):
    """A param names a path outside the work root (or not a usable path at all)."""


def work_root() -> Path:
    """``$SEQENC_WORK_ROOT``, else ``$SEQENC_WORKDIR``, else ``~/seqenc-work``, resolved."""
    root = os.environ.get("SEQENC_WORK_ROOT") or os.environ.get("SEQENC_WORKDIR") or "~/seqenc-work"
    return Path(root).expanduser().resolve()


def confine_uri(value: str, what: str) -> str:
    """An ``s3://`` param: allowed only under ``$SEQENC_OBJECT_ROOT`` (the operator's prefix;
    unset: no object store param is allowed), without ``..`` or empty parts."""
    allowed = (os.environ.get("SEQENC_OBJECT_ROOT") or "").rstrip("/")
    parts = value[len("s3://"):].rstrip("/").split("/")
    if "\x00" in value or len(value) > MAX_PATH_CHARS or any(p in ("", ".", "..") for p in parts):
        raise OutsideWorkRoot(f"param {what}={value!r} is not a usable s3://bucket/prefix")
    value = "s3://" + "/".join(parts)
    if not allowed or (value != allowed and not value.startswith(allowed + "/")):
        raise OutsideWorkRoot(f"param {what}={value!r} is outside the object root {allowed or '(none: set SEQENC_OBJECT_ROOT)'}")
    return value


def confine(value: str, what: str, root: Path | None = None) -> str:
    """``value`` (a param's path) as an absolute path inside ``root`` (default: :func:`work_root`);
    :class:`OutsideWorkRoot` naming the param otherwise."""
    root = (root or work_root()).resolve()
    if not isinstance(value, str) or not value.strip():
        raise OutsideWorkRoot(f"param {what} must be a path, got {value!r}")
    if "\x00" in value or len(value) > MAX_PATH_CHARS:
        raise OutsideWorkRoot(f"param {what} is not a usable path (a NUL byte, or over {MAX_PATH_CHARS} characters)")
    path = Path(value).expanduser()
    path = (path if path.is_absolute() else root / path).resolve()
    if path != root and root not in path.parents:
        raise OutsideWorkRoot(f"param {what}={value!r} resolves to {path}, outside the work root {root}; use a path "
                              "inside it, or have the operator set SEQENC_WORK_ROOT")
    return str(path)
