"""Ingest one data interval from a landing directory (the ``seqenc_ingest`` DAG's logic).

Landing layout: raw files are dropped under ``<landing>/<source>/<YYYY-MM-DD>/``::

    <landing>/hdfs/2025-03-01/datanode-07.log.gz      raw log lines (a parsers.presets format)
    <landing>/sessions/2025-03-01/web-01.jsonl        JSON events, one per line
    <landing>/hdfs/2025-03-01/labels.csv              labels: id,label (any file with "labels")

The date folder is the day the data belongs to; it becomes the ``ingest_date`` partition of the
data root (parsers.storage), so an interval's files land in that interval's partitions.

Three steps, so that an orchestrator can run the middle one once per file (Airflow mapped tasks):

* :func:`find_interval_files` lists the files of the interval's days;
* :func:`ingest_file` ingests one file into its partition (part named after the file, written
  atomically: re-ingesting it replaces that part);
* :func:`finalize_interval` then removes every part of the interval's partitions that no listed
  file produced (a file deleted or renamed in the landing since an earlier run) and writes a
  ``_manifest.json`` per partition. Re-running an interval therefore leaves exactly the parts of
  the files that are there now: nothing duplicated, nothing stale.

Per-source options come from the catalogue, loaded once by the caller (parsers.sources: ``[sources.<name>]``: ``preset`` or
``formats`` and sessioning for logs, ``session_field`` / ``ts_field`` for events, the labels'
``label_id_column`` / ``label_column``, ``max_reject_share``). A landing folder of a source the
catalogue does not declare is ingested with the defaults: events by ``session_id`` and ``ts``,
logs only when the source is named like a log preset; label CSVs use their first two columns; a
file with more than 10 % rejected lines fails its task (only its rejects are written, with
reasons; no objects part).

Log files of one source share its Drain3 state (``<root>/state/drain3-<src>.json``). They are
ingested in parallel in three steps (parsers.parallel_ingest): :func:`mine_landing_file` per
file (parallel), :func:`merge_landing` (serial, small: the distinct masked contents only), then
:func:`ingest_file` per file (parallel) with the merged templates; the Drain3 state and every
line's template are those of a serial run in list order. :func:`prepare_formats` first fixes
the detected header of ``auto_header`` sources, from their first file.

Choice: labels are not date partitioned (a label may arrive days after its sequence); each
label file's part is named ``<date>_<stem>`` so that every day's ``labels.csv`` is kept.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path

from parsers import objectstore, storage
from parsers.sources import Source, SourceCatalog

log = logging.getLogger(__name__)

LOG_SUFFIXES = (".log", ".log.gz", ".txt", ".txt.gz")
EVENT_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson", ".ndjson.gz")
TABLE_SUFFIXES = (".csv", ".csv.gz", ".tsv", ".tsv.gz", ".parquet")
MANIFEST = "_manifest.json"


def source_spec(catalog: SourceCatalog | None, source: str, kind: str) -> Source:
    """The catalogue's ``[sources.<source>]``, or the defaults of an undeclared source of that
    ``kind`` ("logs" | "events" | "tables" | "texts"; a labels file takes its source's declared
    kind, else events). ``catalog``: the loaded catalogue (None: no source is declared)."""
    if catalog is not None and source in catalog.sources:
        spec = catalog.sources[source]
        if spec.formats:  # relative to the catalogue's folder, as its other paths
            spec = spec.model_copy(update={"formats": str(catalog.resolve_path(spec.formats))})
        return spec
    return Source(kind=kind if kind in ("logs", "tables", "texts") else "events")


def ingest_path(path: str | Path, root: str | Path, source: str, spec: Source, kind: str | None = None,
                ingest_date=None, part_stem: str | None = None, merged: bool = False) -> dict:
    """Ingest one raw file of ``source`` as its ``spec`` says: ``kind`` "logs" or "events" (default:
    the source's) writes objects, "labels" writes labels (``part_stem`` names their part). The one
    place that turns a source's declared options into the ingest functions' arguments, for
    ``seqenc ingest``, the demo and the landing DAG. ``merged``: a log file whose templates the
    parallel ingest's mine and merge steps decided (parsers.parallel_ingest): write it with them."""
    from parsers.events import ingest_events
    from parsers.log_ingest import ingest_logs
    from parsers.logs import ingest_labels
    from parsers.tables import ingest_table, ingest_text

    kind = kind or spec.kind
    if kind == "labels":
        return ingest_labels(path, root, source, id_column=spec.label_id_column, label_column=spec.label_column,
                             ingest_date=ingest_date, part_stem=part_stem)
    if kind == "events":
        return ingest_events(path, root, source=source, ingest_date=ingest_date, **spec.event_options())
    if kind == "tables":
        return ingest_table(path, root, source=source, ingest_date=ingest_date, **spec.table_options())
    if kind == "texts":
        return ingest_text(path, root, source=source, ingest_date=ingest_date, **spec.text_options())
    if kind != "logs":
        raise ValueError(f"unknown ingest kind {kind!r} for {path}; allowed: logs, events, tables, texts, labels")
    fmt, session = log_options(path, root, source, spec)
    frozen = None
    if merged:
        from parsers.parallel_ingest import frozen_templates

        frozen = frozen_templates(root, source, ingest_date, path)
    return ingest_logs(path, root, source=source, preset=fmt, ingest_date=ingest_date, session=session,
                       max_reject_share=spec.max_reject_share, frozen=frozen)


def log_options(path: str | Path, root: str | Path, source: str, spec: Source):
    """``(format, session)`` of a log source's file as its spec declares them (session None:
    the format's own grouping)."""
    from parsers.sessions import SessionSpec

    session = None
    if spec.session_id:
        session = SessionSpec(id_pattern=spec.session_id)
    elif spec.window:
        session = SessionSpec(field=spec.session_field, window_s=spec.window, step_s=spec.step)
    return log_format(path, root, source, spec), session


def log_format(path: str | Path, root: str | Path, source: str, spec: Source):
    """A log source's format: its declared ``preset``; else a format of its ``formats`` file
    named like the source; else the preset named like it; else, with ``auto_header``, a header
    detected from the first lines of the source's first file (parsers.header_detect), kept in
    ``<root>/state/format-<source>.json`` for its later files (delete it to detect again); the
    ingest report names the format (``"format": "auto"``) and its header."""
    from parsers.header_detect import read_sample, suggest_header
    from parsers.presets import PRESETS, LogFormat, load_formats, resolve

    if spec.preset:
        return resolve(spec.preset, spec.formats)
    user = load_formats(spec.formats) if spec.formats else {}
    if source in user:
        return user[source]
    if source in PRESETS:
        return PRESETS[source]
    if spec.auto_header:
        saved = storage.detected_format_path(root, source)
        if saved.exists():  # the source's first file decided: later files split into the same fields
            return LogFormat.from_dict({**json.loads(saved.read_text(encoding="utf-8")), "name": "auto"})
        suggestion = suggest_header(read_sample(path))
        log.info("%s: no preset or format for source %r; detected header %r (%.1f%% of the sample)", path, source,
                 suggestion.header, 100 * suggestion.coverage)
        storage.write_bytes_atomic(json.dumps(suggestion.format_spec()).encode(), saved)
        return suggestion.log_format("auto")
    raise ValueError(f"log source {source!r} has no log format: give it a preset (one of {', '.join(sorted(PRESETS))}) "
                     "or a format named like it (--formats, or formats in the catalogue), or detect one with "
                     "--auto-header (auto_header = true in the catalogue)")


def interval_days(start: dt.date | dt.datetime | str, end: dt.date | dt.datetime | str | None = None) -> list[str]:
    """The days ``YYYY-MM-DD`` of the interval [start, end); an empty interval (end <= start, or
    no end) is the start's day alone."""
    first = dt.date.fromisoformat(storage.ingest_date_str(start))
    last = dt.date.fromisoformat(storage.ingest_date_str(end)) if end is not None else first
    n = max(1, (last - first).days)
    return [(first + dt.timedelta(days=i)).isoformat() for i in range(n)]


def file_kind(path: str | Path, declared: str | None = None) -> str | None:
    """``"labels"``, ``"logs"``, ``"events"``, ``"tables"``, ``"texts"`` or None (not ours:
    ignored). ``declared``: the source's kind in the catalogue; a tables source takes its
    ``.csv`` / ``.tsv`` / ``.parquet`` files as tables -- every one, ``labels.csv`` included: a
    table is never a label file (tables carry no labels; their texts do) -- and a texts source its
    text and JSON Lines files as texts."""
    name = Path(path).name.lower()
    if name.startswith(".") or name.startswith("_"):
        return None  # hidden files and markers (e.g. _SUCCESS) are not data
    if declared == "tables":
        return "tables" if name.endswith(TABLE_SUFFIXES) else None
    if "labels" in name and name.endswith(".csv"):
        return "labels"
    if declared == "texts":
        return "texts" if name.endswith(LOG_SUFFIXES + EVENT_SUFFIXES) else None
    if name.endswith(LOG_SUFFIXES):
        return "logs"
    if name.endswith(EVENT_SUFFIXES):
        return "events"
    return None


def find_interval_files(landing: str | Path, days: list[str], catalog: SourceCatalog | None = None) -> list[dict]:
    """``{"path", "source", "date", "kind"}`` of every data file of the days, sorted by source,
    date and name; files of unknown types are logged and left alone. A source the catalogue
    declares as tables or texts gets its files read as such (:func:`file_kind`)."""
    landing = Path(landing)
    found = []
    if not landing.is_dir():
        raise FileNotFoundError(f"landing directory {landing} does not exist")
    sources = catalog.sources if catalog is not None else {}
    for source_dir in sorted(p for p in landing.iterdir() if p.is_dir()):
        declared = sources[source_dir.name].kind if source_dir.name in sources else None
        for day in days:
            day_dir = source_dir / day
            if not day_dir.is_dir():
                continue
            for path in sorted(p for p in day_dir.iterdir() if p.is_file()):
                kind = file_kind(path, declared)
                if kind is None:
                    log.warning("landing: ignoring %s (not a log, events, table, text or labels file)", path)
                    continue
                found.append({"path": str(path), "source": source_dir.name, "date": day, "kind": kind})
    return found


def _label_stem(item: dict) -> str:
    """A label file's part stem: ``<date>_<file stem>`` (every day's ``labels.csv`` is kept)."""
    return f"{item['date']}_{Path(item['path']).name.removesuffix('.gz').rsplit('.', 1)[0]}"


def part_of(item: dict) -> str:
    """The part file a landing file writes: objects (and rejects) for logs and events, labels
    (and rejects) for label files."""
    return storage.part_name(_label_stem(item) + ".csv" if item["kind"] == "labels" else item["path"])


def prepare_formats(files: list[dict], root: str | Path, catalog: SourceCatalog | None = None) -> None:
    """Before log files are mined in parallel: detect and keep the header of every
    ``auto_header`` log source of ``files`` that has none yet, from its first file in list order
    -- the file a serial run would have detected it from (:func:`log_format`)."""
    seen = set()
    for item in files:
        if item["kind"] != "logs" or item["source"] in seen:
            continue
        seen.add(item["source"])
        spec = source_spec(catalog, item["source"], "logs")
        if spec.auto_header:
            log_format(item["path"], root, item["source"], spec)


def mine_landing_file(item: dict, root: str | Path, catalog: SourceCatalog | None = None) -> dict:
    """Parallel ingest, step 1 for one file (parsers.parallel_ingest.mine_file): a log file is
    mined and comes back with ``"mined": true``; other files come back as they are. A log file
    that cannot be mined (no format, unreadable) comes back with ``"mined": false`` and the
    error, so that one bad file does not hold up the interval: :func:`ingest_file` then ingests
    it serially, and its task fails with the same error while the other files are written."""
    if item["kind"] != "logs":
        return item
    from parsers.parallel_ingest import mine_file

    try:
        spec = source_spec(catalog, item["source"], "logs")
        fmt, session = log_options(item["path"], root, item["source"], spec)
        report = mine_file(item["path"], root, item["source"], fmt, item["date"], session)
    except Exception as err:  # noqa: BLE001 -- the file's own ingest task raises it again, alone
        log.warning("landing: %s not mined (%s: %s); its ingest task takes it on its own", item["path"],
                    type(err).__name__, err)
        return {**item, "mined": False, "mine_error": f"{type(err).__name__}: {err}"}
    return {**item, "mined": True, "distinct": report["distinct"]}


def merge_landing(items: list[dict], root: str | Path, catalog: SourceCatalog | None = None) -> list[dict]:
    """Parallel ingest, step 2: per source, the mined files' contents into its Drain3 state in
    list order (parsers.parallel_ingest.merge_mined); returns ``items`` for the write step (a
    source whose merge failed has its files marked unmined: each is then ingested serially, and
    fails alone)."""
    from parsers.parallel_ingest import merge_mined

    by_source: dict[str, list[dict]] = {}
    for item in items:
        if item.get("mined"):
            by_source.setdefault(item["source"], []).append(item)
    failed = set()
    for source, group in by_source.items():
        try:
            fmt, _ = log_options(group[0]["path"], root, source, source_spec(catalog, source, "logs"))
            merge_mined([(g["path"], g["date"]) for g in group], root, source, fmt)
        except Exception as err:  # noqa: BLE001 -- e.g. a broken Drain3 state: this source's files fail alone
            log.warning("landing: merging source %s failed (%s: %s); its files are ingested serially", source,
                        type(err).__name__, err)
            failed.add(source)
    return [{**item, "mined": False} if item.get("mined") and item["source"] in failed else item for item in items]


def ingest_file(item: dict, root: str | Path, catalog: SourceCatalog | None = None) -> dict:
    """Ingest one file found by :func:`find_interval_files` into the data root, with its source's
    options from ``catalog`` (the loaded catalogue, parsers.sources.SourceCatalog; None: every
    source takes its kind's defaults); returns the ingest report plus ``path, source,
    date, kind, part``. A log file that :func:`merge_landing` merged (``"mined": true``) is
    written with the merged templates (parallel ingest, step 3), without the source's lock."""
    source, day, path, kind = item["source"], item["date"], Path(item["path"]), item["kind"]
    spec = source_spec(catalog, source, kind)
    stem = _label_stem(item) if kind == "labels" else None
    report = ingest_path(path, root, source, spec, kind, ingest_date=day, part_stem=stem,
                         merged=bool(item.get("mined")))
    out = json.loads(json.dumps(report, default=str))
    return {**out, "path": str(path), "source": source, "date": day, "kind": kind, "part": part_of(item)}


def _landing_parts(partition: Path) -> set[str]:
    """The object and reject parts an earlier landing run wrote in a partition (its manifest)."""
    path = partition / MANIFEST
    if not path.is_file():
        return set()
    manifest = json.loads(path.read_text(encoding="utf-8"))
    return set(manifest.get("parts", [])) | set(manifest.get("reject_parts", []))


def finalize_interval(root: str | Path, days: list[str], files: list[dict]) -> dict:
    """Remove the parts of the days' object and reject partitions that an earlier landing run
    wrote (their ``_manifest.json`` lists them) and none of ``files`` produced now (a file
    withdrawn from the landing), and write each partition's manifest; returns what was kept and
    removed. A part the landing never wrote (a manual ``seqenc ingest`` into the same root) is
    never touched."""
    root = objectstore.as_path(root)
    expected: dict[tuple[str, str], set[str]] = {}  # objects parts
    expected_rejects: dict[tuple[str, str], set[str]] = {}  # label files' rejects too
    for item in files:
        key, part = (item["source"], item["date"]), part_of(item)
        expected_rejects.setdefault(key, set()).add(part)
        if item["kind"] != "labels":
            expected.setdefault(key, set()).add(part)
    sources = {item["source"] for item in files}
    for table in ("objects", "rejects"):
        sources |= {p.name.split("=", 1)[1] for p in (root / table).glob("source=*")}
    removed, kept = [], {}
    for source in sorted(sources):
        for day in days:
            wanted = expected.get((source, day), set())
            wanted_rejects = expected_rejects.get((source, day), set())
            partition = storage.objects_dir(root, source) / f"ingest_date={day}"
            ours = _landing_parts(partition)
            for folder, keep in ((storage.objects_dir(root, source), wanted),
                                 (storage.rejects_dir(root, source), wanted_rejects)):
                for part in sorted((folder / f"ingest_date={day}").glob("part-*.parquet")):
                    if part.name not in keep and part.name in ours:
                        part.unlink()
                        removed.append(str(part))
            if wanted or partition.is_dir():
                partition.mkdir(parents=True, exist_ok=True)
                inputs = sorted(f["path"] for f in files if f["source"] == source and f["date"] == day
                                and f["kind"] != "labels")
                manifest = {"source": source, "ingest_date": day, "parts": sorted(wanted),
                            "reject_parts": sorted(wanted_rejects), "inputs": inputs}
                storage.write_bytes_atomic(json.dumps(manifest, indent=2).encode(), partition / MANIFEST)
                kept[f"{source}/{day}"] = sorted(wanted)
    if removed:
        log.info("landing: removed %d stale parts: %s", len(removed), removed)
    from parsers.parallel_ingest import clear_mined

    for source, day in sorted({(f["source"], f["date"]) for f in files if f["kind"] == "logs"}):
        clear_mined(root, source, day)  # the parallel ingest's maps: every file is written now
    return {"days": days, "kept": kept, "removed": removed, "files": len(files)}
