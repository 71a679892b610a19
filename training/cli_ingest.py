"""``seqenc ingest logs`` and ``seqenc ingest events``: raw files of a source -> Parquet objects.

A source declared in the catalogue is ingested with its declared options, options given on the
command line on top (parsers.landing.source_spec / ingest_path: the same path as the landing
DAG's). Log files are taken one after the other, or with ``--workers N`` (several files) mined
and written by N processes (parsers.parallel_ingest).
"""

from __future__ import annotations

import json
import logging


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


def _source_spec(args, kind: str):
    """The catalogue's options for ``--source`` (or an undeclared source's defaults), with the
    options given on the command line on top."""
    from parsers.landing import source_spec

    spec = source_spec(args.catalog, args.source, kind)
    if spec.kind != kind:
        raise ValueError(f"source {args.source!r} is declared as {spec.kind} in the catalogue; use "
                         f"seqenc ingest {spec.kind}")
    given = {name: getattr(args, name) for name in ("preset", "formats", "auto_header", "session_field", "ts_field",
                                                    "label_id_column", "label_column", "max_reject_share")
             if getattr(args, name, None) is not None}
    if getattr(args, "session_id", None):
        given["session_id"] = args.session_id
    if getattr(args, "window", None):
        given.update(window=args.window, step=args.step, session_id=None)
    return spec.model_validate({**spec.model_dump(), **given})


def _input_files(args, spec) -> list[str]:
    """FILE(s), else the files the catalogue's ``path`` (a file, glob or folder) names."""
    if args.file:
        return list(args.file) if isinstance(args.file, list) else [args.file]
    if not spec.path:
        raise ValueError(f"no input: give FILE, or a path for source {args.source!r} in the catalogue")
    from seqenc.catalog import load_catalog

    where = load_catalog(args.catalog).resolve_path(spec.path)
    files = sorted(p for p in (where.iterdir() if where.is_dir() else where.parent.glob(where.name)) if p.is_file())
    if not files:
        raise FileNotFoundError(f"source {args.source!r}: its catalogue path {where} matches no file")
    return [str(p) for p in files]


def _ingest(args, kind: str) -> int:
    from parsers.landing import ingest_path

    spec = _source_spec(args, kind)
    files = _input_files(args, spec)
    code = 0
    if kind == "logs" and getattr(args, "workers", 1) > 1 and len(files) > 1:
        code = _run_ingest(lambda: _ingest_parallel(args, spec, files))
    else:
        for path in files:
            code = max(code, _run_ingest(lambda p=path: ingest_path(p, args.root, args.source, spec, kind,
                                                                     ingest_date=args.date)))
    labels = args.labels or (str(_catalog_path(args, spec.labels)) if spec.labels else None)
    if labels:
        report = ingest_path(labels, args.root, args.source, spec, "labels", ingest_date=args.date)
        print(json.dumps({"labels": report}, indent=2, default=str))
    return code


def _ingest_parallel(args, spec, files: list[str]) -> dict:
    """Log files of one source with ``--workers`` processes: mine, merge, write
    (parsers.parallel_ingest; the same templates and grouping as one file after the other)."""
    from parsers.landing import log_options
    from parsers.parallel_ingest import ingest_parallel

    fmt, session = log_options(files[0], args.root, args.source, spec)
    return ingest_parallel(files, args.root, args.source, fmt, ingest_date=args.date, session=session,
                           max_reject_share=spec.max_reject_share, workers=args.workers)


def _catalog_path(args, path: str):
    from seqenc.catalog import load_catalog

    return load_catalog(args.catalog).resolve_path(path)


def cmd_ingest_logs(args) -> int:
    return _ingest(args, "logs")


def cmd_ingest_events(args) -> int:
    return _ingest(args, "events")
