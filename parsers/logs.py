"""Raw log parsing: the line parser, Drain3 set-up, slot naming, labels CSVs.

* :class:`LineParser` takes one raw line through the format's header regex, timestamp, masks
  and Drain3 (with a cache from masked content to cluster). ``seqenc bench parse`` uses it;
  the batched ingest (parsers.log_ingest.ingest_logs) does the
  same steps column-at-a-time (parsers.columns).
* :func:`make_miner` builds a Drain3 ``TemplateMiner`` for a format, with the mask-aware
  similarity of parsers.drain and its state in ``<root>/state/drain3-<source>.json``: plain
  JSON written atomically (parsers.drain_state; never jsonpickle, so a state file cannot run
  code; an old jsonpickle file is migrated once), saved after the Parquet files, so a re-run
  continues the same template tree and keeps template ids.
* :func:`slot_names` names template slots from ``parsers/key_names/<preset>.json`` (template
  text -> names); other slots get ``<mask>_<position>`` (``ip_1``, ``num_2``, ``param_3`` for
  Drain's ``<*>``).

Each object's keys: the header fields (not the label field), ``template`` and the named
slots. Re-ingesting a file replaces its Parquet part; its lines are fed to Drain3 again (cluster
sizes grow, templates and ids stay). Run one ingest per source at a time: concurrent runs would
race on the Drain3 state file (last writer wins).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from drain3 import TemplateMiner
from drain3.masking import AbstractMaskingInstruction, MaskingInstruction
from drain3.template_miner_config import TemplateMinerConfig

from parsers import storage
from parsers.drain import MaskAwareDrain, ShapeAwareDrain
from parsers.drain_state import DrainStateFile
from parsers.presets import DEFAULT_MASKS, HDFS, KEEP, PRESETS, LogFormat, resolve, value_pattern  # noqa: F401
from parsers.word_split import WordSplit

logger = logging.getLogger(__name__)

KEY_NAMES_DIR = Path(__file__).parent / "key_names"


class StateFileMiner(TemplateMiner):
    """Drain3's ``TemplateMiner`` whose state goes through parsers.drain_state, never jsonpickle.

    ``TemplateMiner.save_state`` / ``load_state`` (jsonpickle, through a byte-level
    ``PersistenceHandler``) are replaced: the miner is built without a handler, so Drain3's own
    load never runs, then gets a :class:`DrainStateFile` in its place. Drain3's snapshot policy
    is kept: ``add_log_message`` still saves on every cluster change (and every
    ``snapshot_interval_minutes``); the batched ingest feeds ``miner.drain`` directly and saves
    once, after its Parquet files.
    """

    def __init__(self, config: TemplateMinerConfig, state_file: DrainStateFile | None, shapes: bool = False,
                 split_words: int = 0) -> None:
        super().__init__(None, config)
        # masked values count as parameters; with shapes, tokens holding one compare by shape (parsers.drain)
        self.drain.__class__ = ShapeAwareDrain if shapes else MaskAwareDrain
        self.word_split = WordSplit(split_words)  # saved with the tree (parsers.drain_state)
        self.persistence_handler = state_file
        if state_file is not None:
            self.load_state()

    def load_state(self) -> None:
        self.persistence_handler.load(self.drain, self.word_split)

    def save_state(self, snapshot_reason: str) -> None:
        self.persistence_handler.save(self.drain, snapshot_reason, self.word_split)


class KeepMask(AbstractMaskingInstruction):
    """A mask whose pattern starts with a ``keep`` group (parsers.presets.value_pattern): the
    group's text stays before the mask token (``blk_-42`` -> ``blk_<ID>``). ``regex`` matches
    the value alone, which is what Drain3's parameter extraction reads from a template."""

    def __init__(self, pattern: str, mask_with: str) -> None:
        super().__init__(mask_with)
        self.full = re.compile(pattern)
        self.regex = re.compile(value_pattern(pattern))

    @property
    def pattern(self) -> str:
        return self.regex.pattern

    def mask(self, content: str, mask_prefix: str, mask_suffix: str) -> str:
        token = mask_prefix + self.mask_with + mask_suffix
        return self.full.sub(lambda m: (m.group("keep") or "") + token, content)


def mask_instruction(pattern: str, name: str) -> AbstractMaskingInstruction:
    return KeepMask(pattern, name) if KEEP in pattern else MaskingInstruction(pattern, name)


def make_miner(fmt: LogFormat, state_path: str | Path | None) -> StateFileMiner:
    """A Drain3 template miner configured for ``fmt``; loads the state file if present (a
    ``ValueError`` naming the file when it is not a seqenc state)."""
    config = TemplateMinerConfig()
    config.masking_instructions = [mask_instruction(p, name) for p, name in fmt.masks]
    config.drain_depth = fmt.depth
    config.drain_sim_th = fmt.sim_th
    config.drain_extra_delimiters = list(fmt.extra_delimiters)
    return StateFileMiner(config, DrainStateFile(state_path) if state_path else None, fmt.mask_shapes,
                          fmt.split_words)


def new_event_id(drain) -> int:
    """An id from Drain's own counter (a word-split event, parsers.word_split): never a template's."""
    drain.clusters_counter += 1
    return drain.clusters_counter


def events_of(miner: StateFileMiner, contents: dict[str, object]) -> dict[str, tuple[int, str]]:
    """``{masked content: (event id, event template)}`` for contents and the cluster Drain gave
    each, in the dict's order (ids of new events are drawn in that order): the template's own id
    and template, or a word-split event's (parsers.word_split)."""
    drain, split = miner.drain, miner.word_split
    out = {}
    for text, cluster in contents.items():
        tokens = drain.get_content_as_tokens(text)
        eid, template = split.event(cluster.cluster_id, cluster.log_template_tokens, tokens,
                                    lambda: new_event_id(drain))
        out[text] = (eid, " ".join(template))
    return out


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
    masked: str = ""  # the Content as Drain3 saw it


CACHE_LIMIT = 1_000_000  # distinct masked contents (or timestamps) a parser remembers


class LineParser:
    """One raw line -> header fields, timestamp and Drain3 cluster (or a reject reason).

    The single place where a line meets the header regex, the masks and Drain3: ingestion and
    ``seqenc bench parse`` both use it. Identical masked contents are cached to their cluster,
    so repeats skip the tree search (the cluster's size is still counted). The cache (and the
    timestamp cache) holds at most ``CACHE_LIMIT`` entries and starts empty again when full, so
    memory stays bounded on a stream of ever-new contents (:meth:`cache_cluster`).
    """

    def __init__(self, preset: str | LogFormat, state_path: str | Path | None):
        self.fmt = resolve(preset)
        self.header_rx = self.fmt.regex()
        self.miner = make_miner(self.fmt, state_path)
        self._clusters: dict[str, object] = {}
        self._ts: dict[str, dt.datetime] = {}

    def parse_stamp(self, stamp: str) -> dt.datetime | None:
        """The header's timestamp text as a naive UTC datetime (None when it does not parse);
        each distinct stamp is parsed once."""
        if stamp not in self._ts:
            if len(self._ts) >= CACHE_LIMIT:  # timestamps are mostly new: keep the cache bounded
                self._ts.clear()
            try:
                self._ts[stamp] = (dt.datetime.fromtimestamp(float(stamp), dt.UTC).replace(tzinfo=None)
                                   if self.fmt.ts_format == "epoch" else dt.datetime.strptime(stamp, self.fmt.ts_format))
            except (ValueError, OverflowError, OSError):
                self._ts[stamp] = None
        return self._ts[stamp]

    def header(self, text: str) -> tuple[dict[str, str], dt.datetime | None] | str:
        """Header fields (with the stripped Content) and timestamp, or a reject reason."""
        fmt = self.fmt
        m = self.header_rx.match(text)
        if m is None:
            return f"header mismatch: not a {fmt.name} line"
        groups = m.groupdict(default="")
        ts = None
        if fmt.ts_format:
            ts = self.parse_stamp(" ".join(groups[f] for f in fmt.ts_fields))
            if ts is None:
                return "bad timestamp"
        groups["Content"] = groups["Content"].strip()
        return groups, ts

    def cache_cluster(self, masked: str, cluster) -> None:
        """Remember a masked content's cluster; a full cache starts empty again (a cached
        content only skips Drain's tree search: forgetting it costs time, not correctness)."""
        if len(self._clusters) >= CACHE_LIMIT:
            self._clusters.clear()
        self._clusters[masked] = cluster

    def parse(self, text: str) -> ParsedLine | str:
        head = self.header(text)
        if isinstance(head, str):
            return head
        groups, ts = head
        masked = self.miner.masker.mask(groups["Content"])
        return ParsedLine(groups, ts, self.cluster(masked), masked)

    def cluster(self, masked: str, count: int = 1):
        """The Drain3 cluster of a masked content seen ``count`` times: looked up in the cache,
        else found or made by Drain3 (and its words recorded for the word splits)."""
        cluster = self._clusters.get(masked)
        if cluster is None:
            drain = self.miner.drain
            cluster, _ = drain.add_log_message(masked)
            cluster.size += count - 1
            self.miner.word_split.observe(cluster.cluster_id, drain.get_content_as_tokens(masked))
            self.cache_cluster(masked, cluster)
        else:
            cluster.size += count
        return cluster


def _label_rows(csv_path: Path, rejects: list) -> Iterator[tuple[int, list[str]]]:
    """``(line number, cells)`` of a labels CSV, one row a line (a quoted field does not span
    lines). A line with undecodable bytes or a NUL byte, or one the csv module cannot read (a
    field over its size limit), is a reject with the reason; a byte-order mark is dropped."""
    with csv_path.open("rb") as fh:
        for line_no, raw in enumerate(fh, 1):
            if line_no == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if "\ufffd" in text and b"\xef\xbf\xbd" not in raw:
                rejects.append((line_no, "undecodable bytes (not UTF-8)", text))
            elif "\x00" in text:
                rejects.append((line_no, "a NUL byte in the row", text.replace("\x00", "\\0")))
            else:
                try:
                    yield line_no, next(csv.reader([text]), [])
                except csv.Error as exc:
                    rejects.append((line_no, f"not a CSV row: {exc}", text))


def ingest_labels(csv_path, root, source: str, id_column: str | None = None, label_column: str | None = None,
                  ingest_date=None, part_stem: str | None = None) -> dict:
    """Write a labels CSV (with header) as ``labels/source=<src>/part-<file name>.parquet``.

    ``id_column`` / ``label_column`` default to the first and second CSV column (LogHub's
    ``BlockId,Label``, the session generator's ``session_id,label``). Rows with an empty id or
    label, or a repeated id, and lines that are not a readable row (:func:`_label_rows`) go to
    rejects (the ``ingest_date`` partition, default today) with a reason (a blank row: a missing
    id). ``part_stem`` names the part instead of the file's stem (the landing ingest gives each
    day's ``labels.csv`` its own part, parsers.landing).
    """
    csv_path = Path(csv_path)
    ids, labels, rejects, seen = [], [], storage.Rejects(), set()
    rows = _label_rows(csv_path, rejects)
    header = next((row for _, row in rows if any(cell.strip() for cell in row)), None)
    if not header:
        raise ValueError(f"labels file {csv_path} is empty; it needs a header row and one row per sequence")
    for name in (id_column, label_column):
        if name is not None and name not in header:
            raise ValueError(f"labels file {csv_path} has no column {name!r}; its columns: {', '.join(header)} "
                             "(set label_id_column / label_column, or --label-id-column / --label-column)")
    if len(header) < 2 and (id_column is None or label_column is None):
        raise ValueError(f"labels file {csv_path} has one column ({header[0]!r}); it needs an id and a label column")
    id_i = header.index(id_column) if id_column else 0
    lab_i = header.index(label_column) if label_column else 1
    for line_no, row in rows:
        sid = row[id_i].strip() if len(row) > id_i else ""
        label = row[lab_i].strip() if len(row) > lab_i else ""
        reason = "missing id or label" if not sid or not label else "duplicate id" if sid in seen else None
        if reason:
            rejects.append((line_no, reason, ",".join(row)))
            continue
        seen.add(sid)
        ids.append(sid)
        labels.append(label)
    rejects.sort(key=lambda r: r[0])
    named_as = Path(part_stem + ".csv") if part_stem else csv_path
    path = storage.labels_path(root, source, named_as)
    storage.write_parquet_atomic(pa.table({"sequence_id": ids, "label": labels}, schema=storage.LABELS_SCHEMA), path)
    storage.drop_legacy_part(path, named_as)
    rej_path = storage.write_rejects(root, source, ingest_date, named_as, rejects)
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

