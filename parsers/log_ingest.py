"""``ingest_logs``: a raw log file -> Parquet key-value objects, in batches of lines.

Pass 1 (learn): per batch of lines, headers are split, timestamps parsed, contents masked
(parsers.columns, vectorised); each *distinct* masked content new to the run goes to Drain3 in
file order (the cache from masked content to cluster makes repeats free); sequence ids are
pulled out. Only compact numbers are kept per line: its cluster id, and one (line, sequence,
time) row per sequence it belongs to. Rejects are collected with their reasons.

Between the passes, ``step`` (position in the sequence, by time then line number) is computed
for every (line, sequence) row with one numpy sort.

The lines to write go to a temporary Parquet spill (one file per batch, beside the output) with
their header fields, content and cluster, so memory stays flat with input size.

Pass 2 (write): per spilled batch, each line's slots are extracted against its cluster's
*final* template (templates generalise while Drain learns) with one regex per template over the
batch, named (parsers.logs.slot_names) and written as long-form rows through the atomic
batched Parquet writer. Lines the template regex does not match fall back to Drain3's own
``extract_parameters``; lines neither matches are counted as ``param_failures`` and keep their
header keys and template.
"""

from __future__ import annotations

import datetime as dt
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from parsers import columns, storage
from parsers.logs import LineParser, load_key_names, slot_names
from parsers.presets import LogFormat, resolve
from parsers.sessions import SessionSpec

logger = logging.getLogger(__name__)

_EPOCH = dt.datetime(1970, 1, 1)  # timestamps are naive UTC
_NO_TS = np.iinfo(np.int64).max  # lines without a timestamp sort last in their sequence


def _steps(row_seq: np.ndarray, row_ts: np.ndarray, row_line: np.ndarray) -> np.ndarray:
    """Position of every (line, sequence) row inside its sequence, by time then line number."""
    order = np.lexsort((row_line, row_ts, row_seq))
    sorted_seq = row_seq[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_seq)) + 1] if len(order) else np.zeros(0, np.int64)
    group_start = np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    steps = np.empty(len(order), dtype=np.int64)
    steps[order] = np.arange(len(order)) - group_start
    return steps


def _timestamps(frame: pl.DataFrame, fmt: LogFormat, parser: LineParser) -> pl.Series:
    """Microseconds since the epoch per line (null: no timestamp or a bad one); each distinct
    stamp is parsed once, in Python (exact strptime semantics)."""
    if not fmt.ts_format:
        return pl.Series("ts", [None] * frame.height, dtype=pl.Int64)
    stamps = frame.select(pl.concat_str([pl.col(f) for f in fmt.ts_fields], separator=" ")).to_series()
    if fmt.ts_format == "epoch":
        seconds = stamps.cast(pl.Float64, strict=False)
        return (seconds * 1_000_000).round().cast(pl.Int64).alias("ts")
    if "%f" not in fmt.ts_format:  # chrono reads these formats as strptime does; %f differs
        fast = stamps.str.strptime(pl.Datetime("us"), fmt.ts_format, strict=False).dt.epoch("us")
        if fast.null_count() == stamps.null_count():
            return fast.alias("ts")
    table = {}
    for stamp in stamps.drop_nulls().unique().to_list():
        ts = parser.parse_stamp(stamp)
        table[stamp] = None if ts is None else (ts - _EPOCH) // dt.timedelta(microseconds=1)
    return stamps.replace_strict(table, default=None, return_dtype=pl.Int64).alias("ts")


class _Learner:
    """Pass 1 state: the compact per-line numbers and what is counted."""

    def __init__(self, fmt: LogFormat, session: SessionSpec, parser: LineParser):
        self.fmt, self.session, self.parser = fmt, session, parser
        self.rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (line, seq code, ts)
        self.seq_code: dict[str, int] = {}
        self.anomalous: set[int] = set()
        self.rejects: list[tuple[int, str, str]] = []
        self.parsed = self.no_id = 0

    def _clusters(self, masked: pl.Series) -> pl.Series:
        """Cluster id per line: each distinct masked content new to the run goes to Drain3 once,
        in file order; repeats only add to the cluster's size."""
        drain, cache = self.parser.miner.drain, self.parser._clusters
        counts = dict(masked.value_counts().iter_rows())
        for text in masked.unique(maintain_order=True).to_list():
            cluster = cache.get(text)
            if cluster is None:
                cluster, _ = drain.add_log_message(text)
                cache[text] = cluster
                cluster.size += counts[text] - 1
            else:
                cluster.size += counts[text]
        ids = {text: cache[text].cluster_id for text in counts}
        return masked.replace_strict(ids, return_dtype=pl.Int64)

    def _sequence_ids(self, frame: pl.DataFrame) -> pl.Series:
        """List of sequence ids per line (null: the line cannot be placed: a reject)."""
        if self.session.id_pattern:
            return frame["Content"].str.extract_all(self.session.id_pattern).list.unique(maintain_order=True)
        out = []
        for groups, ts in zip(frame.iter_rows(named=True), frame["ts"].to_list()):
            when = None if ts is None else _EPOCH + dt.timedelta(microseconds=ts)
            ids = self.session.sequence_ids(groups, groups["Content"], when)
            out.append(None if isinstance(ids, str) else ids)
        return pl.Series(out, dtype=pl.List(pl.String))

    def add(self, numbers: list[int], texts: list[str]) -> pl.DataFrame:
        """Learn from one batch; return its lines to write (header fields, Content, line_no,
        cluster), which the caller spills to disk for pass 2."""
        fmt = self.fmt
        frame = columns.split_headers(pl.Series(texts, dtype=pl.String), fmt).with_columns(
            line_no=pl.Series(numbers, dtype=pl.Int64))
        frame = frame.with_columns(_timestamps(frame, fmt, self.parser))
        header_ok = frame["Content"].is_not_null()
        ts_ok = pl.Series([True] * frame.height) if not fmt.ts_format else frame["ts"].is_not_null() | ~header_ok
        ok = header_ok & ts_ok
        good = frame.filter(ok)
        ids = self._sequence_ids(good)
        placed = ids.is_not_null()
        for line_no, reason, text in self._reasons(frame, header_ok, ts_ok, good, placed, texts):
            self.rejects.append((line_no, reason, text))
        good, ids = good.filter(placed), ids.filter(placed)
        self.parsed += good.height
        if not good.height:
            return good.select(*fmt.key_fields, "Content", "line_no").with_columns(cluster=pl.lit(None, pl.Int64))
        good = good.with_columns(cluster=self._clusters(good.select(columns.mask(pl.col("Content"), fmt)).to_series()))
        has_id = ids.list.len() > 0
        self.no_id += int((~has_id).sum())
        good, ids = good.filter(has_id), ids.filter(has_id)
        self._rows(good, ids)
        return good.select(*fmt.key_fields, "Content", "line_no", "cluster")

    def _reasons(self, frame, header_ok, ts_ok, good, placed, texts):
        for i in np.flatnonzero(~header_ok.to_numpy()):
            yield int(frame["line_no"][int(i)]), f"header mismatch: not a {self.fmt.name} line", texts[i]
        for i in np.flatnonzero(~ts_ok.to_numpy()):
            yield int(frame["line_no"][int(i)]), "bad timestamp", texts[i]
        text_of = dict(zip(frame["line_no"].to_list(), texts))
        for n in good.filter(~placed)["line_no"].to_list():
            yield n, "no timestamp: cannot place the line in a time window", text_of[n]

    def _rows(self, good: pl.DataFrame, ids: pl.Series) -> None:
        exploded = good.select("line_no", "ts").with_columns(sid=ids).explode("sid")
        for sid in exploded["sid"].unique(maintain_order=True).to_list():
            self.seq_code.setdefault(sid, len(self.seq_code))
        codes = exploded["sid"].replace_strict(self.seq_code, return_dtype=pl.Int64).to_numpy()
        self.rows.append((exploded["line_no"].to_numpy(), codes,
                          exploded["ts"].fill_null(_NO_TS).to_numpy()))
        if self.fmt.label_field:
            labelled = good.with_columns(sid=ids).explode("sid").filter(pl.col(self.fmt.label_field) != "-")
            self.anomalous.update(self.seq_code[s] for s in labelled["sid"].to_list())


def _slot_frames(batch: pl.DataFrame, templates: dict, miner, masks, key_names, reserved, header_keys, counts):
    """Long-form (line_no, key_index, key, value) rows of one batch's written lines."""
    parts = []
    for (cid,), group in batch.group_by("cluster", maintain_order=True):
        template = templates[cid]
        slots, mask_names = columns.extract_slots(group["Content"], template, masks)
        matched = slots.select(pl.all_horizontal(pl.all().is_not_null())).to_series() if mask_names else \
            slots["_matched"]
        names = slot_names(template, list(mask_names), key_names, reserved)
        keys = [*header_keys, "template", *names]
        values = [pl.col(f).alias(f"v{i}") for i, f in enumerate(group.columns[:len(header_keys)])]
        wide = group.select("line_no", *values, pl.lit(template).alias(f"v{len(header_keys)}"))
        if mask_names:
            wide = wide.hstack(slots.rename({f"p{i}": f"v{len(header_keys) + 1 + i}" for i in range(len(names))}))
        good = wide.filter(matched)
        parts.append(_long(good, keys))
        for row in group.filter(~matched).iter_rows(named=True):  # Drain3's own extraction, then give up
            params = miner.extract_parameters(template, row["Content"]) or \
                miner.extract_parameters(template, row["Content"], exact_matching=False)
            if params is None:
                counts["param_failures"] += 1
                params = []
            names = slot_names(template, [p.mask_name for p in params], key_names, reserved)
            row_keys = [*header_keys, "template", *names]
            row_values = [*(row[c] for c in group.columns[:len(header_keys)]), template, *(p.value for p in params)]
            parts.append(pl.DataFrame({"line_no": [row["line_no"]] * len(row_keys),
                                       "key_index": list(range(len(row_keys))), "key": row_keys,
                                       "value": row_values}, schema=_LONG))
    return pl.concat(parts) if parts else pl.DataFrame(schema=_LONG)


_LONG = {"line_no": pl.Int64, "key_index": pl.Int64, "key": pl.String, "value": pl.String}


def _long(wide: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    value_cols = [f"v{i}" for i in range(len(keys))]
    return (wide.unpivot(index="line_no", on=value_cols, variable_name="col", value_name="value")
            .with_columns(key_index=pl.col("col").str.slice(1).cast(pl.Int64))
            .with_columns(key=pl.col("key_index").replace_strict(dict(enumerate(keys)), return_dtype=pl.String))
            .select(list(_LONG)).cast(_LONG))


def ingest_logs(log_path, root, source: str = "hdfs", preset: str | LogFormat = "hdfs", ingest_date=None,
                session: SessionSpec | None = None, max_reject_share: float | None = None,
                batch_lines: int = 200_000) -> dict:
    """Parse a raw log file into ``objects`` (and ``rejects``) Parquet under ``root``.

    ``session`` overrides the format's grouping (parsers.sessions). A format with a
    ``label_field`` (BGL) also writes ``labels``: a sequence is ``Anomaly`` when any of its lines
    carries a label other than ``-``, else ``Normal``.

    Returns a report: ``read, parsed, rejected, reject_share, blank, no_sequence_id, objects,
    rows, sequences, templates, new_templates, param_failures, objects_path, rejects_path,
    labels_path, state_path, session, seconds``. Blank lines are counted (``blank``) and
    skipped. The outputs are written in any case; then, when ``rejected / read`` passes
    ``max_reject_share``, :class:`parsers.storage.RejectShareExceeded` is raised.
    """
    start = time.perf_counter()
    fmt = resolve(preset)
    log_path = Path(log_path)
    session = session or fmt.session_spec()
    state_path = storage.drain_state_path(root, source)
    parser = LineParser(fmt, state_path)
    miner = parser.miner
    clusters_before = len(miner.drain.clusters)

    # ---- pass 1: learn templates, place lines in sequences
    obj_path = storage.objects_path(root, source, ingest_date, log_path)
    obj_path.parent.mkdir(parents=True, exist_ok=True)
    spill = tempfile.TemporaryDirectory(prefix=".ingest-", dir=obj_path.parent)  # pass-1 lines, on disk
    learner = _Learner(fmt, session, parser)
    reader = storage.LineReader(log_path, learner.rejects)
    n_batches = 0
    for numbers, texts in reader.batches(batch_lines):
        learner.add(numbers, texts).write_parquet(Path(spill.name) / f"{n_batches}.parquet")
        n_batches += 1
    row_line, row_seq, row_ts = (np.concatenate([r[i] for r in learner.rows]) if learner.rows
                                 else np.zeros(0, np.int64) for i in range(3))
    steps = _steps(row_seq, row_ts, row_line)
    rows = pl.DataFrame({"line_no": row_line, "seq": row_seq, "step": steps, "ts_us": row_ts})
    seq_names = pl.Series("sequence_id", list(learner.seq_code), dtype=pl.String)

    # ---- pass 2: slots against the final templates, long-form rows, batched Parquet
    templates = {c.cluster_id: c.get_template() for c in miner.drain.clusters}
    key_fields = fmt.key_fields
    header_keys = [f.lower() for f in key_fields]
    reserved = {*header_keys, "template"}
    key_names = load_key_names(fmt)
    counts = {"param_failures": 0}
    with spill, storage.AtomicParquetWriter(obj_path, storage.OBJECTS_SCHEMA) as out:
        for b in range(n_batches):
            batch = pl.read_parquet(Path(spill.name) / f"{b}.parquet")
            if not batch.height:
                continue
            # rows are in line order: this batch's rows are one slice
            lo, hi = np.searchsorted(row_line, [batch["line_no"].min(), batch["line_no"].max() + 1])
            long = _slot_frames(batch, templates, miner, fmt.masks, key_names, reserved, header_keys, counts)
            joined = (long.join(batch.select("line_no", pl.col("cluster").alias("template_id")), on="line_no")
                      .join(rows.slice(lo, hi - lo), on="line_no", how="inner")
                      .sort(["line_no", "seq", "key_index"]))
            joined = joined.with_columns(
                sequence_id=pl.Series(seq_names.to_numpy()[joined["seq"].to_numpy()], dtype=pl.String),
                ts=pl.when(pl.col("ts_us") == _NO_TS).then(None).otherwise(pl.col("ts_us")).cast(pl.Datetime("us")))
            out.write(joined.select(storage.OBJECTS_SCHEMA.names))
    written = rows.height

    # ---- rejects, labels, then Drain3 state (after the data it describes)
    learner.rejects.sort(key=lambda r: r[0])
    rej_path = storage.write_rejects(root, source, ingest_date, log_path, learner.rejects)
    labels_path = None
    if fmt.label_field:
        names = seq_names.to_list()
        labels = ["Anomaly" if code in learner.anomalous else "Normal" for code in range(len(names))]
        labels_path = storage.write_parquet_atomic(
            pa.table({"sequence_id": names, "label": labels}, schema=storage.LABELS_SCHEMA),
            storage.labels_path(root, source, log_path))
    miner.save_state(f"ingest {log_path.name}")

    report = {
        "read": reader.read,
        "parsed": learner.parsed,
        "rejected": len(learner.rejects),
        "blank": reader.blank,
        "no_sequence_id": learner.no_id,
        "objects": written,
        "rows": out.rows,
        "sequences": len(seq_names),
        "templates": len(miner.drain.clusters),
        "new_templates": len(miner.drain.clusters) - clusters_before,
        "param_failures": counts["param_failures"],
        "objects_path": str(obj_path),
        "rejects_path": str(rej_path) if rej_path else None,
        "labels_path": str(labels_path) if labels_path else None,
        "state_path": str(state_path),
        "session": session.describe(),
        "seconds": round(time.perf_counter() - start, 3),
    }
    logger.info("ingested %s: %s", log_path, report)
    return storage.check_reject_share(report, max_reject_share)

