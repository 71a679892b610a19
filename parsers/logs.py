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
3. Second pass: every line is matched against its cluster's *final* template of this run
   (templates may generalise while Drain learns) and its parameters are extracted with
   ``TemplateMiner.extract_parameters``. Slots are named from ``parsers/key_names/<preset>.json``
   (template text -> names); other slots get ``<mask>_<position>`` (``ip_1``, ``num_2``,
   ``param_3`` for Drain's ``<*>``).
4. Lines are grouped by the id regex (``blk_-?\\d+``). A line naming several ids belongs to
   each of those sequences; a line naming none is counted as ``no_sequence_id`` (not a
   reject). ``step`` orders a sequence's lines by timestamp, then by line number.

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
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from drain3 import TemplateMiner
from drain3.masking import MaskingInstruction
from drain3.persistence_handler import PersistenceHandler
from drain3.template_miner_config import TemplateMinerConfig

from parsers import storage

logger = logging.getLogger(__name__)

KEY_NAMES_DIR = Path(__file__).parent / "key_names"
_B = r"(?<![A-Za-z0-9_])"  # token boundary before a masked value
_A = r"(?![A-Za-z0-9_])"  # token boundary after it
DEFAULT_MASKS: tuple[tuple[str, str], ...] = (
    # Order matters: a path swallows the block id inside it, an ip:port is not two numbers.
    (_B + r"/(?:[\w.$\-]+/)+[\w.$\-]*", "PATH"),
    (_B + r"blk_-?\d+" + _A, "BLK"),
    (_B + r"\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?" + _A, "IP"),
    (_B + r"0x[0-9a-fA-F]+" + _A, "HEX"),
    (_B + r"[-+]?\d+(?:\.\d+)?" + _A, "NUM"),
)


@dataclass(frozen=True)
class LogFormat:
    """How to read one kind of log.

    ``header`` names fields in ``<Angle>`` brackets; literal text between them is matched
    as written, spaces as ``\\s+``. ``Content`` is the free text given to Drain3 and must be
    the last field. ``field_patterns`` tightens single fields (default ``.*?``).
    """

    name: str
    header: str
    field_patterns: dict[str, str] = field(default_factory=dict)
    ts_fields: tuple[str, ...] = ()
    ts_format: str | None = None  # strptime format of the ts_fields joined by one space
    id_pattern: str | None = None
    masks: tuple[tuple[str, str], ...] = DEFAULT_MASKS
    depth: int = 4
    sim_th: float = 0.5
    key_names: str | None = None  # file name under parsers/key_names/

    def regex(self) -> re.Pattern:
        parts = re.split(r"(<[^<>]+>)", self.header)
        out = []
        for i, part in enumerate(parts):
            if i % 2 == 0:  # literal text
                out.append(r"\s+".join(re.escape(p) for p in part.split(" ")))
            else:
                name = part[1:-1]
                default = ".*" if name == "Content" else ".*?"
                out.append(f"(?P<{name}>{self.field_patterns.get(name, default)})")
        return re.compile("^" + "".join(out) + "$")

    @property
    def fields(self) -> list[str]:
        return [f for f in re.findall(r"<([^<>]+)>", self.header) if f != "Content"]


HDFS = LogFormat(
    name="hdfs",
    header="<Date> <Time> <Pid> <Level> <Component>: <Content>",
    field_patterns={"Date": r"\d{6}", "Time": r"\d{6}", "Pid": r"\d+", "Level": r"[A-Z]+", "Component": r"[^\s:]+"},
    ts_fields=("Date", "Time"),
    ts_format="%y%m%d %H%M%S",
    id_pattern=r"blk_-?\d+",
    depth=4,
    sim_th=0.5,
    key_names="hdfs.json",
)
PRESETS: dict[str, LogFormat] = {"hdfs": HDFS}


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
    handler = AtomicFilePersistence(state_path) if state_path else None
    return TemplateMiner(handler, config)


def load_key_names(fmt: LogFormat) -> dict[str, list[str]]:
    if not fmt.key_names:
        return {}
    data = json.loads((KEY_NAMES_DIR / fmt.key_names).read_text(encoding="utf-8"))
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


def _resolve(preset: str | LogFormat) -> LogFormat:
    if isinstance(preset, LogFormat):
        return preset
    try:
        return PRESETS[preset]
    except KeyError:
        raise ValueError(f"unknown log preset {preset!r}; known: {sorted(PRESETS)}") from None


def _parse_ts(fmt: LogFormat, groups: dict, cache: dict) -> dt.datetime:
    """Timestamp from the header fields (cached: many lines share a second)."""
    text = " ".join(groups[f] for f in fmt.ts_fields)
    if text not in cache:
        cache[text] = dt.datetime.strptime(text, fmt.ts_format)
    return cache[text]


def ingest_logs(log_path, root, source: str = "hdfs", preset: str | LogFormat = "hdfs", ingest_date=None) -> dict:
    """Parse a raw log file into ``objects`` (and ``rejects``) Parquet under ``root``.

    Returns a report: ``read, parsed, rejected, blank, no_sequence_id, objects, rows,
    sequences, templates, new_templates, param_failures, objects_path, rejects_path,
    state_path, seconds``. Blank lines are counted (``blank``) and skipped.
    """
    start = time.perf_counter()
    fmt = _resolve(preset)
    log_path = Path(log_path)
    header_rx, id_rx = fmt.regex(), re.compile(fmt.id_pattern) if fmt.id_pattern else None
    state_path = storage.drain_state_path(root, source)
    miner = make_miner(fmt, state_path)
    clusters_before = len(miner.drain.clusters)
    key_names = load_key_names(fmt)
    header_keys = [f.lower() for f in fmt.fields]
    reserved = {*header_keys, "template"}

    # ---- pass 1: split headers, feed Drain3 (masked-content cache skips the tree search)
    lines: list[tuple[int, dict, dt.datetime | None, list[str], int]] = []
    rejects: list[tuple[int, str, str]] = []
    masked_to_cluster: dict = {}
    ts_cache: dict = {}
    no_id = 0
    reader = storage.LineReader(log_path, rejects)
    for line_no, text in reader:
        m = header_rx.match(text)
        if m is None:
            rejects.append((line_no, f"header mismatch: not a {fmt.name} line", text))
            continue
        groups = m.groupdict()
        ts = None
        if fmt.ts_format:
            try:
                ts = _parse_ts(fmt, groups, ts_cache)
            except ValueError:
                rejects.append((line_no, "bad timestamp", text))
                continue
        content = groups["Content"].strip()
        masked = miner.masker.mask(content)
        cluster = masked_to_cluster.get(masked)
        if cluster is None:
            cluster, _ = miner.drain.add_log_message(masked)
            masked_to_cluster[masked] = cluster
        else:
            cluster.size += 1
        ids = list(dict.fromkeys(id_rx.findall(content))) if id_rx else []
        if not ids:
            no_id += 1
            continue
        groups["Content"] = content
        lines.append((line_no, groups, ts, ids, cluster.cluster_id))

    # ---- pass 2: final templates, named parameters, sequence order
    per_seq: dict[str, list[int]] = {}
    for idx, (_, _, _, ids, _) in enumerate(lines):
        for sid in ids:
            per_seq.setdefault(sid, []).append(idx)
    cols = {"sequence_id": [], "step": [], "ts": [], "key": [], "value": [], "template_id": []}
    param_failures = 0
    kv_of_line: list[tuple[list[str], list[str]]] = []  # (keys, values) per line
    templates = {c.cluster_id: c.get_template() for c in miner.drain.clusters}  # final templates
    for _, groups, _, _, cid in lines:
        template = templates[cid]
        params = miner.extract_parameters(template, groups["Content"])
        if params is None:
            params = miner.extract_parameters(template, groups["Content"], exact_matching=False)
        if params is None:
            param_failures += 1
            params = []
        names = slot_names(template, [p.mask_name for p in params], key_names, reserved)
        keys = [*header_keys, "template", *names]
        values = [*(groups[f] for f in fmt.fields), template, *(p.value for p in params)]
        kv_of_line.append((keys, values))
    for sid, idxs in per_seq.items():
        idxs.sort(key=lambda i: (lines[i][2] is None, lines[i][2] or dt.datetime.min, lines[i][0]))
        for step, i in enumerate(idxs):
            _, _, ts, _, cid = lines[i]
            keys, values = kv_of_line[i]
            n = len(keys)
            cols["sequence_id"].extend([sid] * n)
            cols["step"].extend([step] * n)
            cols["ts"].extend([ts] * n)
            cols["key"].extend(keys)
            cols["value"].extend(values)
            cols["template_id"].extend([cid] * n)

    # ---- write Parquet (atomic, replacing this input's part file), then Drain3 state
    obj_path = storage.objects_path(root, source, ingest_date, log_path)
    storage.write_parquet_atomic(pa.table(cols, schema=storage.OBJECTS_SCHEMA), obj_path)
    rej_path = storage.write_rejects(root, source, ingest_date, log_path, rejects)
    miner.save_state(f"ingest {log_path.name}")

    report = {
        "read": reader.read,
        "parsed": reader.read - reader.blank - len(rejects),
        "rejected": len(rejects),
        "blank": reader.blank,
        "no_sequence_id": no_id,
        "objects": sum(len(v) for v in per_seq.values()),
        "rows": len(cols["key"]),
        "sequences": len(per_seq),
        "templates": len(miner.drain.clusters),
        "new_templates": len(miner.drain.clusters) - clusters_before,
        "param_failures": param_failures,
        "objects_path": str(obj_path),
        "rejects_path": str(rej_path) if rej_path else None,
        "state_path": str(state_path),
        "seconds": round(time.perf_counter() - start, 3),
    }
    logger.info("ingested %s: %s", log_path, report)
    return report


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
