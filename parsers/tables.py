"""Tables and texts -> the same Parquet key-value objects as logs and events.

**A table is a sequence.** Its objects are its data rows (``step`` = row index, from 0), its keys
are its columns (the header row's names) and its values the cells as text, so the S(k) of a
column is exactly the column's cells in row order -- the column-evolution view of the TVM-KA
paper, a table's column as a key's value sequence. ``sequence_id`` is the file's name (TabFact's
statements name their table that way), or ``table_id`` when given.

* Formats: delimited text (``.csv``, ``.tsv``, TabFact's ``#``-separated ``.csv``; ``.gz`` too)
  read with Python's ``csv`` module (quoted cells, line breaks inside quotes), and ``.parquet``.
  The delimiter is sniffed from the first lines (the candidate among ``, \\t ; | #`` that splits
  them all into the same number of fields, at least two) unless ``delimiter`` is given.
* Header: the first row. Choice: a blank name becomes ``column_<i>`` (1-based) and a repeated
  name gets ``_2``, ``_3``, ... so every column is its own key; the renames are in the report.
* Cells: text as written (Parquet: its values as text); an empty cell is the value ``""`` -- it
  stays in S(k), so every column of a table has one value per row.
* Bad input becomes a reject with a reason (parsers.storage's rejects, 1 KiB of raw text): a
  row with more or fewer fields than the header, undecodable bytes, a cell over the csv
  module's field limit (``MAX_CELL_CHARS``). A table with no header, or more rejected rows than
  ``max_reject_share`` allows, writes nothing but its rejects (parsers.storage.RejectShareExceeded).

**A text is a sequence too.** :func:`ingest_text` reads JSON Lines (one record per line: a
statement, a question, a document, a dialogue) or plain text files. A record's ``text_field``
is cut into units -- ``none`` (the whole text, one unit), ``sentences`` or ``lines`` -- and each
unit is one object (``step`` = unit index) with the key ``text_field``; the record's other
scalar fields are one object each at step 0 (e.g. TabFact's ``table`` and ``caption``), so a task
can keep or leave them out like any key -- but not its id (the sequence id) nor its label
(``label_field``: written to the labels). ``sequence_id``: the record's ``id_field`` when given,
else ``<file name>@<ingest date>:<line number>`` -- the date, so that a file of the same name
landed on another day (tomorrow's ``statements.jsonl``) makes new sequences instead of merging
into today's; a plain text file is one sequence named after the file, its units the file's
non-blank lines (or sentences). A record's label goes to a labels part of its file *and* ingest
date (``labels/source=<s>/part-<date>_<file>.parquet``), so a later day's file of the same name
does not replace today's labels.

**Fields that give the label away.** Every scalar field of a record but the text, the id and the
label becomes an object, and so model input. A field that tells the label (an ``answer`` beside
a ``label``) would let a model read its own label. The report's ``label_leaks`` lists every
field whose value predicts the label in at least ``LEAK_SHARE`` of the labelled records while
it takes fewer distinct values than half of them (an id-like field fits any label trivially),
and a warning names them: leave them out with the task's ``exclude_keys`` (docs/tables.md).

Both write ``objects/source=<s>/ingest_date=<d>/part-<file name>.parquet`` atomically, so
ingesting a file again replaces its part (nothing is appended twice), as the log and event
ingests do.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import re
import time
from collections import Counter
from pathlib import Path

import polars as pl

from parsers import storage

logger = logging.getLogger(__name__)

DELIMITERS = (",", "\t", ";", "|", "#")
SNIFF_LINES = 20
MAX_CELL_CHARS = 1 << 20  # the csv module's field limit: a longer cell is a reject
TEXT_UNITS = ("none", "sentences", "lines")
LEAK_SHARE = 0.95  # a field predicting the label this often is reported (module docstring)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


def sniff_delimiter(lines: list[str]) -> str:
    """The candidate delimiter that splits every one of ``lines`` into the same number (>= 2)
    of fields with the csv module's quoting; the first such in DELIMITERS order."""
    lines = [line for line in lines if line.strip()]
    for delimiter in DELIMITERS:
        counts = {len(row) for row in csv.reader(lines, delimiter=delimiter)}
        if len(counts) == 1 and counts.pop() >= 2:
            return delimiter
    raise ValueError(f"cannot tell the delimiter of the first {len(lines)} lines (tried "
                     f"{', '.join(repr(d) for d in DELIMITERS)}); give it (--delimiter)")


def column_names(header: list[str]) -> tuple[list[str], dict[str, str]]:
    """Keys for a header row (module docstring): blank -> ``column_<i>``, repeats -> ``_2``, ...;
    returns (names, {original position as text: new name} for each renamed column)."""
    names, renamed, seen = [], {}, set()
    for i, raw in enumerate(header, start=1):
        name = raw.strip() or f"column_{i}"
        base, n = name, 1
        while name in seen:
            n += 1
            name = f"{base}_{n}"
        if name != raw:
            renamed[str(i)] = name
        seen.add(name)
        names.append(name)
    return names, renamed


def _text_stream(path: Path):
    return io.TextIOWrapper(storage.open_input(path), encoding="utf-8-sig", errors="surrogateescape", newline="")


def _delimited_rows(path: Path, delimiter: str | None, rejects: storage.Rejects):
    """(line number, fields) of every row of a delimited file, header first; a bad row becomes
    a reject and is yielded with fields None (so it is counted)."""
    if delimiter is None:
        with _text_stream(path) as fh:
            head = [line for _, line in zip(range(SNIFF_LINES), fh)]
        delimiter = sniff_delimiter(head)
    csv.field_size_limit(MAX_CELL_CHARS)
    with _text_stream(path) as fh:
        reader = csv.reader(fh, delimiter=delimiter)
        while True:
            start = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                rejects.append((start, f"unreadable row: {exc}", ""))
                yield start, None
                continue
            text = delimiter.join(row)
            if any("\udc80" <= ch <= "\udcff" for ch in text):
                rejects.append((start, "undecodable bytes (not UTF-8)", text.encode("utf-8", "replace").decode()))
                yield start, None
                continue
            yield start, row


def _parquet_rows(path: Path):
    frame = pl.read_parquet(path)
    yield 1, list(frame.columns)
    for i, row in enumerate(frame.cast(pl.String).iter_rows(), start=2):
        yield i, ["" if v is None else v for v in row]


class _Table:
    """One pass over a table file: the header's column names, then the good data rows; bad rows
    go to ``rejects``; ``read`` counts every row but the header (read = kept + rejected + blank)."""

    def __init__(self, path: Path, delimiter: str | None, rejects: storage.Rejects):
        self.path, self.delimiter, self.rejects = path, delimiter, rejects
        self.names: list[str] | None = None
        self.renamed: dict[str, str] = {}
        self.read = self.blank = 0

    def __iter__(self):
        rows = _parquet_rows(self.path) if self.path.suffix == ".parquet" else \
            _delimited_rows(self.path, self.delimiter, self.rejects)
        for line_no, fields in rows:
            if fields is not None and self.names is None:
                if any(f.strip() for f in fields):
                    self.names, self.renamed = column_names(fields)
                    continue
            self.read += 1
            if fields is None:  # already a reject
                continue
            if self.names is None or not any(f.strip() for f in fields):
                self.blank += 1
            elif len(fields) != len(self.names):
                self.rejects.append((line_no, f"row has {len(fields)} fields, the header has {len(self.names)}",
                                     "|".join(fields)))
            else:
                yield fields


def ingest_table(path, root, source: str = "tables", ingest_date=None, delimiter: str | None = None,
                 table_id: str | None = None, max_reject_share: float | None = None,
                 batch_rows: int = 50_000) -> dict:
    """One table file -> objects (module docstring). Returns a report: ``read`` (rows after the
    header), ``parsed``, ``rejected``, ``reject_share``, ``blank``, ``objects`` (rows kept),
    ``rows`` (object rows), ``sequences`` (1), ``columns``, ``renamed``, ``objects_path``,
    ``rejects_path``, ``seconds``. Two passes over the file (check, then write ``batch_rows``
    rows at a time), so memory does not grow with the table."""
    start = time.perf_counter()
    path = Path(path)
    rejects = storage.Rejects()
    check = _Table(path, delimiter, rejects)
    kept = sum(1 for _ in check)
    if check.names is None:
        raise ValueError(f"{path} holds no header row (an empty table); nothing ingested")
    storage.refuse_rejected_input(root, source, ingest_date, path, rejects, check.read, max_reject_share)
    names, sequence_id = check.names, table_id or path.name

    def batches():
        rows = iter(_Table(path, delimiter, storage.Rejects()))  # the same rows again; rejects known
        step = 0
        while chunk := [r for _, r in zip(range(batch_rows), rows)]:
            n = len(chunk)
            yield pl.DataFrame({"sequence_id": [sequence_id] * (n * len(names)),
                                "step": [step + i for i in range(n) for _ in names],
                                "ts": pl.Series([None] * (n * len(names)), dtype=pl.Datetime("us")),
                                "key": names * n, "value": [cell for row in chunk for cell in row],
                                "template_id": pl.Series([None] * (n * len(names)), dtype=pl.Int64)})
            step += n

    obj_path = storage.objects_path(root, source, ingest_date, path)
    n_rows = storage.write_batches_atomic(batches(), obj_path, storage.OBJECTS_SCHEMA)
    rejects.sort(key=lambda r: r[0])
    rej_path = storage.write_rejects(root, source, ingest_date, path, rejects)
    report = {"read": check.read, "parsed": kept, "rejected": len(rejects), "blank": check.blank, "objects": kept,
              "rows": n_rows, "sequences": 1 if kept else 0, "columns": len(names), "renamed": check.renamed,
              "objects_path": str(obj_path), "rejects_path": str(rej_path) if rej_path else None,
              "seconds": round(time.perf_counter() - start, 3)}
    logger.info("ingested table %s: %s", path, report)
    return storage.check_reject_share(report, max_reject_share)


def text_units(text: str, units: str) -> list[str]:
    """``text`` cut into units: ``none`` (the whole, stripped), ``sentences`` (after . ! ? and
    whitespace) or ``lines`` (non-blank lines); empty pieces are dropped."""
    if units == "none":
        pieces = [text]
    elif units == "sentences":
        pieces = _SENTENCE_END.split(text)
    elif units == "lines":
        pieces = text.splitlines()
    else:
        raise ValueError(f"text units must be one of {', '.join(TEXT_UNITS)}, not {units!r}")
    return [p.strip() for p in pieces if p.strip()]


def _record_objects(record: dict, sequence_id: str, text_field: str, units: str, label_field: str | None,
                    id_field: str | None) -> list[tuple]:
    text = record.get(text_field)
    if not isinstance(text, str):
        raise ValueError(f"field {text_field!r} is missing or not text")
    rows = [(sequence_id, step, text_field, unit) for step, unit in enumerate(text_units(text, units))]
    for key, value in record.items():
        if key in (text_field, label_field, id_field) or value is None or isinstance(value, (dict, list)):
            continue
        rows.append((sequence_id, 0, key, str(value).lower() if isinstance(value, bool) else str(value)))
    return rows


def label_leaks(fields: dict[str, list[tuple[str, str]]], n_labelled: int) -> dict[str, float]:
    """``{field: share}`` for every field whose value predicts the label (its most frequent label
    per value) in at least LEAK_SHARE of the ``n_labelled`` records, among fields present in most
    of them with fewer distinct values than half of them and more than one value."""
    out = {}
    for name, pairs in fields.items():
        values = {v for v, _ in pairs}
        if len(pairs) < max(2, n_labelled // 2) or not 1 < len(values) < len(pairs) / 2:
            continue
        by_value: dict[str, Counter] = {}
        for value, label in pairs:
            by_value.setdefault(value, Counter())[label] += 1
        share = sum(c.most_common(1)[0][1] for c in by_value.values()) / len(pairs)
        if share >= LEAK_SHARE:
            out[name] = round(share, 4)
    return out


def ingest_text(path, root, source: str = "texts", ingest_date=None, text_field: str = "text",
                id_field: str | None = None, units: str = "none", label_field: str | None = None,
                max_reject_share: float | None = None) -> dict:
    """A JSON Lines or plain text file -> objects (module docstring). Report as
    :func:`ingest_table`'s, ``sequences`` the number of texts. ``label_field``: a JSON Lines
    record's label, written to the source's labels (``labels/source=<s>/part-<file>.parquet``,
    as ``seqenc ingest ... --labels`` writes them) and never an object, so no model reads its
    own label; a record without it is ingested unlabelled."""
    if units not in TEXT_UNITS:
        raise ValueError(f"text units must be one of {', '.join(TEXT_UNITS)}, not {units!r}")
    start = time.perf_counter()
    path = Path(path)
    rejects = storage.Rejects()
    reader = storage.LineReader(path, rejects)
    rows: list[tuple] = []
    labels: list[tuple[str, str]] = []
    seen: set[str] = set()
    parsed = 0
    day = storage.ingest_date_str(ingest_date)
    fields: dict[str, list[tuple[str, str]]] = {}  # field -> (value, label) of labelled records
    json_lines = path.name.removesuffix(".gz").endswith((".jsonl", ".json", ".ndjson"))
    if json_lines:
        for line_no, text in reader:
            try:
                record = json.loads(text)
                if not isinstance(record, dict):
                    raise ValueError("not a JSON object")
                sequence_id = str(record[id_field]) if id_field else f"{path.name}@{day}:{line_no}"
                if sequence_id in seen:
                    raise ValueError(f"id {sequence_id!r} seen before in this file")
                got = _record_objects(record, sequence_id, text_field, units, label_field, id_field)
            except json.JSONDecodeError as exc:
                rejects.append((line_no, f"invalid JSON: {exc.msg}", text))
                continue
            except RecursionError:
                rejects.append((line_no, "JSON nested too deeply", text))
                continue
            except (ValueError, KeyError) as exc:
                reason = f"field {exc} missing" if isinstance(exc, KeyError) else str(exc)
                rejects.append((line_no, reason[:200], text))
                continue
            seen.add(sequence_id)
            rows.extend(got)
            if label_field and record.get(label_field) is not None:
                labels.append((sequence_id, str(record[label_field])))
                for _, _, key, value in got:
                    if key != text_field:
                        fields.setdefault(key, []).append((value, labels[-1][1]))
            parsed += 1
    else:  # plain text: the whole file is one text
        body = "\n".join(text for _, text in reader)
        rows = [(path.name, step, text_field, unit) for step, unit in enumerate(text_units(body, units))]
        parsed, seen = (1, {path.name}) if rows else (0, set())
    storage.refuse_rejected_input(root, source, ingest_date, path, rejects, reader.read, max_reject_share)
    obj_path = storage.objects_path(root, source, ingest_date, path)
    frame = pl.DataFrame(rows, schema={"sequence_id": pl.String, "step": pl.Int64, "key": pl.String,
                                       "value": pl.String}, orient="row")
    frame = frame.with_columns(pl.lit(None, pl.Datetime("us")).alias("ts"), pl.lit(None, pl.Int64).alias("template_id"))
    storage.write_parquet_atomic(frame, obj_path, storage.OBJECTS_SCHEMA)
    if label_field:
        storage.write_parquet_atomic(pl.DataFrame(labels, schema={"sequence_id": pl.String, "label": pl.String},
                                                  orient="row"), storage.labels_path(root, source, f"{day}_{path.name}"),
                                     storage.LABELS_SCHEMA)
    leaks = label_leaks(fields, len(labels))
    if leaks:
        logger.warning("%s: the fields %s predict the label in %s of the labelled records: a model reading them "
                       "reads its label; leave them out with the task's exclude_keys", path, ", ".join(leaks),
                       ", ".join(f"{share:.0%}" for share in leaks.values()))
    rejects.sort(key=lambda r: r[0])
    rej_path = storage.write_rejects(root, source, ingest_date, path, rejects)
    report = {"read": reader.read, "parsed": parsed, "labels": len(labels) if label_field else None,
              "label_leaks": leaks, "rejected": len(rejects), "blank": reader.blank,
              "objects": frame.select("sequence_id", "step").unique().height, "rows": frame.height,
              "sequences": len(seen), "objects_path": str(obj_path),
              "rejects_path": str(rej_path) if rej_path else None, "seconds": round(time.perf_counter() - start, 3)}
    logger.info("ingested text %s: %s", path, report)
    return storage.check_reject_share(report, max_reject_share)
