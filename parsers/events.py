"""JSON Lines event ingestion (plain or ``.gz``): one object per event, grouped by session.

Choices (the long-form ``objects`` table is in ``docs/data-layout.md``):

* Nested objects become dotted keys (``payload.page``); list items get their index
  (``payload.items.0``). Keys keep the order of the JSON document.
* Scalars are kept as text: strings as they are, ``true``/``false`` for booleans, numbers as
  JSON writes them (``12``, ``0.5``, ``NaN``). ``null`` values, empty objects and empty lists are
  *dropped and counted* (the report's ``null_values`` and ``empty_containers``): for a sequence
  model a missing key and a null key say the same thing, and nothing disappears uncounted.
* ``session_field`` and ``ts_field`` (dotted paths allowed) pick the session id and the
  timestamp; they are stored in ``sequence_id`` / ``ts`` and not repeated as keys.
* Timestamps: an ISO-8601 string (``Z`` or an offset allowed; no offset means UTC) or a
  number of epoch seconds (values above 1e11 are taken as epoch milliseconds). Stored as
  UTC without a time zone. ``template_id`` is null for events.
* Within a session, ``step`` orders events by timestamp, then by line number (arrival);
  the rows themselves are written in input order.
* Rejected with a reason: undecodable bytes, invalid JSON, a JSON value that is not an
  object, missing / empty session id, missing timestamp, unparseable timestamp -- and what a
  broken producer writes that Python's JSON reader would crash on or keep ambiguous: nesting
  deeper than ``MAX_DEPTH`` levels (``[[[[...`` 5,000 deep made ingest die with a
  RecursionError before), a number too long to convert, a key twice in one object (JSON leaves
  its meaning open), a lone surrogate escape (``"\\ud800"``: not text Parquet can hold), more
  than ``MAX_KEYS`` keys in one event. A byte-order mark at the start of a line is not data
  and is dropped. Blank lines are counted (``blank``) and skipped.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from pathlib import Path

import polars as pl

from parsers import storage
from parsers.spill import SequenceRows, Spill

logger = logging.getLogger(__name__)

_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_MS_ABOVE = 1e11  # 1e11 seconds is the year 5138: larger numbers must be milliseconds
MAX_DEPTH = 64  # levels of nested objects and lists an event may have
MAX_KEYS = 10_000  # keys (flattened leaves) one event may have


class BadEvent(ValueError):
    """A line that parses as JSON but cannot be an event: the message is the reject reason."""


def scalar_text(value) -> str:
    """JSON scalar as text: ``true``/``false`` for booleans, JSON number text for numbers."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def flatten(obj: dict, prefix: str = "", counts: dict[str, int] | None = None) -> list[tuple[str, str]]:
    """``{"a": {"b": [1, true]}}`` -> ``[("a.b.0", "1"), ("a.b.1", "true")]``. Nulls and empty
    containers are dropped and counted in ``counts`` (``null_values``, ``empty_containers``);
    :class:`BadEvent` when the object nests deeper than MAX_DEPTH or has more than MAX_KEYS keys."""
    out: list[tuple[str, str]] = []
    _flatten_into(obj, prefix, out, 0, counts if counts is not None else {})
    return out


def _flatten_into(value, key: str, out: list[tuple[str, str]], depth: int, counts: dict[str, int]) -> None:
    if isinstance(value, dict | list):
        if depth >= MAX_DEPTH:
            raise BadEvent(f"nested deeper than {MAX_DEPTH} levels")
        if not value:
            counts["empty_containers"] = counts.get("empty_containers", 0) + 1
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            _flatten_into(v, f"{key}.{k}" if key else str(k), out, depth + 1, counts)
    elif value is None:
        counts["null_values"] = counts.get("null_values", 0) + 1
    else:
        if len(out) >= MAX_KEYS:
            raise BadEvent(f"more than {MAX_KEYS} keys in one event")
        out.append((key, scalar_text(value)))


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    """json.loads' object hook: the object, or BadEvent naming a key given twice."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise BadEvent(f"duplicate key {k[:64]!r} in one object")
            seen.add(k)
    return obj


def load_event(text: str):
    """``json.loads`` for one line, with the module docstring's rejects as :class:`BadEvent` (or
    json.JSONDecodeError): deep nesting, over-long numbers, duplicate keys. A leading
    byte-order mark is dropped."""
    try:
        return json.loads(text.removeprefix("\ufeff"), object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise BadEvent(f"nested deeper than {MAX_DEPTH} levels") from None
    except (json.JSONDecodeError, BadEvent):
        raise
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise BadEvent(f"invalid JSON number: {str(exc)[:80]}") from None


def _not_text(strings) -> bool:
    """True when a string holds a lone surrogate (from a ``\\udXXX`` escape): not UTF-8."""
    try:
        for x in strings:
            x.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _lookup(obj: dict, dotted: str):
    """Value at a dotted path of nested objects, or ``None``."""
    for part in dotted.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def parse_ts(value) -> dt.datetime:
    """ISO-8601 text or epoch seconds / milliseconds -> naive UTC datetime (ValueError / TypeError if not)."""
    if isinstance(value, bool):
        raise TypeError("boolean is not a timestamp")
    if isinstance(value, (int, float)):
        seconds = value / 1000 if abs(value) > _EPOCH_MS_ABOVE else value
        return dt.datetime.fromtimestamp(seconds, dt.UTC).replace(tzinfo=None)
    if isinstance(value, str):
        ts = dt.datetime.fromisoformat(value.strip())
        if ts.tzinfo is not None:
            ts = ts.astimezone(dt.UTC).replace(tzinfo=None)
        return ts
    raise TypeError(f"unsupported timestamp type {type(value).__name__}")


def _session_id(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    text = str(value).strip()
    return text or None


def _parse_events(lines: pl.DataFrame, session_field: str, ts_field: str, rejects: list,
                  counts: dict[str, int]) -> pl.DataFrame:
    """A batch of lines -> its events ``line_no, sequence_id, ts_us, keys, values``; the rest
    becomes rejects with their reason; dropped nulls and empty containers add to ``counts``."""
    skip_keys = {session_field, ts_field}
    out: dict[str, list] = {"line_no": [], "sequence_id": [], "ts_us": [], "keys": [], "values": []}
    for line_no, text in lines.iter_rows():
        try:
            obj = load_event(text)
        except json.JSONDecodeError as exc:
            rejects.append((line_no, f"invalid JSON: {exc.msg} at column {exc.colno}", text))
            continue
        except BadEvent as exc:
            rejects.append((line_no, str(exc), text))
            continue
        if not isinstance(obj, dict):
            rejects.append((line_no, f"not a JSON object ({type(obj).__name__})", text))
            continue
        sid = _session_id(_lookup(obj, session_field))
        if sid is None:
            rejects.append((line_no, f"missing session id (field {session_field!r})", text))
            continue
        ts_value = _lookup(obj, ts_field)
        if ts_value is None:
            rejects.append((line_no, f"missing timestamp (field {ts_field!r})", text))
            continue
        try:
            ts = parse_ts(ts_value)
        except (ValueError, TypeError, OverflowError, OSError):
            rejects.append((line_no, f"bad timestamp: {str(ts_value)[:64]!r}", text))
            continue
        line_counts: dict[str, int] = {}
        try:
            kv = [(k, v) for k, v in flatten(obj, counts=line_counts) if k not in skip_keys]
        except BadEvent as exc:
            rejects.append((line_no, str(exc), text))
            continue
        # a lone surrogate can only come from a \u escape (the line itself decoded as UTF-8)
        if "\\u" in text and _not_text([sid] + [x for pair in kv for x in pair]):
            rejects.append((line_no, "a lone surrogate escape (\\ud800-\\udfff) in the session id, a key or a value",
                            text))
            continue
        for name, n in line_counts.items():
            counts[name] = counts.get(name, 0) + n
        out["line_no"].append(line_no)
        out["sequence_id"].append(sid)
        out["ts_us"].append((ts - _EPOCH) // dt.timedelta(microseconds=1))
        out["keys"].append([k for k, _ in kv])
        out["values"].append([v for _, v in kv])
    return pl.DataFrame(out, schema={"line_no": pl.Int64, "sequence_id": pl.String, "ts_us": pl.Int64,
                                     "keys": pl.List(pl.String), "values": pl.List(pl.String)})


def ingest_events(
    path, root, source: str = "sessions", session_field: str = "session_id", ts_field: str = "ts", ingest_date=None,
    max_reject_share: float | None = None, batch_lines: int = 100_000,
) -> dict:
    """Parse a JSON Lines file into ``objects`` (and ``rejects``) Parquet under ``root``.

    Streams like the log ingest (parsers.spill): pass 1 parses batches of lines, keeps a few
    numbers per event and spills the keys and values to disk; pass 2 writes the objects table
    batch by batch. Rows are in input order; ``step`` orders a session's events.

    Returns a report: ``read, parsed, rejected, reject_share, blank, objects, rows, sequences,
    null_values, empty_containers, objects_path, rejects_path, seconds``. A reject share above
    ``max_reject_share`` raises ``parsers.storage.RejectShareExceeded`` after writing only the
    rejects (parsers.storage.refuse_rejected_input).
    """
    start = time.perf_counter()
    path = Path(path)
    rejects = storage.Rejects()
    reader = storage.LineReader(path, rejects)
    obj_path = storage.objects_path(root, source, ingest_date, path)
    sequences = SequenceRows()
    dropped = {"null_values": 0, "empty_containers": 0}
    with Spill(obj_path) as spill:
        for lines in reader.frames(batch_lines):
            events = _parse_events(lines, session_field, ts_field, rejects, dropped)
            sequences.add(events["line_no"], events["sequence_id"], events["ts_us"])
            spill.write(events.select("line_no", "keys", "values"))
        sequences.finish()
        storage.refuse_rejected_input(root, source, ingest_date, path, rejects, reader.read, max_reject_share)

        def objects():
            for batch in spill:
                if batch.height:
                    n_keys = batch["keys"].list.len().to_numpy()
                    yield pl.DataFrame({**sequences.columns(sequences.of_lines(batch["line_no"]), n_keys),
                                        "key": batch["keys"].explode(empty_as_null=False),
                                        "value": batch["values"].explode(empty_as_null=False),
                                        "template_id": pl.repeat(None, int(n_keys.sum()), dtype=pl.Int64, eager=True)})

        n_rows = storage.write_batches_atomic(objects(), obj_path, storage.OBJECTS_SCHEMA)
    storage.drop_legacy_part(obj_path, path)
    rejects.sort(key=lambda r: r[0])
    rej_path = storage.write_rejects(root, source, ingest_date, path, rejects)
    report = {
        "read": reader.read,
        "parsed": sequences.frame.height,
        "rejected": len(rejects),
        "blank": reader.blank,
        "objects": sequences.frame.height,
        "rows": n_rows,
        "sequences": len(sequences.names),
        **dropped,
        "objects_path": str(obj_path),
        "rejects_path": str(rej_path) if rej_path else None,
        "seconds": round(time.perf_counter() - start, 3),
    }
    logger.info("ingested %s: %s", path, report)
    return storage.check_reject_share(report, max_reject_share)
