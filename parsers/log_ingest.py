"""``ingest_logs``: a raw log file -> Parquet key-value objects, in batches of lines.

Reading (parsers.line_reader.LineReader): blocks of the file are decoded and split in one call
each; bad lines become rejects.

Pass 1 (learn): per batch of lines, one polars query (streaming engine, all cores) splits the
headers, masks the contents and pulls out the sequence ids (parsers.columns); timestamps are
parsed per distinct stamp. Each *distinct* masked content new to the run goes to Drain3 in file
order (the cache from masked content to cluster makes repeats free). Only compact numbers are
kept per line: its cluster id, and one (line, sequence, time) row per sequence it belongs to.
Rejects are collected with their reasons.

Between the passes, ``step`` (position in the sequence, by time then line number) is computed
for every (line, sequence) row with one numpy sort.

The lines to write go to a temporary spill (Arrow IPC, one file per batch, beside the output)
with their header fields, content and cluster, so memory stays flat with input size.

Pass 2 (write): per spilled batch, each line's slots are extracted against its cluster's
*final* template (templates generalise while Drain learns) with one capture regex per template,
all templates at once; lines the regex does not match fall back to Drain3's own
``extract_parameters``, and lines neither matches are counted as ``param_failures`` and keep
their header keys and template. The long-form rows are assembled by index arithmetic (one
gather per column, no join, no sort) and streamed into one Parquet file by polars' sink, which
encodes on its own threads while the next batch is computed (parsers.storage.write_batches_atomic).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from parsers import columns, storage
from parsers.logs import LineParser, events_of, load_key_names, slot_names
from parsers.presets import LogFormat, resolve
from parsers.sessions import SessionSpec
from parsers.spill import SequenceRows, Spill

logger = logging.getLogger(__name__)

_EPOCH = dt.datetime(1970, 1, 1)  # timestamps are naive UTC


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


def _keep(frame, mask: pl.Series):
    """``frame.filter(mask)``, without the copy when every row is kept."""
    return frame if mask.all() else frame.filter(mask)


@dataclass
class FrozenTemplates:
    """Clusters decided before a file is read (parallel ingest, parsers.parallel_ingest): the
    cluster id of every masked content of the file, and the template of every such cluster.
    With them the ingest neither searches nor changes the Drain3 tree."""

    clusters: dict[str, int]  # masked content -> cluster id
    templates: dict[int, str]  # cluster id -> its template when the contents were merged
    new_templates: int = 0  # clusters the merge created for this file
    total_templates: int = 0  # clusters of the source after the merge

    def assign(self, masked: pl.Series) -> pl.Series:
        ids = masked.replace_strict(self.clusters, default=None, return_dtype=pl.Int64)
        if ids.null_count():
            example = masked.filter(ids.is_null())[0]
            raise ValueError(f"a line's content was not mined ({example[:80]!r}): the file changed after the "
                             "mine step; run the interval's mine, merge and write steps again")
        return ids


class Learner:
    """Pass 1 state: the compact per-line numbers and what is counted. ``assign`` (frozen
    templates) replaces Drain3 for the cluster of each line."""

    def __init__(self, fmt: LogFormat, session: SessionSpec, parser: LineParser, assign=None):
        self.fmt, self.session, self.parser, self.assign = fmt, session, parser, assign
        self.rows = SequenceRows()
        self.anomalous: set[int] = set()
        self.rejects = storage.Rejects()
        self.parsed = self.no_id = 0

    def _clusters(self, masked: pl.Series) -> pl.Series:
        """Cluster id per line: each distinct masked content new to the run goes to Drain3 once,
        in file order; repeats only add to the cluster's size (LineParser.cluster, which also
        records the words for the word splits, decided after pass 1: WordSplitEvents)."""
        if self.assign is not None:
            return self.assign(masked)
        counts = dict(masked.value_counts().iter_rows())
        ids = {text: self.parser.cluster(text, counts[text]).cluster_id for text in masked.unique(maintain_order=True)}
        return masked.replace_strict(ids, return_dtype=pl.Int64)

    def _window_ids(self, frame: pl.DataFrame) -> pl.Series:
        """Sessions by field and time window: list of sequence ids per line (null: the line
        cannot be placed: a reject). Sessions by id pattern are extracted in ``add``."""
        out = []
        for groups, ts in zip(frame.iter_rows(named=True), frame["ts"].to_list()):
            when = None if ts is None else _EPOCH + dt.timedelta(microseconds=ts)
            ids = self.session.sequence_ids(groups, groups["Content"], when)
            out.append(None if isinstance(ids, str) else ids)
        return pl.Series(out, dtype=pl.List(pl.String))

    def place(self, lines: pl.DataFrame) -> tuple[pl.DataFrame, pl.Series]:
        """One batch of lines (``line_no, text``) -> the lines that reach Drain3 (header fields,
        Content, ``masked``, ``ts``) and their sequence ids; the others become rejects."""
        fmt = self.fmt
        content = pl.col("Content")
        derived = {"masked": columns.mask(content, fmt)}
        if self.session.id_pattern:
            derived["ids"] = content.str.extract_all(self.session.id_pattern).list.unique(maintain_order=True)
        # the streaming engine runs these string kernels on all cores, morsel by morsel
        frame = columns.split_headers(lines.lazy(), fmt).with_columns(**derived).collect(engine="streaming")
        frame = frame.with_columns(_timestamps(frame, fmt, self.parser))
        header_ok = frame["Content"].is_not_null()
        ts_ok = pl.repeat(True, frame.height, eager=True) if not fmt.ts_format else \
            frame["ts"].is_not_null() | ~header_ok
        good = _keep(frame, header_ok & ts_ok)
        ids = good["ids"] if self.session.id_pattern else self._window_ids(good)
        placed = ids.is_not_null()
        self.rejects.extend(self._reasons(frame, header_ok, ts_ok, good, placed))
        good, ids = _keep(good, placed), _keep(ids, placed)
        self.parsed += good.height
        return good, ids

    def add(self, lines: pl.DataFrame) -> pl.DataFrame:
        """Learn from one batch of lines (``line_no, text``); return its lines to write (header
        fields, Content, line_no, cluster), which the caller spills to disk for pass 2."""
        good, ids = self.place(lines)
        good = good.with_columns(cluster=self._clusters(good["masked"]))
        has_id = ids.list.len() > 0
        self.no_id += int((~has_id).sum())
        good, ids = _keep(good, has_id), _keep(ids, has_id)
        self._rows(good, ids)
        return good.select(*self.fmt.key_fields, "Content", "line_no", "cluster")

    def _reasons(self, frame, header_ok, ts_ok, good, placed):
        """(line number, reason, raw text) of the batch's rejected lines."""
        bad_header = frame.filter(~header_ok)
        for n, text in zip(bad_header["line_no"].to_list(), bad_header["text"].to_list()):
            yield n, f"header mismatch: not a {self.fmt.name} line", text
        bad_ts = frame.filter(~ts_ok)
        for n, text in zip(bad_ts["line_no"].to_list(), bad_ts["text"].to_list()):
            yield n, "bad timestamp", text
        unplaced = good.filter(~placed)
        for n, text in zip(unplaced["line_no"].to_list(), unplaced["text"].to_list()):
            yield n, "no timestamp: cannot place the line in a time window", text

    def _rows(self, good: pl.DataFrame, ids: pl.Series) -> None:
        exploded = good.select("line_no", "ts", *[self.fmt.label_field] if self.fmt.label_field else []) \
            .with_columns(sid=ids).explode("sid")
        codes = self.rows.add(exploded["line_no"], exploded["sid"], exploded["ts"])
        if self.fmt.label_field:
            self.anomalous.update(codes[(exploded[self.fmt.label_field] != "-").to_numpy()].tolist())


class WordSplitEvents:
    """Pass 2's word splits (parsers.word_split): the lines of a template that splits get their
    event's id, and ``templates`` the event's template. Decided on the state after pass 1, as the
    parallel merge decides it after each file's contents; event ids are drawn in the order the
    file first shows each content. Only the lines of a splitting template are masked again."""

    def __init__(self, fmt: LogFormat, miner, templates: dict) -> None:
        self.fmt, self.miner, self.templates = fmt, miner, templates
        split = miner.word_split
        self.clusters = {c.cluster_id: c for c in miner.drain.clusters
                         if split.split_positions(c.cluster_id, c.log_template_tokens)}

    def apply(self, batch: pl.DataFrame) -> pl.DataFrame:
        if not self.clusters or not batch.height:
            return batch
        hit = batch["cluster"].is_in(list(self.clusters))
        if not hit.any():
            return batch
        rows = batch.filter(hit).select("cluster", masked=columns.mask(pl.col("Content"), self.fmt))
        contents = {text: self.clusters[cid] for cid, text in rows.unique(subset="masked", maintain_order=True).iter_rows()}
        events = events_of(self.miner, contents)
        self.templates |= {eid: template for eid, template in events.values()}
        ids = batch["cluster"].to_numpy().copy()
        ids[hit.to_numpy()] = rows["masked"].replace_strict({t: e for t, (e, _) in events.items()},
                                                            return_dtype=pl.Int64).to_numpy()
        return batch.with_columns(cluster=pl.Series(ids, dtype=pl.Int64))


@dataclass
class _Group:
    """Lines of a batch that share a template and a key list; ``columns`` holds one value per
    key, each a Series with a value per line, or a single value shared by all lines."""

    line_no: np.ndarray
    template_id: int
    keys: list[str]
    columns: list[pl.Series]


def _groups(batch: pl.DataFrame, templates: dict, miner, fmt: LogFormat, key_names, counts) -> list[_Group]:
    """The batch's lines by template, with their values: header fields, ``template``, then the
    named slots. One capture regex per template over its lines, every template at once on all
    cores. Lines their template's regex does not match fall back to Drain3's own extraction
    (exact, then fuzzy; else only the header keys and template, counted in ``param_failures``)."""
    header_keys = [f.lower() for f in fmt.key_fields]
    reserved = {*header_keys, "template"}
    parts = batch.partition_by("cluster", as_dict=True, maintain_order=True)
    plans, queries = [], []
    for (cid,), part in parts.items():
        template = templates[cid]
        pattern, mask_names = columns.template_regex(template, tuple(fmt.masks))
        names = slot_names(template, list(mask_names), key_names, reserved)
        plans.append((cid, part, template, [*header_keys, "template", *names]))
        content = pl.col("Content")
        queries.append(part.lazy().select(content.str.extract_groups(pattern).struct.unnest()) if names
                       else part.lazy().select(_matched=content.str.contains(pattern)))
    groups, failed = [], []
    for (cid, part, template, keys), slots in zip(plans, pl.collect_all(queries)):
        matched = slots.select(pl.all_horizontal(pl.all().is_not_null())).to_series() if "_matched" not in slots \
            else slots["_matched"]
        if not matched.all():
            failed.append(part.filter(~matched))
            part, slots = part.filter(matched), slots.filter(matched)
        if part.height:
            cols = [part[f] for f in fmt.key_fields] + [pl.Series([template])]
            groups.append(_Group(part["line_no"].to_numpy(), cid, keys,
                                 cols + ([] if "_matched" in slots else slots.get_columns())))
    fallback: dict[tuple, list] = {}
    for row in (pl.concat(failed).iter_rows(named=True) if failed else ()):
        template = templates[row["cluster"]]
        params = miner.extract_parameters(template, row["Content"]) or \
            miner.extract_parameters(template, row["Content"], exact_matching=False)
        if params is None:
            counts["param_failures"] += 1
            params = []
        keys = (*header_keys, "template", *slot_names(template, [p.mask_name for p in params], key_names, reserved))
        values = [*(row[f] for f in fmt.key_fields), template, *(p.value for p in params)]
        fallback.setdefault((row["cluster"], keys), []).append((row["line_no"], values))
    for (cid, keys), lines in fallback.items():
        groups.append(_Group(np.array([n for n, _ in lines], dtype=np.int64), cid, list(keys),
                             [pl.Series([v[k] for _, v in lines], dtype=pl.String) for k in range(len(keys))]))
    return groups


def _objects(groups: list[_Group], rows: pl.DataFrame, sequences: SequenceRows) -> pl.DataFrame:
    """Long-form object rows for ``rows`` (one per (line, sequence), sorted by line, then
    sequence): each row repeated once per key of its line, in key order.

    Index arithmetic instead of a join and a sort: every group's value columns are concatenated
    once; the value of key ``k`` of the ``j``-th line of group ``g`` sits at
    ``base[g, k] + stride[g, k] * j`` (stride 0 for a value shared by the group), so one gather
    builds the ``value`` column in output order."""
    if not groups:
        return pl.DataFrame()
    n_keys = np.array([len(g.keys) for g in groups])
    first_column = np.r_[0, np.cumsum(n_keys)[:-1]]  # (g, k) -> column number first_column[g] + k
    lengths = np.array([len(c) for g in groups for c in g.columns])
    base = np.r_[0, np.cumsum(lengths)[:-1]]
    stride = (lengths > 1).astype(np.int64)
    line_no = np.concatenate([g.line_no for g in groups])
    line_group = np.repeat(np.arange(len(groups)), [len(g.line_no) for g in groups])
    line_pos = np.concatenate([np.arange(len(g.line_no)) for g in groups])
    by_line = np.argsort(line_no, kind="stable")
    at = by_line[np.searchsorted(line_no[by_line], rows["line_no"].to_numpy())]  # row -> line

    group, pos = line_group[at], line_pos[at]
    per_row = n_keys[group]
    row_of = np.repeat(np.arange(len(at)), per_row)  # output row -> input row
    k = np.arange(per_row.sum()) - np.repeat(np.cumsum(per_row) - per_row, per_row)
    column = first_column[group[row_of]] + k
    values = pl.concat([c for g in groups for c in g.columns], rechunk=True).cast(pl.String)
    keys = pl.Series([key for g in groups for key in g.keys], dtype=pl.String)
    return pl.DataFrame({
        **sequences.columns(rows, per_row),
        "key": keys.gather(column),
        "value": values.gather(base[column] + stride[column] * pos[row_of]),
        "template_id": np.array([g.template_id for g in groups])[group[row_of]],
    })


def ingest_logs(log_path, root, source: str = "hdfs", preset: str | LogFormat = "hdfs", ingest_date=None,
                session: SessionSpec | None = None, max_reject_share: float | None = None,
                batch_lines: int = 200_000, frozen: FrozenTemplates | None = None) -> dict:
    """Parse a raw log file into ``objects`` (and ``rejects``) Parquet under ``root``.

    ``session`` overrides the format's grouping (parsers.sessions). A format with a
    ``label_field`` (BGL) also writes ``labels``: a sequence is ``Anomaly`` when any of its lines
    carries a label other than ``-``, else ``Normal``.

    Returns a report: ``read, parsed, rejected, reject_share, blank, no_sequence_id, objects,
    rows, sequences, templates, new_templates, param_failures, objects_path, rejects_path,
    labels_path, state_path, session, seconds``. Blank lines are counted (``blank``) and
    skipped. When ``rejected / read`` passes ``max_reject_share``, only the rejects are written
    and :class:`parsers.storage.RejectShareExceeded` is raised (no objects, labels or Drain3
    state). Two ingests of one source run one after the other
    (:func:`parsers.storage.source_lock`): they share its Drain3 state.

    ``frozen``: the file's clusters were decided beforehand (parsers.parallel_ingest, which
    mines every file of a batch, merges them into the Drain3 state in one serial step, then
    writes the files in parallel with this): Drain3 is not searched, its state neither read
    nor written, and no lock is taken.
    """
    if frozen is not None:
        return _ingest_logs(log_path, root, source, preset, ingest_date, session, max_reject_share, batch_lines,
                            frozen)
    with storage.source_lock(root, source):
        return _ingest_logs(log_path, root, source, preset, ingest_date, session, max_reject_share, batch_lines)


def _ingest_logs(log_path, root, source: str, preset, ingest_date, session: SessionSpec | None,
                 max_reject_share: float | None, batch_lines: int, frozen: FrozenTemplates | None = None) -> dict:
    """:func:`ingest_logs` (under the source's lock unless ``frozen``)."""
    start = time.perf_counter()
    fmt = resolve(preset)
    log_path = Path(log_path)
    session = session or fmt.session_spec()
    state_path = storage.drain_state_path(root, source)
    parser = LineParser(fmt, None if frozen else state_path)
    miner = parser.miner
    clusters_before = len(miner.drain.clusters)

    obj_path = storage.objects_path(root, source, ingest_date, log_path)
    with Spill(obj_path) as spill:
        # ---- pass 1: learn templates, place lines in sequences, spill the lines to disk
        learner = Learner(fmt, session, parser, assign=frozen.assign if frozen else None)
        reader = storage.LineReader(log_path, learner.rejects)
        for lines in reader.frames(batch_lines):
            spill.write(learner.add(lines))
        learner.rows.finish()
        storage.refuse_rejected_input(root, source, ingest_date, log_path, learner.rejects, reader.read,
                                      max_reject_share)

        # ---- pass 2: slots against the final templates, long-form rows, streamed to Parquet
        templates = frozen.templates if frozen else {c.cluster_id: c.get_template() for c in miner.drain.clusters}
        splits = None if frozen else WordSplitEvents(fmt, miner, templates)
        key_names = load_key_names(fmt)
        counts = {"param_failures": 0}

        def objects():
            for batch in spill:
                if splits is not None:
                    batch = splits.apply(batch)
                if batch.height:
                    groups = _groups(batch, templates, miner, fmt, key_names, counts)
                    yield _objects(groups, learner.rows.of_lines(batch["line_no"]), learner.rows)

        n_rows = storage.write_batches_atomic(objects(), obj_path, storage.OBJECTS_SCHEMA)
    storage.drop_legacy_part(obj_path, log_path)

    # ---- rejects, labels, then Drain3 state (after the data it describes)
    learner.rejects.sort(key=lambda r: r[0])
    rej_path = storage.write_rejects(root, source, ingest_date, log_path, learner.rejects)
    labels_path = None
    if fmt.label_field:
        names = learner.rows.names.to_list()
        labels = ["Anomaly" if code in learner.anomalous else "Normal" for code in range(len(names))]
        labels_path = storage.write_parquet_atomic(
            pa.table({"sequence_id": names, "label": labels}, schema=storage.LABELS_SCHEMA),
            storage.labels_path(root, source, log_path))
        storage.drop_legacy_part(labels_path, log_path)
    if frozen is None:
        miner.save_state(f"ingest {log_path.name}")

    report = {
        "read": reader.read,
        "parsed": learner.parsed,
        "rejected": len(learner.rejects),
        "blank": reader.blank,
        "no_sequence_id": learner.no_id,
        "objects": learner.rows.frame.height,
        "rows": n_rows,
        "sequences": len(learner.rows.names),
        "templates": frozen.total_templates if frozen else len(miner.drain.clusters),
        "new_templates": frozen.new_templates if frozen else len(miner.drain.clusters) - clusters_before,
        "param_failures": counts["param_failures"],
        "objects_path": str(obj_path),
        "rejects_path": str(rej_path) if rej_path else None,
        "labels_path": str(labels_path) if labels_path else None,
        "state_path": str(state_path),
        "session": session.describe(),
        "format": fmt.name,
        "header": fmt.header_regex or fmt.header,
        "seconds": round(time.perf_counter() - start, 3),
    }
    logger.info("ingested %s: %s", log_path, report)
    return storage.check_reject_share(report, max_reject_share)

