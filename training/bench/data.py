"""Labelled datasets for ``seqenc bench accuracy``, a classic count-vector baseline and a floor.

Four datasets, each as long-form key-value objects (``parsers.storage.OBJECTS_SCHEMA``), one
label per sequence and a fixed train/dev/test split (:class:`LabelledDataset`):

* ``hdfs`` -- real HDFS_1 blocks (DeepLog release under ``<data_dir>/hdfs_deeplog``,
  training.bench.hdfs), split so that each distinct event sequence lies in one split only
  (``by_content``, seeded, about 60/20/20 of the blocks of each label); on request
  (``split="by_line"``) the earlier split by line index within each file, where most test blocks
  repeat a train block's sequence;
* ``bgl`` -- the real ``loghub/BGL/BGL_2k.log`` through the real log ingest (node x 1 h windows);
* ``milestone`` -- the demo's generated user sessions through the real JSON events ingest;
* ``value_anomaly`` -- generated HDFS-like logs whose anomalies show only in parameter values
  (parsers.value_anomaly), through the real log ingest;
* ``next_item`` -- generated Instacart-like purchase histories (parsers.purchases) through the
  real JSON events ingest; the target is the next product (task ``next_item``, recall@k).

Choices:

* Generated and ingested files live under ``<workdir>/benchdata/<name>/`` (``raw/`` and the
  ingest root ``data/``); the ingest root is removed first, so Drain3 starts from an empty
  state and a second call gives the same template ids. Nothing else is written.
* The ingest partition date is fixed (``INGEST_DATE``), so the objects do not depend on the day.
* ``seed`` drives the generators (milestone, value_anomaly), the stratified splits and the hdfs
  ``by_content`` split; the hdfs ``by_line`` split does not depend on it.
* Each dataset has one split rule (``LabelledDataset.split_rule``: ``by_content`` / ``by_line`` for
  hdfs, ``stratified`` for bgl, milestone and value_anomaly, ``random`` for next_item); only hdfs
  offers a second one (``SPLIT_RULES``); asking another dataset for one it lacks is an error.
* :func:`duplicates_across_splits` counts the dev and test sequences whose *content* also occurs
  in another split. Content = the sequence's ordered (key, value) pairs over the keys that enter
  its value sequences (every key but ``exclude_keys``), in object order. The value sequences
  S(k) are these pairs grouped by key, so two sequences with the same content are the same
  input to TVM-KA (and to the count baseline, whose event key is among those keys). For hdfs the
  content is the event sequence; it is 0 for hdfs ``by_content`` by construction. (The coarser
  event-key sequence alone would call two bgl windows equal that differ in their values.)
  ``ordered=False`` compares bags of pairs instead: on hdfs ``by_content`` ~99 % of the dev and
  test normal blocks hold the same events as a train normal block, only in another order (seed
  12: 965 of 971 test normal blocks), so an order-blind model meets most of them "before".
* Stratified splits (:func:`stratified_split`) are done per class on the sorted sequence ids with
  a seeded permutation: round(20 %) test, round(20 %) dev, the rest train, and at least one of a
  class in dev and in test whenever the class has three or more sequences (BGL has few anomalous
  windows). ``training.tasks.data.split_indices`` gives no such guarantee (and imports torch).
* Log datasets get an ``event`` key per line, ``E<template_id>`` (``seqenc.sequences.with_event_key``),
  which is what the count baseline counts.
* Baselines (training.tasks.baselines): ``count_baseline`` (logistic regression on event
  counts), on binary datasets ``count_pca`` (loglizer's unsupervised PCA detector on event
  counts, no label read) and ``always_positive`` (every sequence flagged: the floor a detector
  must beat).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import polars as pl

from parsers import storage
from training.tasks.dataset import BINARY, SPLITS, LabelledDataset, _check, _finish, _labelled, _require  # noqa: F401

DATASETS = ("hdfs", "bgl", "milestone", "value_anomaly", "next_item")
# the split rules each dataset offers, its default first
SPLIT_RULES = {"hdfs": ("by_content", "by_line"), "bgl": ("stratified",), "milestone": ("stratified",),
               "value_anomaly": ("stratified",), "next_item": ("random",)}
INGEST_DATE = "2000-01-01"
MILESTONE_SESSIONS = 1200
VALUE_ANOMALY_BLOCKS = 1500
VALUE_ANOMALY_RATE = 0.1
NEXT_ITEM_USERS = 1500
NEXT_ITEM_PRODUCTS = 200


def load_dataset(name: str, data_dir, workdir, seed: int = 0, limit: int | None = None,
                 split: str | None = None) -> LabelledDataset:
    """Build one dataset. ``data_dir`` holds the real data (``hdfs_deeplog/``, ``loghub/``);
    ``workdir`` receives generated and ingested files. ``limit`` caps the size: hdfs lines kept
    per file (before splitting), bgl log lines read, milestone sessions, value_anomaly blocks,
    next_item users. ``split``: one of the dataset's SPLIT_RULES (None: its default)."""
    from training.bench.hdfs import load_hdfs

    split = check_split(name, split)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if name == "hdfs":
        ds = load_hdfs(Path(data_dir), Path(workdir), seed, limit, split)
    else:
        loader = {"bgl": _bgl, "milestone": _milestone, "value_anomaly": _value_anomaly, "next_item": _next_item}
        ds = loader[name](Path(data_dir), Path(workdir), seed, limit)
    _check(ds)
    return ds


def check_split(name: str, split: str | None) -> str:
    """The split rule ``name`` will use: ``split``, or the dataset's default when None; a
    ValueError when the dataset has no such rule (only hdfs has two)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
    rules = SPLIT_RULES[name]
    if split is None:
        return rules[0]
    if split not in rules:
        raise ValueError(f"dataset {name!r} has no split {split!r} (it has: {', '.join(rules)})")
    return split


# --------------------------------------------------------------------------- helpers


def _fresh(workdir: Path, name: str) -> tuple[Path, Path]:
    """``raw/`` and an empty ingest root ``data/`` under ``<workdir>/benchdata/<name>``."""
    base = workdir / "benchdata" / name
    shutil.rmtree(base / "data", ignore_errors=True)
    (base / "raw").mkdir(parents=True, exist_ok=True)
    return base / "raw", base / "data"


def _as_objects(frame: pl.DataFrame) -> pl.DataFrame:
    """The OBJECTS_SCHEMA columns and types, rows by sequence then step (key order kept)."""
    schema = storage.polars_schema(storage.OBJECTS_SCHEMA)
    return frame.select(schema.names()).cast(schema).sort("sequence_id", "step", maintain_order=True)


def stratified_split(labels: pl.DataFrame, seed: int, dev: float = 0.2, test: float = 0.2) -> pl.DataFrame:
    """``sequence_id, split``: per class (sorted ids, seeded permutation) round(test * n) test,
    round(dev * n) dev, the rest train; a class of >= 3 sequences has >= 1 in dev and in test."""
    rng = np.random.default_rng(seed)
    ids, splits = [], []
    by_class = labels.sort("sequence_id").group_by("label", maintain_order=True).agg("sequence_id").sort("label")
    for members in by_class["sequence_id"].to_list():
        n = len(members)
        n_test, n_dev = int(test * n + 0.5), int(dev * n + 0.5)
        if n >= 3:
            n_test, n_dev = max(1, n_test), max(1, n_dev)
        order = rng.permutation(n)
        ids.extend(members[i] for i in order)
        splits.extend(["test"] * n_test + ["dev"] * n_dev + ["train"] * (n - n_test - n_dev))
    return pl.DataFrame({"sequence_id": ids, "split": splits}, schema={"sequence_id": pl.String,
                                                                          "split": pl.String}).sort("sequence_id")


# --------------------------------------------------------------------------- datasets


def _log_objects(root: Path, source: str) -> pl.DataFrame:
    from seqenc.sequences import with_event_key

    return with_event_key(storage.read_objects(root, source, INGEST_DATE))


def _bgl(data_dir: Path, workdir: Path, seed: int, limit: int | None) -> LabelledDataset:
    from parsers.log_ingest import ingest_logs

    log = _require(data_dir / "loghub" / "BGL" / "BGL_2k.log")
    raw, root = _fresh(workdir, "bgl")
    if limit is not None:  # the first lines only, written under raw/ (same file name: same part name)
        with log.open(encoding="utf-8") as fh:
            head = [line for _, line in zip(range(limit), fh)]
        log = raw / log.name
        log.write_text("".join(head), encoding="utf-8")
    report = ingest_logs(log, root, source="bgl", preset="bgl", ingest_date=INGEST_DATE)
    objects, labels = _labelled(_log_objects(root, "bgl"), storage.read_labels(root, "bgl"))
    ds = LabelledDataset(
        "bgl", "binary", BINARY, _as_objects(objects), labels, stratified_split(labels, seed), "event",
        ("timestamp", "date", "time", "node", "noderepeat", "template"),
        "Real BGL lines (loghub/BGL/BGL_2k.log" + (f", first {limit} lines" if limit else "") + ") through the "
        "real log ingest (preset bgl: Drain3, one sequence per node x fixed 1 h window, id "
        "<node>@<window start>). Each line is an object with its header keys (timestamp, date, node, time, "
        "noderepeat, type, component, level), template, named slots, and event = E<Drain3 template id>. "
        "Label: Anomaly when any line of the window has an alert category in its first field (not '-'), "
        "else Normal (the ingest's labels table). Left out of the value sequences: the clock fields "
        "(timestamp, date, time: unique per line), node and noderepeat (constant per window and equal to "
        "the sequence id's node: a model could memorise failing nodes) and the template text (a function "
        f"of the event id). Split: stratified by label with seed {seed} (per class, sorted ids, seeded "
        "permutation: round(20%) test, round(20%) dev, rest train; at least one anomalous window in dev and "
        "in test when there are three or more).",
        {"raw": str(log), "ingest": report})
    return _finish(ds)


def _milestone(data_dir: Path, workdir: Path, seed: int, limit: int | None) -> LabelledDataset:
    from parsers.events import ingest_events
    from parsers.logs import ingest_labels
    from parsers.synthetic import SESSION_LABELS, generate_session_events

    raw, root = _fresh(workdir, "milestone")
    n = limit or MILESTONE_SESSIONS
    gen = generate_session_events(raw / "sessions.jsonl", raw / "sessions_labels.csv", n_sessions=n, seed=seed)
    report = ingest_events(raw / "sessions.jsonl", root, source="sessions", ingest_date=INGEST_DATE)
    ingest_labels(raw / "sessions_labels.csv", root, "sessions", id_column="session_id", label_column="label")
    objects, labels = _labelled(storage.read_objects(root, "sessions", INGEST_DATE),
                                storage.read_labels(root, "sessions"))
    ds = LabelledDataset(
        "milestone", "multiclass", tuple(SESSION_LABELS), _as_objects(objects), labels,
        stratified_split(labels, seed), "event_type", (),
        f"The demo's generated user sessions (parsers.synthetic.generate_session_events, {n} sessions, "
        f"seed {seed}): JSON Lines events through the real events ingest, one sequence per session, one "
        "object per event with dotted keys (event_type, user.*, payload.*; ts in the ts column). Label: "
        "what the user does after the observed prefix (none / upgrade / help_chat, 5 % flipped), from the "
        "generator's label file. No key is left out (as in the demo's milestone task). Split: stratified "
        f"by label with seed {seed} (per class, sorted ids, seeded permutation: round(20%) test, round(20%) "
        "dev, rest train).",
        {"raw": str(raw), "generator": gen, "ingest": report})
    return _finish(ds)


def _value_anomaly(data_dir: Path, workdir: Path, seed: int, limit: int | None) -> LabelledDataset:
    from parsers.log_ingest import ingest_logs
    from parsers.logs import ingest_labels
    from parsers.value_anomaly import generate_value_anomaly_logs

    raw, root = _fresh(workdir, "value_anomaly")
    n = limit or VALUE_ANOMALY_BLOCKS
    log, labels_csv = raw / "value_anomaly.log", raw / "value_anomaly_labels.csv"
    gen = generate_value_anomaly_logs(log, labels_csv, n_blocks=n, anomaly_rate=VALUE_ANOMALY_RATE, seed=seed)
    report = ingest_logs(log, root, source="value_anomaly", preset="hdfs", ingest_date=INGEST_DATE)
    ingest_labels(labels_csv, root, "value_anomaly", id_column="BlockId", label_column="Label")
    objects, labels = _labelled(_log_objects(root, "value_anomaly"), storage.read_labels(root, "value_anomaly"))
    kinds = ", ".join(f"{v} {k}" for k, v in gen["anomaly_kinds"].items())
    ds = LabelledDataset(
        "value_anomaly", "binary", BINARY, _as_objects(objects), labels, stratified_split(labels, seed), "event",
        ("date", "time", "pid", "template"),
        f"Generated HDFS-like raw logs (parsers.value_anomaly, {n} blocks, seed {seed}, "
        f"{gen['anomalies']} anomalous: {kinds}) whose anomalies show only in parameter values: a replica "
        "size that disagrees with the others, a data node outside the block's pipeline, a data-node port "
        "normal blocks never use, a size above the 64 MiB block size. Event types, counts and order of "
        "every block come from one label-independent distribution. Through the real log ingest (preset "
        "hdfs: Drain3, one sequence per block id); each line is an object with header keys, template, "
        "named slots (size, datanode, src, dest, src_ip, ...) and event = E<Drain3 template id>. Labels "
        "from the generator. Left out of the value sequences, as in the demo's anomaly task: date, time, "
        f"pid (unique per line) and the template text. Split: stratified by label with seed {seed} (per "
        "class, sorted ids, seeded permutation: round(20%) test, round(20%) dev, rest train).",
        {"raw": str(log), "generator": {k: v for k, v in gen.items() if k != "kinds"}, "kinds": gen["kinds"],
         "ingest": report})
    return _finish(ds)


def _next_item(data_dir: Path, workdir: Path, seed: int, limit: int | None) -> LabelledDataset:
    from parsers.events import ingest_events
    from parsers.logs import ingest_labels
    from parsers.purchases import catalogue, generate_purchases

    raw, root = _fresh(workdir, "next_item")
    n = limit or NEXT_ITEM_USERS
    gen = generate_purchases(raw / "purchases.jsonl", raw / "purchases_labels.csv", n_users=n,
                             n_products=NEXT_ITEM_PRODUCTS, seed=seed)
    report = ingest_events(raw / "purchases.jsonl", root, source="purchases", ingest_date=INGEST_DATE)
    ingest_labels(raw / "purchases_labels.csv", root, "purchases", id_column="session_id", label_column="label")
    objects, labels = _labelled(storage.read_objects(root, "purchases", INGEST_DATE),
                                storage.read_labels(root, "purchases"))
    # one stratum: a split stratified by target product would leave most products' few users in train
    split = stratified_split(labels.with_columns(label=pl.lit("all")), seed)
    ds = LabelledDataset(
        "next_item", "next_item", tuple(catalogue(NEXT_ITEM_PRODUCTS)), _as_objects(objects), labels, split,
        "product", ("event_type",),
        f"Generated Instacart-like purchase histories (parsers.purchases, {n} users, {NEXT_ITEM_PRODUCTS} "
        f"products, seed {seed}): each user buys a personal routine of 3-8 products in a fixed cyclic order, "
        "with 25 % impulse buys from a Zipf-like popularity; the target is the product bought next (the "
        "routine's next product with probability 0.9). JSON Lines through the real events ingest, one "
        "sequence per user, one object per purchase (product, aisle, department, order_dow, order_hour, "
        "add_to_cart_order, reordered). Left out of the value sequences: event_type (always 'purchase'). "
        f"Task next_item over the whole catalogue, scored by recall@1/5/10 and MRR. Split: seeded random "
        f"(seed {seed}): round(20%) test, round(20%) dev, rest train.",
        {"raw": str(raw), "generator": gen, "ingest": report}, split_rule="random")
    return _finish(ds)


# --------------------------------------------------------------------------- content duplicates


def sequence_contents(ds: LabelledDataset, ordered: bool = True) -> pl.DataFrame:
    """``sequence_id, content``: the ordered (key, value) pairs of each sequence over the keys of
    its value sequences (not ``exclude_keys``), by step and then the stored key order, as one
    string; a sequence with no such key has content "". ``ordered=False``: the pairs sorted,
    so the content is the sequence's bag of pairs (the same values in any order)."""
    pair = pl.col("key") + "\x1f" + pl.col("value").fill_null("\x00")
    pairs = (ds.objects.filter(~pl.col("key").is_in(list(ds.exclude_keys)))
             .sort("sequence_id", "step", maintain_order=True)
             .group_by("sequence_id", maintain_order=True)
             .agg(content=(pair if ordered else pair.sort()).str.join("\x1e")))
    return ds.split.select("sequence_id").join(pairs, on="sequence_id", how="left").with_columns(
        pl.col("content").fill_null(""))


def duplicates_across_splits(ds: LabelledDataset, ordered: bool = True) -> int:
    """How many dev and test sequences have a content (:func:`sequence_contents`) that also
    occurs in another split -- inputs the model may have met verbatim before it is scored.
    ``ordered=False`` compares bags of (key, value) pairs: a sequence whose values a train
    sequence holds in another order counts (what an order-blind model, such as counts LR, sees
    as met before)."""
    rows = ds.split.join(sequence_contents(ds, ordered), on="sequence_id")
    shared = rows.group_by("content").agg(n_splits=pl.col("split").n_unique()).filter(pl.col("n_splits") > 1)
    return rows.filter(pl.col("split").is_in(["dev", "test"]) & pl.col("content").is_in(shared["content"].implode())
                       ).height
