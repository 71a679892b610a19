"""JSON Lines event ingestion (plain or ``.gz``): one object per event, grouped by session.

Choices (the long-form ``objects`` table is in ``docs/data-layout.md``):

* Nested objects become dotted keys (``payload.page``); list items get their index
  (``payload.items.0``). Keys keep the order of the JSON document.
* Scalars are kept as text: strings as they are, ``true``/``false`` for booleans, numbers as
  JSON writes them (``12``, ``0.5``). ``null`` values, empty objects and empty lists are
  *skipped*: for a sequence model a missing key and a null key say the same thing.
* ``session_field`` and ``ts_field`` (dotted paths allowed) pick the session id and the
  timestamp; they are stored in ``sequence_id`` / ``ts`` and not repeated as keys.
* Timestamps: an ISO-8601 string (``Z`` or an offset allowed; no offset means UTC) or a
  number of epoch seconds (values above 1e11 are taken as epoch milliseconds). Stored as
  UTC without a time zone. ``template_id`` is null for events.
* Within a session, ``step`` orders events by timestamp, then by line number (arrival).
* Rejected with a reason: undecodable bytes, invalid JSON, a JSON value that is not an
  object, missing / empty session id, missing timestamp, unparseable timestamp. Blank lines
  are counted (``blank``) and skipped.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from pathlib import Path

import pyarrow as pa

from parsers import storage

logger = logging.getLogger(__name__)

_EPOCH_MS_ABOVE = 1e11  # 1e11 seconds is the year 5138: larger numbers must be milliseconds


def scalar_text(value) -> str:
    """JSON scalar as text: ``true``/``false`` for booleans, JSON number text for numbers."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def flatten(obj: dict, prefix: str = "") -> list[tuple[str, str]]:
    """``{"a": {"b": [1, true]}}`` -> ``[("a.b.0", "1"), ("a.b.1", "true")]`` (nulls skipped)."""
    out: list[tuple[str, str]] = []
    _flatten_into(obj, prefix, out)
    return out


def _flatten_into(value, key: str, out: list[tuple[str, str]]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten_into(v, f"{key}.{k}" if key else str(k), out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _flatten_into(v, f"{key}.{i}" if key else str(i), out)
    elif value is not None:
        out.append((key, scalar_text(value)))


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


def ingest_events(
    path, root, source: str = "sessions", session_field: str = "session_id", ts_field: str = "ts", ingest_date=None,
    max_reject_share: float | None = None,
) -> dict:
    """Parse a JSON Lines file into ``objects`` (and ``rejects``) Parquet under ``root``.

    Returns a report: ``read, parsed, rejected, reject_share, blank, objects, rows, sequences,
    objects_path, rejects_path, seconds``. Outputs are written in any case; a reject share above
    ``max_reject_share`` then raises ``parsers.storage.RejectShareExceeded``.
    """
    start = time.perf_counter()
    path = Path(path)
    skip_keys = {session_field, ts_field}
    events: list[tuple[str, dt.datetime, int, list[tuple[str, str]]]] = []
    rejects: list[tuple[int, str, str]] = []
    reader = storage.LineReader(path, rejects)
    for line_no, text in reader:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            rejects.append((line_no, f"invalid JSON: {exc.msg} at column {exc.colno}", text))
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
        kv = [(k, v) for k, v in flatten(obj) if k not in skip_keys]
        events.append((sid, ts, line_no, kv))

    # Sort by session, then time, then arrival; step counts within a session.
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    cols = {"sequence_id": [], "step": [], "ts": [], "key": [], "value": [], "template_id": []}
    prev_sid, step = None, -1
    for sid, ts, _, kv in events:
        step = step + 1 if sid == prev_sid else 0
        prev_sid = sid
        for key, value in kv:
            cols["sequence_id"].append(sid)
            cols["step"].append(step)
            cols["ts"].append(ts)
            cols["key"].append(key)
            cols["value"].append(value)
            cols["template_id"].append(None)

    obj_path = storage.objects_path(root, source, ingest_date, path)
    storage.write_parquet_atomic(pa.table(cols, schema=storage.OBJECTS_SCHEMA), obj_path)
    rej_path = storage.write_rejects(root, source, ingest_date, path, rejects)
    report = {
        "read": reader.read,
        "parsed": len(events),
        "rejected": len(rejects),
        "blank": reader.blank,
        "objects": len(events),
        "rows": len(cols["key"]),
        "sequences": len({e[0] for e in events}),
        "objects_path": str(obj_path),
        "rejects_path": str(rej_path) if rej_path else None,
        "seconds": round(time.perf_counter() - start, 3),
    }
    logger.info("ingested %s: %s", path, report)
    return storage.check_reject_share(report, max_reject_share)
