"""``seqenc ingest logs | events | table | text``: raw files of a source -> Parquet objects.

A source declared in the catalogue is ingested with its declared options, options given on the
command line on top (parsers.landing.source_spec / ingest_path: the same path as the landing
DAG's). Log files are taken one after the other, or with ``--workers N`` (several files) mined
and written by N processes (parsers.parallel_ingest).
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

from parsers.objectstore import as_path, is_remote

log = logging.getLogger(__name__)


def _run_ingest(fn) -> int:
    """Print the run report; exit 3 when the reject share passed --max-reject-share."""
    from parsers.storage import RejectShareExceeded

    try:
        report = fn()
    except RejectShareExceeded as exc:
        print(json.dumps(exc.report, indent=2, default=str))
        logging.getLogger("seqenc").error("%s", exc)
        return 3
    print(json.dumps(report, indent=2, default=str))
    return 0


def _source_spec(args, catalog, kind: str):
    """The catalogue's options for ``--source`` (or an undeclared source's defaults), with the
    options given on the command line on top."""
    from parsers.landing import source_spec

    spec = source_spec(catalog, args.source, kind)
    if spec.kind != kind:
        raise ValueError(f"source {args.source!r} is declared as {spec.kind} in the catalogue; use "
                         f"seqenc ingest {spec.kind}")
    given = {name: getattr(args, name) for name in ("preset", "formats", "auto_header", "session_field", "ts_field",
                                                    "label_id_column", "label_column", "max_reject_share",
                                                    "delimiter", "text_field", "id_field", "text_units",
                                                    "label_field")
             if getattr(args, name, None) is not None}
    if getattr(args, "session_id", None):
        given["session_id"] = args.session_id
    if getattr(args, "window", None):
        given.update(window=args.window, step=args.step, session_id=None)
    return spec.model_validate({**spec.model_dump(), **given})


def _input_files(args, catalog, spec, scratch: Path) -> list[str]:
    """FILE(s), else the files the catalogue's ``path`` (a file, glob or folder; ``s3://`` too)
    names. Raw files on S3 are downloaded into ``scratch`` first (:func:`_fetch`)."""
    if args.file:
        return [_fetch(f, scratch, "input") for f in (args.file if isinstance(args.file, list) else [args.file])]
    if not spec.path:
        raise ValueError(f"no input: give FILE, or a path for source {args.source!r} in the catalogue")
    where = catalog.resolve_path(spec.path)
    files = sorted(p for p in (where.iterdir() if where.is_dir() else where.parent.glob(where.name)) if p.is_file())
    if not files:
        raise FileNotFoundError(f"source {args.source!r}: its catalogue path {where} matches no file")
    return [_fetch(str(p), scratch, "input") for p in files]


def _fetch(path: str, scratch: Path, folder: str) -> str:
    """A raw file: local as given; an ``s3://`` one downloaded to ``scratch/folder/<its name>``.
    The name is kept because it names the part and a table's or text's id, as on disk."""
    if not is_remote(path):
        return path
    local = scratch / folder / as_path(path).name
    local.parent.mkdir(parents=True, exist_ok=True)
    if local.exists():
        raise ValueError(f"two raw files named {local.name}: one would overwrite the other; rename one")
    as_path(path).download(local)
    log.info("downloaded %s to %s", path, local)
    return str(local)


def _ingest(args, kind: str) -> int:
    from training.tasks.catalog import load_catalog

    catalog = load_catalog(args.catalog)  # resolved once, here
    spec = _source_spec(args, catalog, kind)
    with tempfile.TemporaryDirectory(prefix="seqenc-raw-") as scratch:  # raw files fetched from S3, if any
        return _ingest_files(args, kind, catalog, spec, Path(scratch))


def _ingest_files(args, kind: str, catalog, spec, scratch: Path) -> int:
    from parsers.landing import ingest_path

    files = _input_files(args, catalog, spec, scratch)
    _refuse_shared_parts(files)
    code = 0
    if kind == "logs" and getattr(args, "workers", 1) > 1 and len(files) > 1:
        code = _run_ingest(lambda: _ingest_parallel(args, spec, files))
    else:
        for path in files:
            code = max(code, _run_ingest(lambda p=path: ingest_path(p, args.root, args.source, spec, kind,
                                                                     ingest_date=args.date)))
    labels = args.labels or (str(catalog.resolve_path(spec.labels)) if spec.labels else None)
    if labels:
        report = ingest_path(_fetch(labels, scratch, "labels"), args.root, args.source, spec, "labels",
                             ingest_date=args.date)
        print(json.dumps({"labels": report}, indent=2, default=str))
    return code


def _refuse_shared_parts(files: list[str]) -> None:
    """Two files of one command that would write the same part (the same file name from two
    folders, or ``x.csv`` beside ``x.csv.gz``) would overwrite each other -- and a table's id, a
    text's default id, is its file name, so their sequences would merge: refused before anything
    is written."""
    from parsers.storage import part_name

    first: dict[str, str] = {}
    for path in files:
        other = first.setdefault(part_name(path), path)
        if other != path:
            raise ValueError(f"{other} and {path} have the same file name, which names their part (and a table's or "
                             "a text's id): one would overwrite the other; rename one, or ingest them into different "
                             "sources")


def _ingest_parallel(args, spec, files: list[str]) -> dict:
    """Log files of one source with ``--workers`` processes: mine, merge, write
    (parsers.parallel_ingest; the same templates and grouping as one file after the other)."""
    from parsers.landing import log_options
    from parsers.parallel_ingest import ingest_parallel

    fmt, session = log_options(files[0], args.root, args.source, spec)
    return ingest_parallel(files, args.root, args.source, fmt, ingest_date=args.date, session=session,
                           max_reject_share=spec.max_reject_share, workers=args.workers)


def cmd_ingest_logs(args) -> int:
    return _ingest(args, "logs")


def cmd_ingest_events(args) -> int:
    return _ingest(args, "events")


def cmd_ingest_table(args) -> int:
    return _ingest(args, "tables")


def cmd_ingest_text(args) -> int:
    return _ingest(args, "texts")


def add_ingest_parser(sub) -> None:
    """``seqenc ingest logs | events | table | text``, added to the CLI's sub-parsers."""
    from training.cli.args import positive_int

    ingest = sub.add_parser("ingest", help="turn raw logs, JSON events, tables or texts into Parquet key-value objects",
                            description="A source declared in the catalogue (--catalog, $SEQENC_CATALOG) is "
                            "ingested with its declared options; options given here win.")
    isub = ingest.add_subparsers(dest="kind", required=True)
    logs = isub.add_parser("logs", help="raw log file -> Drain3 templates and named parameters")
    logs.add_argument("file", nargs="*", metavar="FILE",
                      help="raw log file(s) (default: the files of the source's catalogue path)")
    logs.add_argument("--root", required=True, help="data root (Parquet layout: docs/data-layout.md)")
    logs.add_argument("--source", required=True, help="source name (partition key; [A-Za-z0-9_.-])")
    logs.add_argument("--preset", default=None,
                      help="log format: hdfs, hadoop, spark, zookeeper, bgl, hpc, linux, syslog, thunderbird, "
                           "openstack, apache, or a name from --formats (default: the catalogue's, else the "
                           "preset named like the source)")
    logs.add_argument("--formats", default=None, metavar="JSON",
                      help="user log formats (see parsers/presets.py: load_formats); one named like the source is "
                           "used when no --preset is given")
    logs.add_argument("--auto-header", action="store_true", default=None,
                      help="a source with neither preset nor format: detect the header from the file's first "
                           "lines (seqenc logformat suggest shows what it finds)")
    logs.add_argument("--date", default=None, help="ingest date partition (YYYY-MM-DD, default today)")
    logs.add_argument("--session-id", default=None, metavar="REGEX",
                      help="group lines by the ids this regex finds in the content (default: the format's)")
    logs.add_argument("--session-field", default=None, metavar="FIELD",
                      help="with --window: group by this header field (e.g. Node) and time window")
    logs.add_argument("--window", type=float, default=None, metavar="SECONDS", help="time-window length")
    logs.add_argument("--step", type=float, default=None, metavar="SECONDS",
                      help="window start every STEP seconds (< window: sliding; default: fixed windows)")
    logs.add_argument("--workers", type=positive_int, default=1, metavar="N",
                      help="with several files: N processes mine and write them in parallel, one serial merge of "
                           "their templates in between (same templates and grouping as one file after the other)")
    events = isub.add_parser("events", help="JSON Lines events (optionally .gz) -> flattened dotted keys")
    events.add_argument("file", nargs="?", help="JSON Lines file (.jsonl, .json, .ndjson, optionally .gz; default: "
                        "the files of the source's catalogue path)")
    events.add_argument("--root", required=True, help="data root (Parquet layout: docs/data-layout.md)")
    events.add_argument("--source", required=True, help="source name (partition key; [A-Za-z0-9_.-])")
    events.add_argument("--session-field", default=None, metavar="FIELD",
                        help="field whose value is the sequence id, dotted for nested objects (default: the "
                        "catalogue's, else session_id)")
    events.add_argument("--ts-field", default=None, metavar="FIELD",
                        help="time field (default: the catalogue's, else ts)")
    events.add_argument("--date", default=None, help="ingest date partition (YYYY-MM-DD, default today)")
    table = isub.add_parser("table", help="table file(s) -> one sequence each: rows are the objects, columns the "
                            "keys, cells the values (parsers.tables)")
    table.add_argument("file", nargs="*", metavar="FILE", help=".csv / .tsv (any delimiter, optionally .gz) or "
                       ".parquet tables, header row first (default: the files of the source's catalogue path)")
    table.add_argument("--delimiter", default=None, metavar="CHAR",
                       help="cell delimiter (default: the catalogue's, else sniffed from the first lines; TabFact: #)")
    text = isub.add_parser("text", help="text file(s) -> one sequence per text, one object per unit (parsers.tables)")
    text.add_argument("file", nargs="*", metavar="FILE", help="JSON Lines records (.jsonl, .json, .ndjson) or plain "
                      "text (.txt: the whole file one text), optionally .gz")
    text.add_argument("--text-field", default=None, metavar="FIELD", help="the record field holding the text "
                      "(default: the catalogue's, else text)")
    text.add_argument("--id-field", default=None, metavar="FIELD",
                      help="the record field naming the text (default: FILE:LINE)")
    text.add_argument("--units", dest="text_units", default=None, choices=("none", "sentences", "lines"),
                      help="cut each text into objects: whole (none, the default), by sentence or by line")
    text.add_argument("--label-field", default=None, metavar="FIELD",
                      help="the record field holding its label: written to the source's labels, not an object")
    for p in (table, text):
        p.add_argument("--root", required=True, help="data root (Parquet layout: docs/data-layout.md)")
        p.add_argument("--source", required=True, help="source name (partition key; [A-Za-z0-9_.-])")
        p.add_argument("--date", default=None, help="ingest date partition (YYYY-MM-DD, default today)")
    for p in (logs, events, table, text):
        p.add_argument("--catalog", default=None, metavar="TOML",
                       help="catalogue declaring the source (default: $SEQENC_CATALOG, else the built-in one)")
        p.add_argument("--max-reject-share", type=float, default=None, metavar="SHARE",
                       help="exit with code 3 when more than this share of lines is rejected (default: the "
                            "catalogue's, else 0.1); outputs and rejects are written either way")
        p.add_argument("--labels", default=None, metavar="CSV", help="labels CSV (with a header row) of the sequences")
        p.add_argument("--label-id-column", default=None, metavar="COL",
                       help="the labels' sequence id column (default: the catalogue's, else the first)")
        p.add_argument("--label-column", default=None, metavar="COL",
                       help="the labels' label column (default: the catalogue's, else the second)")
    logs.set_defaults(func=cmd_ingest_logs)
    events.set_defaults(func=cmd_ingest_events)
    table.set_defaults(func=cmd_ingest_table)
    text.set_defaults(func=cmd_ingest_text)
