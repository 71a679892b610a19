"""Parquet storage layout of ingested data (the contract is ``docs/data-layout.md``).

Everything lives under one *data root*::

    <root>/objects/source=<src>/ingest_date=<YYYY-MM-DD>/part-<input name>.parquet
    <root>/labels/source=<src>/part-<input name>.parquet
    <root>/rejects/source=<src>/ingest_date=<YYYY-MM-DD>/part-<input name>.parquet
    <root>/state/drain3-<src>.json
    <root>/state/<src>.lock             (held by a log ingest of the source: one at a time)
    <root>/state/format-<src>.json      (a log source's detected header: ingest --auto-header)

Choices made here:

* Schemas are fixed ``pyarrow`` schemas, so an empty table written by an ingest run still
  has the right column types and readers never have to guess.
* ``ts`` is ``timestamp[us]`` without a time zone; writers store UTC wall-clock time.
* Writes are atomic and durable: the table goes to a hidden temp file in the target folder,
  fsync'ed, then ``os.replace`` moves it over ``part-<stem>.parquet`` and the folder is
  fsync'ed (parsers.atomic.durable_replace). Re-ingesting the same input for the same partition
  therefore *replaces* the part file, never appends to it.
* Readers only look at ``part-*.parquet`` files, so a temp file left by a crash is ignored.
* The root may be ``s3://bucket/prefix`` (parsers.objectstore): the same keys, each part
  written to a local temp file and uploaded over its key (one PUT: atomic for readers), read back
  by polars' native S3 reader; the source's lock is then a lease object, not flock.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from parsers import atomic, objectstore
from parsers.line_reader import RAW_LIMIT
from parsers.line_reader import LineReader as LineReader  # re-exported: the ingests read storage.LineReader
from parsers.line_reader import open_input as open_input

logger = logging.getLogger(__name__)

OBJECTS_SCHEMA = pa.schema(
    [
        pa.field("sequence_id", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("ts", pa.timestamp("us"), nullable=True),
        pa.field("key", pa.string(), nullable=False),
        pa.field("value", pa.string(), nullable=False),
        pa.field("template_id", pa.int64(), nullable=True),
    ]
)
LABELS_SCHEMA = pa.schema(
    [
        pa.field("sequence_id", pa.string(), nullable=False),
        pa.field("label", pa.string(), nullable=False),
    ]
)
REJECTS_SCHEMA = pa.schema(
    [
        pa.field("file", pa.string(), nullable=False),
        pa.field("line_no", pa.int64(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("raw", pa.string(), nullable=False),
    ]
)



class Rejects(list):
    """The rejects of one ingest, ``(line_no, reason, raw)``: the raw text is cut to RAW_LIMIT as
    it is added, so a file of long bad lines (up to 64 KiB each) holds 1 KiB a reject in memory."""

    def append(self, item: tuple[int, str, str]) -> None:
        line_no, reason, raw = item
        super().append((line_no, reason, raw[:RAW_LIMIT]))

    def extend(self, items) -> None:
        for item in items:
            self.append(item)

    def __iadd__(self, items):
        self.extend(items)
        return self

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.\-]")


# --------------------------------------------------------------------------- paths


def _check_source(source: str) -> str:
    from parsers.names import check_name

    return check_name(source, "source")


def ingest_date_str(ingest_date: str | dt.date | None = None) -> str:
    """``YYYY-MM-DD`` for the partition; ``None`` means today's date (UTC)."""
    if ingest_date is None:
        return dt.datetime.now(dt.UTC).date().isoformat()
    if isinstance(ingest_date, dt.datetime):
        return ingest_date.date().isoformat()
    if isinstance(ingest_date, dt.date):
        return ingest_date.isoformat()
    return dt.date.fromisoformat(str(ingest_date)).isoformat()  # validates the format


def part_name(input_path: str | os.PathLike) -> str:
    """``part-<input file name>.parquet``, ``.gz`` dropped: ``events.jsonl.gz`` and
    ``events.jsonl`` share a part (re-ingesting either replaces it); ``x.log`` and ``x.txt`` do
    not (``part-x.log.parquet``, ``part-x.txt.parquet``). A name with characters outside
    ``[A-Za-z0-9_.-]`` has them replaced by ``_`` and gets 8 hex digits of its own hash, so two
    names that differ only there (``q 1.csv``, ``q_1.csv``: two tables) never share a part."""
    name = Path(input_path).name.removesuffix(".gz") or "input"
    safe = _UNSAFE_NAME.sub("_", name)
    if safe != name:
        safe += "-" + hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
    return f"part-{safe}.parquet"


def _legacy_part_name(input_path: str | os.PathLike) -> str:
    """The part name before issue 24: the file's stem only, so ``x.log`` and ``x.txt`` collided."""
    stem = Path(Path(input_path).name.removesuffix(".gz")).stem or "input"
    return f"part-{_UNSAFE_NAME.sub('_', stem)}.parquet"


def drop_legacy_part(path: Path, input_path: str | os.PathLike) -> None:
    """After ``path`` (a part of ``input_path``) is written: remove the part the same input had
    under the old name in the same folder, so re-ingesting a file into a data root written
    before the new names replaces its rows instead of doubling them. (The old name was shared
    by ``x.log`` and ``x.txt``: whichever was ingested last had overwritten the other.)"""
    path = objectstore.as_path(path)
    legacy = path.with_name(_legacy_part_name(input_path))
    if legacy != path and legacy.exists():
        legacy.unlink()
        logger.info("removed %s: %s now writes %s", legacy, Path(input_path).name, path.name)


def objects_dir(root: str | os.PathLike, source: str) -> Path:
    """``<root>/objects/source=<src>`` (holds one ``ingest_date=`` folder per day)."""
    return objectstore.as_path(root) / "objects" / f"source={_check_source(source)}"


def labels_dir(root: str | os.PathLike, source: str) -> Path:
    return objectstore.as_path(root) / "labels" / f"source={_check_source(source)}"


def rejects_dir(root: str | os.PathLike, source: str) -> Path:
    return objectstore.as_path(root) / "rejects" / f"source={_check_source(source)}"


def objects_path(root, source: str, ingest_date, input_path) -> Path:
    """Part file of the objects table for one input file and one ingest date."""
    day = ingest_date_str(ingest_date)
    return objects_dir(root, source) / f"ingest_date={day}" / part_name(input_path)


def rejects_path(root, source: str, ingest_date, input_path) -> Path:
    day = ingest_date_str(ingest_date)
    return rejects_dir(root, source) / f"ingest_date={day}" / part_name(input_path)


def labels_path(root, source: str, input_path) -> Path:
    return labels_dir(root, source) / part_name(input_path)


def drain_state_path(root: str | os.PathLike, source: str) -> Path:
    """``<root>/state/drain3-<src>.json``: Drain3 persistence, continued across runs."""
    return objectstore.as_path(root) / "state" / f"drain3-{_check_source(source)}.json"


def source_lock(root: str | os.PathLike, source: str, what: str = "log ingest"):
    """``<root>/state/<src>.lock`` held exclusively (parsers.atomic.file_lock): the log ingests of
    one source share its Drain3 state (loaded at the start, saved at the end), so two at once
    would lose one's templates; the second waits, and says so in one warning.

    On an ``s3://`` root (where there is no flock) it is the lease object
    ``<root>/state/<src>.lease`` instead (parsers.objectstore.lease: a conditional write, renewed
    while held, taken over when a killed holder let it expire)."""
    state = objectstore.as_path(root) / "state"
    if objectstore.is_remote(state):
        return objectstore.lease(state / f"{_check_source(source)}.lease", f"another {what} of source {source!r}")
    return atomic.file_lock(state / f"{_check_source(source)}.lock", f"another {what} of source {source!r}")


def mined_dir(root: str | os.PathLike, source: str) -> Path:
    """``<root>/state/mined/source=<src>``: what the parallel ingest's mine step found, per day
    and file, until the write step is done (parsers.parallel_ingest)."""
    return objectstore.as_path(root) / "state" / "mined" / f"source={_check_source(source)}"


def detected_format_path(root: str | os.PathLike, source: str) -> Path:
    """``<root>/state/format-<src>.json``: the header detected for a log source (``--auto-header``),
    so that every later file of the source splits into the same fields."""
    return objectstore.as_path(root) / "state" / f"format-{_check_source(source)}.json"


# --------------------------------------------------------------------------- writing


_POLARS_TYPES = {pa.string(): pl.String, pa.int64(): pl.Int64, pa.timestamp("us"): pl.Datetime("us")}


def polars_schema(schema: pa.Schema) -> pl.Schema:
    """The polars twin of one of the layout's Arrow schemas (``pl.from_arrow`` would import
    pandas just to check types: a fifth of a second)."""
    return pl.Schema({f.name: _POLARS_TYPES[f.type] for f in schema})


def _local_temp(path) -> tuple[int, str]:
    """A hidden temp file beside ``path``; for an object key, in the local temp folder (the
    finished file is then uploaded over the key in one PUT: :func:`_publish`)."""
    if objectstore.is_remote(path):
        return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)


def _publish(tmp: str, path) -> None:
    """The written temp file becomes ``path``: a durable rename on disk, an upload to S3."""
    if objectstore.is_remote(path):
        try:
            path.upload(tmp)
        finally:
            Path(tmp).unlink(missing_ok=True)
    else:
        atomic.durable_replace(tmp, path)


def write_batches_atomic(batches: Iterable[pl.DataFrame], path: str | os.PathLike, schema: pa.Schema) -> int:
    """Stream frames into one Parquet file (row groups as they come); return the row count.

    Polars' streaming sink does the encoding and compression on its own threads while the
    caller's generator computes the next batch, so memory stays flat with input size. Atomic:
    the rows go to a hidden temp file beside ``path``, moved over it only when every batch was
    written; an error raised by the generator propagates unchanged and leaves no file behind.
    Types are cast to ``schema`` (strings are stored as Arrow ``large_string``, which every
    reader here maps back to the schema's ``string``).
    """
    from polars.io.plugins import register_io_source

    path = objectstore.as_path(path)
    pl_schema = polars_schema(schema)
    rows = 0

    def source(with_columns, predicate, n_rows, batch_size):
        nonlocal rows
        for frame in batches:
            if frame.height:
                rows += frame.height
                yield frame.select(pl_schema.names()).cast(pl_schema)

    fd, tmp = _local_temp(path)
    os.close(fd)
    try:
        register_io_source(io_source=source, schema=pl_schema).sink_parquet(tmp, compression="snappy")
        _publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return rows


def write_parquet_atomic(
    table: pa.Table | pl.DataFrame, path: str | os.PathLike, schema: pa.Schema | None = None
) -> Path:
    """Write ``table`` to ``path`` atomically (temp file in the same folder, then ``os.replace``).

    A polars frame is converted to Arrow first; with ``schema`` the table is cast to it, so
    column order and types are exactly the contract's.
    """
    path = objectstore.as_path(path)
    if isinstance(table, pl.DataFrame):
        table = table.to_arrow()
    if schema is not None:
        table = table.select(schema.names).cast(schema)
    fd, tmp = _local_temp(path)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        _publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    logger.debug("wrote %d rows to %s", table.num_rows, path)
    return path


def write_bytes_atomic(data: bytes, path: str | os.PathLike) -> None:
    """Same temp-then-replace pattern for a small binary file (the Drain3 state); an object key
    gets it in one PUT."""
    path = objectstore.as_path(path)
    if objectstore.is_remote(path):
        path.write_bytes(data)
        return
    fd, tmp = _local_temp(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        atomic.durable_replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def rejects_table(file: str, rows: list[tuple[int, str, str]]) -> pa.Table:
    """Build a rejects table from ``(line_no, reason, raw)`` tuples (raw cut to 1 KiB)."""
    return pa.table(
        {
            "file": [file] * len(rows),
            "line_no": [r[0] for r in rows],
            "reason": [r[1] for r in rows],
            "raw": [r[2][:RAW_LIMIT] for r in rows],
        },
        schema=REJECTS_SCHEMA,
    )


def write_rejects(root, source: str, ingest_date, input_path, rows: list[tuple[int, str, str]]) -> Path | None:
    """Write one input's rejects part; with no rejects, remove a stale part of an earlier run
    (so re-ingesting a fixed file clears its old rejects)."""
    path = rejects_path(root, source, ingest_date, input_path)
    drop_legacy_part(path, input_path)
    if not rows:
        path.unlink(missing_ok=True)
        return None
    logger.warning("%s: %d lines rejected (first: line %d, %s)", input_path, len(rows), rows[0][0], rows[0][1])
    return write_parquet_atomic(rejects_table(str(input_path), rows), path)


# --------------------------------------------------------------------------- reading


class RejectShareExceeded(RuntimeError):
    """More of the input was rejected than the caller accepts; ``report`` says how much."""

    def __init__(self, report: dict, max_share: float):
        self.report, self.max_share = report, max_share
        super().__init__(f"{report['rejected']} of {report['read']} lines rejected "
                         f"({report['reject_share']:.1%} > {max_share:.1%}); see {report['rejects_path']}")

    def __reduce__(self):  # rebuilt from its arguments when it crosses a process boundary
        return type(self), (self.report, self.max_share)


def refuse_rejected_input(root, source: str, ingest_date, input_path, rejects: list, read: int,
                          max_share: float | None) -> None:
    """The reject-share gate, run after reading and before writing anything but the rejects:
    when ``len(rejects) / read`` passes ``max_share``, write the rejects (the reasons) and raise
    :class:`RejectShareExceeded`. So a failed file leaves no objects, labels or Drain3 state
    behind (a part of an earlier, accepted version of the same file stays as it was)."""
    share = len(rejects) / read if read else 0.0
    if max_share is None or share <= max_share:
        return
    rejects.sort(key=lambda r: r[0])
    rej_path = write_rejects(root, source, ingest_date, input_path, rejects)
    raise RejectShareExceeded({"read": read, "rejected": len(rejects), "reject_share": share,
                               "objects_path": None, "rejects_path": str(rej_path)}, max_share)


def check_reject_share(report: dict, max_share: float | None) -> dict:
    """Add ``reject_share`` to a run report; raise when it passes ``max_share`` (None: never)."""
    report["reject_share"] = report["rejected"] / report["read"] if report["read"] else 0.0
    if max_share is not None and report["reject_share"] > max_share:
        raise RejectShareExceeded(report, max_share)
    return report


def read_table(path, schema: pa.Schema | None = None) -> pa.Table:
    """One Parquet file, a local path or an ``s3://`` key (parsers.objectstore)."""
    if objectstore.is_remote(path):
        return pq.read_table(pa.BufferReader(path.read_bytes()), schema=schema)
    return pq.read_table(path, schema=schema)


def _read_parts(folder: Path, schema: pa.Schema) -> pl.DataFrame:
    files = sorted(folder.glob("**/part-*.parquet")) if folder.exists() else []
    if not files:
        return pl.from_arrow(schema.empty_table())
    # Read the files ourselves (not hive discovery) so partition columns do not leak in.
    tables = [read_table(f, schema) for f in files]
    return pl.from_arrow(pa.concat_tables(tables))


def read_objects(root: str | os.PathLike, source: str,
                 ingest_date: str | dt.date | list | tuple | None = None) -> pl.DataFrame:
    """Object rows of a source: ``sequence_id, step, ts, key, value, template_id``.

    ``ingest_date=None`` reads every ingest date; a date reads only that partition (what a
    pipeline run for one data interval must do, so that re-ingesting the same input under a new
    date never doubles the values); a list of dates reads those partitions (missing ones are
    empty), oldest first. ``step`` is the position within the input file."""
    folder = objects_dir(root, source)
    if isinstance(ingest_date, (list, tuple)):
        frames = [read_objects(root, source, d) for d in sorted(ingest_date_str(d) for d in ingest_date)]
        return pl.concat(frames) if frames else pl.from_arrow(OBJECTS_SCHEMA.empty_table())
    if ingest_date is not None:
        folder = folder / f"ingest_date={ingest_date_str(ingest_date)}"
    return _read_parts(folder, OBJECTS_SCHEMA)


def scan_objects(root: str | os.PathLike, source: str,
                 ingest_date: str | dt.date | list | tuple | None = None) -> pl.LazyFrame:
    """:func:`read_objects` as a lazy frame: nothing is read until it is collected, and a
    filter (a chunk of sequence ids, a key) is applied while the files are read, so a caller
    can work through a large partition a part at a time. Same rows, same order."""
    folder = objects_dir(root, source)
    if ingest_date is None:
        folders = [folder]
    else:
        dates = ingest_date if isinstance(ingest_date, (list, tuple)) else [ingest_date]
        folders = [folder / f"ingest_date={d}" for d in sorted(ingest_date_str(d) for d in dates)]
    files = [f for sub in folders if sub.exists() for f in sorted(sub.glob("**/part-*.parquet"))]
    schema = polars_schema(OBJECTS_SCHEMA)
    if not files:
        return pl.LazyFrame(schema=schema)
    # the files themselves (no hive discovery), so partition columns do not leak in
    # str: an s3:// URI is read by polars' own object-store reader, with the AWS environment
    return pl.scan_parquet([str(f) for f in files], hive_partitioning=False, schema=schema, missing_columns="insert",
                           extra_columns="ignore")


def ingest_dates(root: str | os.PathLike, source: str) -> list[str]:
    """The ingest dates (``YYYY-MM-DD``) that have an objects partition for ``source``, sorted."""
    folder = objects_dir(root, source)
    if not folder.exists():
        return []
    return sorted(p.name.split("=", 1)[1] for p in folder.glob("ingest_date=*") if p.is_dir())


def read_labels(root: str | os.PathLike, source: str) -> pl.DataFrame:
    """``sequence_id, label`` of a source (all label files)."""
    return _read_parts(labels_dir(root, source), LABELS_SCHEMA)


def unique_labels(root: str | os.PathLike, source: str) -> tuple[pl.DataFrame, dict]:
    """``sequence_id, label`` of a source, one label per id, and what it took: ``{"label_rows",
    "conflicts", "conflict_examples"}``. An id labelled by several label parts keeps the label of
    the part written last (the newest ingest: a corrected label file ingested after the first
    wins, whatever the files are called); ids whose labels disagree are counted and logged, with
    up to three examples naming the parts -- never resolved in silence."""
    folder = labels_dir(root, source)
    files = sorted(folder.glob("**/part-*.parquet"), key=lambda f: (f.stat().st_mtime_ns, f.name)) \
        if folder.exists() else []
    if not files:
        return pl.from_arrow(LABELS_SCHEMA.empty_table()), {"label_rows": 0, "conflicts": 0, "conflict_examples": []}
    frames = [pl.from_arrow(read_table(f, LABELS_SCHEMA)).with_columns(pl.lit(i).alias("_part"))
              for i, f in enumerate(files)]
    rows = pl.concat(frames)
    distinct = rows.unique(["sequence_id", "label"])
    clashing = distinct.group_by("sequence_id").len().filter(pl.col("len") > 1)["sequence_id"]
    examples = []
    for sid in clashing.head(3).to_list():
        seen = rows.filter(pl.col("sequence_id") == sid).sort("_part")
        examples.append({"sequence_id": sid, "labels": {files[p].name: lab for lab, p in
                                                        zip(seen["label"].to_list(), seen["_part"].to_list())}})
    if clashing.len():
        logger.warning("source %s: %d sequence ids have disagreeing labels in %s; the newest ingest's label is kept "
                       "(e.g. %s)", source, clashing.len(), folder, examples[0])
    kept = rows.sort("_part", maintain_order=True).unique("sequence_id", keep="last", maintain_order=True)
    return kept.drop("_part"), {"label_rows": rows.height, "conflicts": clashing.len(), "conflict_examples": examples}


def read_rejects(root: str | os.PathLike, source: str) -> pl.DataFrame:
    """``file, line_no, reason, raw`` of a source, every ingest date."""
    return _read_parts(rejects_dir(root, source), REJECTS_SCHEMA)
