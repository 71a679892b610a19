"""Log ingest of many files of one source in parallel: mine, merge, write.

The serial ingest (parsers.log_ingest) takes a source's files one at a time under the source's
lock, because Drain3 learns from the lines in order and its state is one file per source. Here
the work that does not touch that state runs in parallel, and only the part that does is
serial -- and small:

1. **mine** (:func:`mine_file`, one task per file, in parallel): read the file and keep the
   lines that would reach Drain3 (the same header, timestamp and session filters as the serial
   ingest: parsers.log_ingest ``Learner.place``); mask their contents and keep only the
   *distinct* masked contents, in order of first appearance, with their counts, in
   ``<root>/state/mined/source=<src>/ingest_date=<day>/<part>.contents.parquet``. Nothing of
   the source's state is read or written.
2. **merge** (:func:`merge_mined`, one serial step per source, under the source's lock): load
   the Drain3 state and send each file's distinct contents to ``add_log_message``, file by file
   in the order given, with a fresh cache per file. These are exactly the calls a serial ingest
   of the files in that order makes (it, too, sends each distinct masked content of a file to
   Drain3 once, in first-seen order), so the Drain3 state afterwards -- templates and cluster
   ids -- and every content's cluster are the serial run's. Each file's cluster map (content ->
   cluster id -> template) is written beside its contents (``<part>.clusters.parquet``); then
   the state is saved.
3. **write** (:func:`write_file`, one task per file, in parallel): the ordinary ingest with that
   map frozen (parsers.log_ingest.FrozenTemplates): the same rows, sessions, steps, rejects
   and reject-share gate, without searching Drain3, reading its state or taking the lock.

Same as a serial run of the files in the same order: the Drain3 state after the run and the
template id of every object (its grouping). Different, by choice: the slots of every file are
extracted against the templates as they stand after the whole batch was merged, where the
serial ingest of an earlier file used the templates of its own time. Templates only
generalise, so a token that a later file of the same night turns into ``<*>`` becomes a slot
in every file of the night, not only in the later ones.

Cost: each file is read and masked twice (mine, write), so one worker is slower than the serial
ingest; the gain comes with several workers -- and with several machines, as Airflow mapped
tasks (dags/seqenc_ingest.py). A single file is not split: parallelism is across files (rotate
logs by hour or size to use it). The merge's work grows with the distinct masked contents, not
with the lines. The mined files stay until :func:`clear_mined` (the landing's finalize, or
:func:`ingest_parallel` at its end), so a retried write step finds its map.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import polars as pl
import pyarrow as pa

from parsers import storage
from parsers.log_ingest import FrozenTemplates, Learner, ingest_logs
from parsers.logs import LineParser, events_of
from parsers.presets import LogFormat, resolve
from parsers.resources import peak_rss_mb
from parsers.sessions import SessionSpec

logger = logging.getLogger(__name__)

CONTENTS_SCHEMA = pa.schema([("content", pa.string()), ("count", pa.int64())])
CLUSTERS_SCHEMA = pa.schema([("content", pa.string()), ("cluster_id", pa.int64()), ("template", pa.string())])


def mined_paths(root, source: str, ingest_date, log_path) -> tuple[Path, Path]:
    """(distinct contents, cluster map) of one file:
    ``<root>/state/mined/source=<src>/ingest_date=<day>/<part>.{contents,clusters}.parquet``."""
    folder = storage.mined_dir(root, source) / f"ingest_date={storage.ingest_date_str(ingest_date)}"
    stem = storage.part_name(log_path).removesuffix(".parquet")
    return folder / f"{stem}.contents.parquet", folder / f"{stem}.clusters.parquet"


def mine_file(log_path, root, source: str, preset: str | LogFormat, ingest_date=None,
              session: SessionSpec | None = None, batch_lines: int = 200_000) -> dict:
    """Step 1: the distinct masked contents of the lines of ``log_path`` that reach Drain3, in
    first-seen order with their counts, written for :func:`merge_mined`. Returns
    ``{"path", "contents_path", "lines", "distinct", "seconds", "peak_rss_mb"}`` (of the
    process so far: in a worker, its peak over the tasks it ran)."""
    start = time.perf_counter()
    fmt = resolve(preset)
    learner = Learner(fmt, session or fmt.session_spec(), LineParser(fmt, None))
    reader = storage.LineReader(log_path, learner.rejects)  # the write step records the rejects
    counts: dict[str, int] = {}  # insertion order = order of first appearance in the file
    for lines in reader.frames(batch_lines):
        good, _ = learner.place(lines)
        for text, n in good.group_by("masked", maintain_order=True).len().iter_rows():
            counts[text] = counts.get(text, 0) + n
    contents_path, _ = mined_paths(root, source, ingest_date, log_path)
    storage.write_parquet_atomic(pa.table({"content": list(counts), "count": list(counts.values())},
                                          schema=CONTENTS_SCHEMA), contents_path)
    return {"path": str(log_path), "contents_path": str(contents_path), "lines": learner.parsed,
            "distinct": len(counts), "seconds": round(time.perf_counter() - start, 3),
            "peak_rss_mb": round(peak_rss_mb(), 1)}


def merge_mined(files: list, root, source: str, preset: str | LogFormat) -> dict:
    """Step 2: the mined contents of ``files`` (``(log_path, ingest_date)`` pairs) into the
    source's Drain3 state, file by file in that order; writes each file's cluster map, then
    saves the state. Returns ``{"files", "distinct", "templates", "new_templates", "seconds"}``."""
    start = time.perf_counter()
    fmt = resolve(preset)
    with storage.source_lock(root, source):
        parser = LineParser(fmt, storage.drain_state_path(root, source))
        drain = parser.miner.drain
        before = len(drain.clusters)
        maps, distinct = [], 0
        for log_path, ingest_date in files:
            contents_path, clusters_path = mined_paths(root, source, ingest_date, log_path)
            if not contents_path.exists():
                raise FileNotFoundError(f"{log_path} was not mined ({contents_path} is missing): run the mine "
                                        "step for every file before the merge")
            mined = pl.from_arrow(storage.read_table(contents_path))  # a local path or an s3:// key
            n_before, clusters = len(drain.clusters), {}
            parser._clusters.clear()  # fresh per file, as the serial ingest's cache
            for text, count in mined.iter_rows():
                clusters[text] = parser.cluster(text, count)
            ids = {text: c.cluster_id for text, c in clusters.items()}
            # word splits are decided per file, after its contents, as the serial ingest does
            events = events_of(parser.miner, clusters) if fmt.split_words > 0 else {}
            ids |= {text: eid for text, (eid, _) in events.items()}
            maps.append((clusters_path, ids, len(drain.clusters) - n_before,
                         {eid: template for eid, template in events.values()}))
            distinct += mined.height
        templates = {c.cluster_id: c.get_template() for c in drain.clusters}
        for clusters_path, ids, new, event_templates in maps:
            known = templates | event_templates
            table = pa.table({"content": list(ids), "cluster_id": list(ids.values()),
                              "template": [known[c] for c in ids.values()]}, schema=CLUSTERS_SCHEMA)
            table = table.replace_schema_metadata({"new_templates": str(new), "total_templates": str(len(templates))})
            storage.write_parquet_atomic(table, clusters_path)
        parser.miner.save_state(f"merge {len(maps)} mined files")
    report = {"files": len(maps), "distinct": distinct, "templates": len(templates),
              "new_templates": len(templates) - before, "seconds": round(time.perf_counter() - start, 3)}
    logger.info("merged %s: %s", source, report)
    return report


def frozen_templates(root, source: str, ingest_date, log_path) -> FrozenTemplates:
    """The cluster map :func:`merge_mined` wrote for ``log_path``."""
    _, clusters_path = mined_paths(root, source, ingest_date, log_path)
    if not clusters_path.exists():
        raise FileNotFoundError(f"{log_path} has no merged templates ({clusters_path} is missing): run the mine "
                                "and merge steps first")
    table = storage.read_table(clusters_path)
    meta = table.schema.metadata or {}
    frame = pl.from_arrow(table)
    return FrozenTemplates(clusters=dict(zip(frame["content"].to_list(), frame["cluster_id"].to_list())),
                           templates=dict(zip(frame["cluster_id"].to_list(), frame["template"].to_list())),
                           new_templates=int(meta.get(b"new_templates", 0)),
                           total_templates=int(meta.get(b"total_templates", 0)))


def write_file(log_path, root, source: str, preset: str | LogFormat, ingest_date=None,
               session: SessionSpec | None = None, max_reject_share: float | None = None,
               batch_lines: int = 200_000) -> dict:
    """Step 3: ingest ``log_path`` with the clusters the merge decided (the report of
    parsers.log_ingest.ingest_logs, with the process's ``peak_rss_mb``)."""
    report = ingest_logs(log_path, root, source=source, preset=preset, ingest_date=ingest_date, session=session,
                         max_reject_share=max_reject_share, batch_lines=batch_lines,
                         frozen=frozen_templates(root, source, ingest_date, log_path))
    return {**report, "peak_rss_mb": round(peak_rss_mb(), 1)}


def clear_mined(root, source: str, ingest_date=None) -> None:
    """Remove the mined files of one day (``ingest_date``) or of every day of ``source``."""
    folder = storage.mined_dir(root, source)
    if ingest_date is not None:
        folder = folder / f"ingest_date={storage.ingest_date_str(ingest_date)}"
    for path in sorted(folder.rglob("*.parquet"), reverse=True) if folder.exists() else ():
        path.unlink()
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True) if folder.exists() else ():
        sub.rmdir()
    if folder.exists():
        folder.rmdir()


def ingest_parallel(log_paths: list, root, source: str = "hdfs", preset: str | LogFormat = "hdfs", ingest_date=None,
                    session: SessionSpec | None = None, max_reject_share: float | None = None, workers: int = 2,
                    batch_lines: int = 200_000) -> dict:
    """Mine, merge and write ``log_paths`` (one source, one day) with ``workers`` processes.

    Each worker process gets ``cpu_count // workers`` (at least 1) polars threads. Returns
    ``{"files": [write reports in input order], "mine": [...], "merge": {...}, "read", "rows",
    "rejected", "workers", "workers_peak_rss_mb" (the largest worker's peak), "seconds"}``. A file over the reject share raises
    parsers.storage.RejectShareExceeded after the other files are written."""
    start = time.perf_counter()
    fmt = resolve(preset)
    paths = [str(p) for p in log_paths]
    if len(set(map(storage.part_name, paths))) != len(paths):
        raise ValueError("two input files map to the same part name; give files with distinct names")
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"no such file: {', '.join(missing)}")
    common = {"root": str(root), "source": source, "preset": fmt, "ingest_date": ingest_date, "session": session,
              "batch_lines": batch_lines}
    try:
        with _pool(workers) as pool:
            mined = [f.result() for f in [pool.submit(mine_file, p, **common) for p in paths]]
            merged = merge_mined([(p, ingest_date) for p in paths], root, source, fmt)
            futures = [pool.submit(write_file, p, **common, max_reject_share=max_reject_share) for p in paths]
            outcomes = []
            for f in futures:
                try:
                    outcomes.append(f.result())
                except storage.RejectShareExceeded as exc:
                    outcomes.append(exc)
    finally:
        clear_mined(root, source, ingest_date)  # a re-run mines again
    failed = [o for o in outcomes if isinstance(o, Exception)]
    reports = [o for o in outcomes if not isinstance(o, Exception)]
    if failed:
        raise failed[0]
    peak = max([m["peak_rss_mb"] for m in mined] + [r["peak_rss_mb"] for r in reports])
    return {"files": reports, "mine": mined, "merge": merged, "workers": workers, "workers_peak_rss_mb": peak,
            "read": sum(r["read"] for r in reports), "rows": sum(r["rows"] for r in reports),
            "rejected": sum(r["rejected"] for r in reports), "seconds": round(time.perf_counter() - start, 3)}


@contextmanager
def _pool(workers: int):
    """``workers`` fresh processes (spawned: no forked polars thread pool), each with its share of
    the cores as polars threads. Polars reads ``POLARS_MAX_THREADS`` when it is imported, and the
    pool starts its processes as work arrives, so the variable is set while the pool lives."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    saved = os.environ.get("POLARS_MAX_THREADS")
    os.environ["POLARS_MAX_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            yield pool
    finally:
        if saved is None:
            os.environ.pop("POLARS_MAX_THREADS", None)
        else:
            os.environ["POLARS_MAX_THREADS"] = saved
