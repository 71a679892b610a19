"""Raw log ingestion: header regex, Drain3 templates, named parameters, one object per line.

Flow of ``ingest_logs`` (read top to bottom):

1. Each line is decoded (UTF-8) and split by the preset's header regex into header fields
   (``date``, ``time``, ``pid``, ``level``, ``component`` for HDFS) and the free-text content.
   Undecodable lines, header mismatches and bad timestamps go to *rejects* with a reason.
2. The content is masked (block ids, ``ip[:port]``, paths, hex, numbers) and fed to Drain3.
   Identical masked contents are cached to their cluster, so repeats skip the tree search
   (the cluster's size is still counted). Drain3 state lives in
   ``<root>/state/drain3-<source>.json`` and is saved once, after the Parquet files are
   written, so a re-run continues the same template tree and keeps template ids.
3. Lines are grouped into sequences (parsers.sessions): by the id regex (``blk_-?\\d+``; a
   line naming several ids belongs to each, a line naming none is counted as
   ``no_sequence_id``, not a reject) or by a header field and time windows (BGL: node x hour).
   ``step`` orders a sequence's lines by timestamp, then by line number. Pass 1 keeps only
   compact numbers per line (cluster id; one (line, sequence, time) row per sequence), so
   memory grows by a few dozen bytes a line, not by the line's text.
4. Pass 2 reads the file again (streaming): every line is matched against its cluster's
   *final* template of this run (templates may generalise while Drain learns) and its
   parameters are extracted with ``TemplateMiner.extract_parameters``. Slots are named from
   ``parsers/key_names/<preset>.json`` (template text -> names); other slots get
   ``<mask>_<position>`` (``ip_1``, ``num_2``, ``param_3`` for Drain's ``<*>``). Rows go to
   the Parquet part in batches of ``batch_rows`` through an atomic writer: the part appears
   whole at the end, or not at all.

Each object's keys: the header fields, ``template`` and the named parameters. ``step`` is
counted within one input file. Re-ingesting a file replaces its Parquet part; its lines are
fed to Drain3 again (cluster sizes grow, templates and ids stay). Run one ingest per source
at a time: concurrent runs would race on the Drain3 state file (last writer wins).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import logging
import time
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from drain3 import TemplateMiner
from drain3.masking import MaskingInstruction
from drain3.persistence_handler import PersistenceHandler
from drain3.template_miner_config import TemplateMinerConfig

from parsers import storage
from parsers.drain import MaskAwareDrain
from parsers.presets import DEFAULT_MASKS, HDFS, PRESETS, LogFormat, resolve  # noqa: F401  (re-exported)
from parsers.sessions import SessionSpec

logger = logging.getLogger(__name__)

KEY_NAMES_DIR = Path(__file__).parent / "key_names"


class AtomicFilePersistence(PersistenceHandler):
    """Drain3 file persistence whose writes are atomic (temp file, then ``os.replace``)."""

    def __init__(self, file_path: str | Path) -> None:
        self.file_path = Path(file_path)

    def save_state(self, state: bytes) -> None:
        storage.write_bytes_atomic(state, self.file_path)

    def load_state(self) -> bytes | None:
        return self.file_path.read_bytes() if self.file_path.exists() else None


def make_miner(fmt: LogFormat, state_path: str | Path | None) -> TemplateMiner:
    """A Drain3 ``TemplateMiner`` configured for ``fmt``; loads saved state if present."""
    config = TemplateMinerConfig()
    config.masking_instructions = [MaskingInstruction(p, name) for p, name in fmt.masks]
    config.drain_depth = fmt.depth
    config.drain_sim_th = fmt.sim_th
    config.drain_extra_delimiters = list(fmt.extra_delimiters)
    handler = AtomicFilePersistence(state_path) if state_path else None
    miner = TemplateMiner(handler, config)
    miner.drain.__class__ = MaskAwareDrain  # masked values count as parameters (parsers.drain)
    return miner


def load_key_names(fmt: LogFormat) -> dict[str, list[str]]:
    if not fmt.key_names:
        return {}
    path = KEY_NAMES_DIR / fmt.key_names if not Path(fmt.key_names).is_absolute() else Path(fmt.key_names)
    data = json.loads(path.read_text(encoding="utf-8"))
    return data["templates"]


def slot_names(template: str, masks: list[str], key_names: dict[str, list[str]], reserved: set[str]) -> list[str]:
    """Names of a template's slots: from the map when it fits, else ``<mask>_<position>``."""
    names = key_names.get(template)
    if names is None or len(names) != len(masks):
        names = [f"{'param' if m == '*' else m.lower()}_{i}" for i, m in enumerate(masks, 1)]
    out, seen = [], set(reserved)
    for i, name in enumerate(names, 1):
        if name in seen:  # never shadow a header key or repeat a slot name
            name = f"{name}_{i}"
        seen.add(name)
        out.append(name)
    return out


@dataclass
class ParsedLine:
    groups: dict[str, str]  # header fields and the stripped Content
    ts: dt.datetime | None
    cluster: object  # drain3 LogCluster


class LineParser:
    """One raw line -> header fields, timestamp and Drain3 cluster (or a reject reason).

    The single place where a line meets the header regex, the masks and Drain3: ingestion and
    ``seqenc bench parse`` both use it. Identical masked contents are cached to their cluster,
    so repeats skip the tree search (the cluster's size is still counted).
    """

    def __init__(self, preset: str | LogFormat, state_path: str | Path | None):
        self.fmt = resolve(preset)
        self.header_rx = self.fmt.regex()
        self.miner = make_miner(self.fmt, state_path)
        self._clusters: dict[str, object] = {}
        self._ts: dict[str, dt.datetime] = {}

    def header(self, text: str) -> tuple[dict[str, str], dt.datetime | None] | str:
        """Header fields (with the stripped Content) and timestamp, or a reject reason."""
        fmt = self.fmt
        m = self.header_rx.match(text)
        if m is None:
            return f"header mismatch: not a {fmt.name} line"
        groups = m.groupdict(default="")
        ts = None
        if fmt.ts_format:
            stamp = " ".join(groups[f] for f in fmt.ts_fields)
            ts = self._ts.get(stamp)
            if ts is None:
                try:
                    ts = self._ts[stamp] = (
                        dt.datetime.fromtimestamp(float(stamp), dt.UTC).replace(tzinfo=None)
                        if fmt.ts_format == "epoch" else dt.datetime.strptime(stamp, fmt.ts_format))
                except (ValueError, OverflowError, OSError):
                    return "bad timestamp"
        groups["Content"] = groups["Content"].strip()
        return groups, ts

    def parse(self, text: str) -> ParsedLine | str:
        head = self.header(text)
        if isinstance(head, str):
            return head
        groups, ts = head
        masked = self.miner.masker.mask(groups["Content"])
        cluster = self._clusters.get(masked)
        if cluster is None:
            cluster, _ = self.miner.drain.add_log_message(masked)
            self._clusters[masked] = cluster
        else:
            cluster.size += 1
        return ParsedLine(groups, ts, cluster)


def ingest_logs(log_path, root, source: str = "hdfs", preset: str | LogFormat = "hdfs", ingest_date=None,
                session: SessionSpec | None = None, max_reject_share: float | None = None,
                batch_rows: int = 500_000) -> dict:
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
    key_names = load_key_names(fmt)
    key_fields = fmt.key_fields
    header_keys = [f.lower() for f in key_fields]
    reserved = {*header_keys, "template"}

    # ---- pass 1: headers, Drain3 (learns the templates), sequence membership. Per line only
    # compact numbers are kept: its cluster id, and one (line, sequence, time) row per sequence.
    rejects: list[tuple[int, str, str]] = []
    cluster_of = array("q")  # per line yielded by the reader: cluster id, or -1 when not written
    row_line, row_seq, row_ts = array("q"), array("q"), array("q")  # per (line, sequence) pair
    seq_code: dict[str, int] = {}
    anomalous: set[int] = set()  # sequences with a labelled line (formats with a label field)
    no_id = parsed_ok = 0
    reader = storage.LineReader(log_path, rejects)
    for line_no, text in reader:
        parsed = parser.parse(text)
        ids = parsed if isinstance(parsed, str) else session.sequence_ids(parsed.groups, parsed.groups["Content"],
                                                                          parsed.ts)
        if isinstance(ids, str):  # a reject reason
            rejects.append((line_no, ids, text))
            cluster_of.append(-1)
            continue
        parsed_ok += 1
        if not ids:
            no_id += 1
            cluster_of.append(-1)
            continue
        cluster_of.append(parsed.cluster.cluster_id)
        ts = _NO_TS if parsed.ts is None else int(parsed.ts.timestamp() * 1_000_000)
        for sid in ids:
            code = seq_code.setdefault(sid, len(seq_code))
            row_line.append(line_no)
            row_seq.append(code)
            row_ts.append(ts)
            if fmt.label_field and parsed.groups[fmt.label_field] != "-":
                anomalous.add(code)
    steps = _steps(row_seq, row_ts, row_line)
    seq_names = list(seq_code)

    # ---- pass 2: read the file again; each line meets its cluster's *final* template, its
    # parameters are extracted and named, and its rows stream to Parquet in batches.
    templates = {c.cluster_id: c.get_template() for c in miner.drain.clusters}
    names_of: dict[tuple[int, tuple[str, ...]], list[str]] = {}
    param_failures = 0
    obj_path = storage.objects_path(root, source, ingest_date, log_path)
    cols: dict[str, list] = {c: [] for c in storage.OBJECTS_SCHEMA.names}
    k = 0  # next (line, sequence) row
    with storage.AtomicParquetWriter(obj_path, storage.OBJECTS_SCHEMA) as out:
        for i, (line_no, text) in enumerate(storage.LineReader(log_path, [])):
            cid = cluster_of[i]
            if cid < 0:
                continue
            groups, ts = parser.header(text)
            template = templates[cid]
            params = miner.extract_parameters(template, groups["Content"])
            if params is None:
                params = miner.extract_parameters(template, groups["Content"], exact_matching=False)
            if params is None:
                param_failures += 1
                params = []
            masks = tuple(p.mask_name for p in params)
            names = names_of.get((cid, masks))
            if names is None:
                names = names_of[(cid, masks)] = slot_names(template, list(masks), key_names, reserved)
            keys = [*header_keys, "template", *names]
            values = [*(groups[f] for f in key_fields), template, *(p.value for p in params)]
            n = len(keys)
            while k < len(row_line) and row_line[k] == line_no:
                cols["sequence_id"].extend([seq_names[row_seq[k]]] * n)
                cols["step"].extend([int(steps[k])] * n)
                cols["ts"].extend([ts] * n)
                cols["key"].extend(keys)
                cols["value"].extend(values)
                cols["template_id"].extend([cid] * n)
                k += 1
            if len(cols["key"]) >= batch_rows:
                out.write(cols)
                cols = {c: [] for c in cols}
        out.write(cols)
    if k != len(row_line):
        raise RuntimeError(f"{log_path} changed while it was being ingested (pass 2 saw {k} of {len(row_line)} rows)")

    # ---- rejects, labels, then Drain3 state (after the data it describes)
    rej_path = storage.write_rejects(root, source, ingest_date, log_path, rejects)
    labels_path = None
    if fmt.label_field:
        labels = ["Anomaly" if code in anomalous else "Normal" for code in range(len(seq_names))]
        labels_path = storage.write_parquet_atomic(
            pa.table({"sequence_id": seq_names, "label": labels}, schema=storage.LABELS_SCHEMA),
            storage.labels_path(root, source, log_path))
    miner.save_state(f"ingest {log_path.name}")

    report = {
        "read": reader.read,
        "parsed": parsed_ok,
        "rejected": len(rejects),
        "blank": reader.blank,
        "no_sequence_id": no_id,
        "objects": len(row_line),
        "rows": out.rows,
        "sequences": len(seq_names),
        "templates": len(miner.drain.clusters),
        "new_templates": len(miner.drain.clusters) - clusters_before,
        "param_failures": param_failures,
        "objects_path": str(obj_path),
        "rejects_path": str(rej_path) if rej_path else None,
        "labels_path": str(labels_path) if labels_path else None,
        "state_path": str(state_path),
        "session": session.describe(),
        "seconds": round(time.perf_counter() - start, 3),
    }
    logger.info("ingested %s: %s", log_path, report)
    return storage.check_reject_share(report, max_reject_share)


_NO_TS = np.iinfo(np.int64).max  # lines without a timestamp sort last in their sequence


def _steps(row_seq: array, row_ts: array, row_line: array) -> np.ndarray:
    """Position of every (line, sequence) row inside its sequence, by time then line number."""
    seq, ts, line = (np.frombuffer(a, dtype=np.int64) if len(a) else np.zeros(0, np.int64)
                     for a in (row_seq, row_ts, row_line))
    order = np.lexsort((line, ts, seq))
    sorted_seq = seq[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_seq)) + 1] if len(order) else np.zeros(0, np.int64)
    group_start = np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    steps = np.empty(len(order), dtype=np.int64)
    steps[order] = np.arange(len(order)) - group_start
    return steps


def ingest_labels(csv_path, root, source: str, id_column: str | None = None, label_column: str | None = None) -> dict:
    """Write a labels CSV (with header) as ``labels/source=<src>/part-<stem>.parquet``.

    ``id_column`` / ``label_column`` default to the first and second CSV column (LogHub's
    ``BlockId,Label``, the session generator's ``session_id,label``). Rows with an empty id or
    label, or a repeated id, go to rejects (today's partition) with a reason.
    """
    csv_path = Path(csv_path)
    ids, labels, rejects, seen = [], [], [], set()
    with csv_path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        id_i = header.index(id_column) if id_column else 0
        lab_i = header.index(label_column) if label_column else 1
        for line_no, row in enumerate(reader, 2):
            sid = row[id_i].strip() if len(row) > id_i else ""
            label = row[lab_i].strip() if len(row) > lab_i else ""
            reason = "missing id or label" if not sid or not label else "duplicate id" if sid in seen else None
            if reason:
                rejects.append((line_no, reason, ",".join(row)))
                continue
            seen.add(sid)
            ids.append(sid)
            labels.append(label)
    path = storage.labels_path(root, source, csv_path)
    storage.write_parquet_atomic(pa.table({"sequence_id": ids, "label": labels}, schema=storage.LABELS_SCHEMA), path)
    rej_path = storage.write_rejects(root, source, None, csv_path, rejects)
    counts: dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    logger.info("labels %s: %d rows, %d rejected", csv_path, len(ids), len(rejects))
    return {
        "read": len(ids) + len(rejects),
        "labels": len(ids),
        "rejected": len(rejects),
        "counts": counts,
        "labels_path": str(path),
        "rejects_path": str(rej_path) if rej_path else None,
    }
