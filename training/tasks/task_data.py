"""A declared task's data: which sequences, which labels and classes, which split, which tokens.

The catalogue (training.tasks.catalog) says what a task is; this module reads the ingested objects and
labels of its source and turns them into what training reads, with the checks a user needs
(labels that match no sequence, one class only, an empty date range), each as one clear error:

* :func:`task_sequences`: the task's sequences, their labels (or none) and classes;
* :func:`assign_splits`: train / dev / test per sequence (stratified, fixed by id hash, or by time);
* :func:`vocab_and_windows`: the vocabulary and the tokenised S(k) windows.

Label convention (one place): ``y`` holds class indexes in the order of the task's classes
(binary: negative, positive; training.tasks.catalog.Task.ordered_classes) and ``-1`` for a sequence of
an unlabelled ``anomaly`` task that has no label (labels only evaluate such a task).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from parsers import storage
from seqenc.config import TVMKAConfig
from seqenc.numeric import BinFitter
from seqenc.sequences import (
    HISTORY_FEATURES,
    TokenizedSequences,
    collect_value_sequences,
    item_histories,
    tokenize_value_sequences,
    with_event_key,
)
from seqenc.tokenizer import ValueTokenizer
from training.tasks.catalog import Task
from training.tasks.data import fixed_split, split_indices
from training.tasks.spec import TaskSpec
from training.tasks.table_task import example_objects, groups_of, join_tables

log = logging.getLogger(__name__)

UNLABELLED = -1
TIME_SPLIT = (0.7, 0.15, 0.15)
TEXT_BATCH = 100_000  # texts handed to the WordPiece trainer at a time
VOCAB_SEQUENCES = 50_000  # train sequences the WordPiece vocabulary is learnt from, at most (vocab_sample)  # split = "time": oldest train, then dev, newest test


def task_objects(objects: pl.DataFrame, task: Task) -> pl.DataFrame:
    """The objects as the task's S(k) read them (:func:`keyed_objects`); ``exclude_keys`` are
    applied later, by collect_value_sequences."""
    return keyed_objects(objects, task.keep_keys, task.event_key)


def keyed_objects(objects: pl.DataFrame, keep_keys: list[str] | None, event_key: bool) -> pl.DataFrame:
    """The event key added (``event_key``), only the ``keep_keys`` when given (the event key
    stays): what training read, and what scoring rebuilds from a bundle's metadata."""
    if event_key:
        objects = with_event_key(objects)
    if keep_keys is not None:
        keep = set(keep_keys) | ({"event"} if event_key else set())
        objects = objects.filter(pl.col("key").is_in(sorted(keep)))
    return objects


def stable_sample(ids: pl.Series, n: int) -> pl.Series:
    """The ``n`` ids with the smallest hash (ties by id): the same ids from one night to the next
    while they are there (polars' seeded hash: stable within a polars version)."""
    return pl.DataFrame({"id": ids, "h": ids.hash(seed=0)}).sort("h", "id").head(n)["id"]


@dataclass
class TaskInput:
    """What a task reads, before anything is collected: ``objects`` (lazy, only the sequences
    kept), ``sequence_ids`` (those sequences, first-seen order), ``labels`` (``sequence_id,
    label`` of those sequences, one each; may be empty for ``anomaly``) and ``classes``."""

    objects: pl.LazyFrame
    sequence_ids: pl.Series
    labels: pl.DataFrame
    classes: list[str]
    groups: pl.DataFrame | None = None  # sequence_id, group: the task's grouping key (``grouped`` split)
    given_splits: pl.DataFrame | None = None  # sequence_id, group: the task's split_key (a fixed split)
    # labels_unmatched: labels whose id names no sequence read; label_conflicts: ids that label
    # files label differently (parsers.storage.unique_labels: the newest ingest wins)
    label_report: dict = field(default_factory=dict)


def task_input(task: TaskSpec, root: str | Path, ingest_date=None) -> TaskInput:
    """The task's input from the objects of its source under ``root`` (the ingest dates given,
    or all), restricted to labelled sequences for a labelled task and to ``task.max_sequences``
    of them when set.

    The partitions are read lazily (parsers.storage.scan_objects): only the sequence ids (and
    the labels, and a next_item task's items) are collected here, so memory follows what is
    trained on, not what was ingested. The ``max_sequences`` sample is the sequences with the
    smallest hash of their id: the same sequences are kept from one night to the next while they
    are in the window (polars' seeded hash: stable within a polars version)."""
    scan = storage.scan_objects(root, task.source, ingest_date)
    groups = groups_of(scan, task.grouping_key) if task.grouping_key else None
    given = groups_of(scan, task.split_key) if task.split_key else None
    if task.table_source:  # a table task: each text joined to its table (training.tasks.table_task)
        scan = join_tables(scan, root, task.table_source, task.table_key)
    ids = scan.select("sequence_id").unique(maintain_order=True).collect()["sequence_id"]
    if ids.len() == 0:
        dates = "any ingest date" if ingest_date is None else f"ingest dates {ingest_date}"
        raise FileNotFoundError(f"task {task.name}: no ingested objects of source {task.source!r} under {root} for "
                                f"{dates}; ingest some first (seqenc ingest ... --source {task.source})")
    n_ids = ids.len()
    labels, label_report = storage.unique_labels(root, task.source)
    if task.labelled:
        if labels.height == 0:
            raise FileNotFoundError(f"task {task.name} ({task.kind}) needs labels, and source {task.source!r} has none "
                                    f"under {root}; ingest them with --labels, or declare kind = \"anomaly\" to "
                                    "train without labels")
        matched = ids.filter(ids.is_in(labels["sequence_id"].implode()))
        if matched.len() == 0:
            raise ValueError(f"task {task.name}: the labels' ids match no ingested sequence of source {task.source!r} "
                             f"(labels e.g. {labels['sequence_id'].head(3).to_list()}, sequences e.g. "
                             f"{ids.head(3).to_list()}); check label_id_column and the source's session field")
        ids = matched
    unmatched = labels.height - labels.filter(pl.col("sequence_id").is_in(ids.implode())).height
    if unmatched:
        log.warning("task %s: %d of %d labels name no ingested sequence of source %r (e.g. %s); they are not used",
                    task.name, unmatched, labels.height, task.source,
                    labels.filter(~pl.col("sequence_id").is_in(ids.implode()))["sequence_id"].head(3).to_list())
    label_report = {"labels_unmatched": unmatched, "label_conflicts": label_report["conflicts"]}
    if task.max_sequences is not None and ids.len() > task.max_sequences:
        kept = stable_sample(ids, task.max_sequences)
        log.info("task %s: %d of %d sequences kept (max_sequences)", task.name, kept.len(), ids.len())
        ids = ids.filter(ids.is_in(kept.implode()))
    # only the sequences kept (a no-op filter over every id would cost a set of all of them)
    objects = scan.filter(pl.col("sequence_id").is_in(ids.implode())) if ids.len() < n_ids else scan
    present = labels.filter(pl.col("sequence_id").is_in(ids.implode()))
    classes = next_item_classes(task, objects, present) if task.kind_spec.ranks_items else \
        task.ordered_classes(present["label"].cast(pl.String).to_list())
    return TaskInput(objects, ids, present, classes, groups, given, label_report)


def task_sequences(task: TaskSpec, root: str | Path, ingest_date=None) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
    """(objects, labels, classes) of :func:`task_input`, the objects collected in memory."""
    inp = task_input(task, root, ingest_date)
    return inp.objects.collect(), inp.labels, inp.classes


def next_item_classes(task: Task, objects: pl.DataFrame | pl.LazyFrame, labels: pl.DataFrame) -> list[str]:
    """A next_item task's classes: the catalogue, every item seen as a value of ``item_key`` or
    as a label, sorted (choice: the data defines the catalogue, so a user's item ids need no
    list; an item first seen tomorrow joins the catalogue of tomorrow's model)."""
    seen = objects.lazy().filter(pl.col("key") == task.item_key).select(pl.col("value").cast(pl.String)).unique() \
        .collect()["value"]
    if seen.len() == 0:
        raise ValueError(f"item_key {task.item_key!r} occurs in no object of source {task.source!r}; name the key "
                         "whose values are the items (seqenc profile lists the keys)")
    return sorted(set(seen.to_list()) | set(labels["label"].cast(pl.String).to_list()))


def label_vector(sequence_ids: list[str], labels: pl.DataFrame, classes: list[str], task: Task) -> np.ndarray:
    """Class index per sequence (module docstring). An anomaly task: 1 for its ``positive``
    label, 0 for any other label, -1 without a label (or without a declared ``positive``:
    nothing to evaluate against)."""
    lookup = dict(zip(labels["sequence_id"].to_list(), labels["label"].cast(pl.String).to_list()))
    if task.kind == "anomaly":
        if not task.positive:
            return np.full(len(sequence_ids), UNLABELLED, dtype=np.int64)
        return np.array([UNLABELLED if s not in lookup else int(lookup[s] == task.positive) for s in sequence_ids],
                        dtype=np.int64)
    index = {name: i for i, name in enumerate(classes)}
    missing = [s for s in sequence_ids if s not in lookup]
    if missing:
        raise ValueError(f"{len(missing)} sequences have no label, e.g. {missing[:3]}")
    return np.array([index[lookup[s]] for s in sequence_ids], dtype=np.int64)


SPLIT_NAMES = ("train", "dev", "test")
MIN_SPLIT_SEQUENCES = 3  # one each for train, dev and test


def assign_splits(sequence_ids: list[str], y: np.ndarray, split: str, seed: int, task: Task,
                  objects: pl.DataFrame | pl.LazyFrame | None = None, groups: pl.DataFrame | None = None,
                  given: pl.DataFrame | None = None) -> list[str]:
    """``"train" | "dev" | "test"`` per sequence: ``stratified`` (by label, seeded; next_item
    and unlabelled sequences form one stratum each), ``fixed`` (by a hash of the id,
    training.tasks.data.fixed_split: the same sequence lands in the same split whatever the data
    window) or ``time`` (by each sequence's first timestamp, TIME_SPLIT; ``objects`` needed, in
    memory or lazy) or ``grouped`` (``groups``, training.tasks.table_task.groups_of: whole groups,
    shuffled with the seed, fill test, then dev, then train, to about 20 / 20 / 60 % of the
    sequences; a sequence without a group is a group of its own).

    ``given`` (``sequence_id, group``: the task's split_key values): a sequence with one keeps
    that split; when any is given, the others' test share goes to train -- the test set is the
    given one (an official test split), and no sequence is tested twice."""
    if len(sequence_ids) < MIN_SPLIT_SEQUENCES:  # before scikit-learn's split says it in its own words
        raise ValueError(
            f"source {task.source!r} holds {len(sequence_ids)} sequence(s) for this task: too few to split into "
            f"train, dev and test (at least {MIN_SPLIT_SEQUENCES}; a model learns from hundreds). Cut the data into "
            "more sequences (logs: a shorter `window` in the source's catalogue entry; events: a finer session "
            "field) or ingest more; `seqenc profile` counts them")
    out = _assign_splits(sequence_ids, y, split, seed, task, objects, groups)
    if given is None or given.height == 0:
        return out
    bad = given.filter(~pl.col("group").is_in(SPLIT_NAMES))
    if bad.height:
        raise ValueError(f"split_key {task.split_key!r} holds {bad['group'][0]!r} (sequence {bad['sequence_id'][0]}): "
                         f"its values must be one of {', '.join(SPLIT_NAMES)}")
    fixed = dict(zip(given["sequence_id"].to_list(), given["group"].to_list()))
    return [fixed.get(s, "train" if where == "test" else where) for s, where in zip(sequence_ids, out)]


def _assign_splits(sequence_ids: list[str], y: np.ndarray, split: str, seed: int, task: Task,
                   objects: pl.DataFrame | pl.LazyFrame | None = None, groups: pl.DataFrame | None = None) -> list[str]:
    if split == "fixed":  # by the group when the task has one (a table task: by table), else by the id
        if groups is not None:
            group_of = dict(zip(groups["sequence_id"].to_list(), groups["group"].to_list()))
            return fixed_split([group_of.get(s, s) for s in sequence_ids])
        return fixed_split(sequence_ids)
    if split == "grouped":
        if groups is None:
            raise ValueError(f"split = \"grouped\" needs a grouping key: declare group_key (or table_source) for "
                             f"the task of source {task.source!r}")
        return grouped_split(sequence_ids, groups, seed)
    if split == "time":
        first = (objects.lazy().group_by("sequence_id").agg(pl.col("ts").min().alias("t"), pl.col("step").min().alias("s"))
                 .filter(pl.col("sequence_id").is_in(sequence_ids)).collect())
        if first["t"].null_count() == first.height:
            raise ValueError(f"split = \"time\" needs timestamps, and no object of source {task.source!r} has one; "
                             "use split = \"fixed\" or \"stratified\"")
        order = first.sort(["t", "s", "sequence_id"], nulls_last=True)["sequence_id"].to_list()
        n = len(order)
        cut_train, cut_dev = int(round(TIME_SPLIT[0] * n)), int(round((TIME_SPLIT[0] + TIME_SPLIT[1]) * n))
        where = {s: "train" if i < cut_train else "dev" if i < cut_dev else "test" for i, s in enumerate(order)}
        return [where[s] for s in sequence_ids]
    strata = y if task.kind_spec.stratified else np.zeros_like(y)
    values, counts = np.unique(strata, return_counts=True)
    if counts.min() < 3:  # a class too small to put one of each in train, dev and test
        log.warning("classes %s have fewer than 3 sequences: split without stratification",
                    values[counts < 3].tolist())
        strata = np.zeros_like(strata)
    out = np.empty(len(y), dtype=object)
    for name, idx in split_indices(strata, seed).items():
        out[idx] = name
    return out.tolist()


def vocab_sample(train_ids: list[str] | pl.Series, limit: int | None = None) -> list[str]:
    """The train sequences whose keys and values the WordPiece vocabulary is learnt from: all of
    them up to ``limit``, else the ``limit`` with the smallest hash of their id (a stable sample).
    Choice: the trainer's word counts grow with the distinct words it is fed (a week of HDFS
    blocks: past 6 GB and rising), while a 4,096-piece vocabulary is settled by a sample; the
    numeric bins still see every train value (seqenc.numeric.BinFitter)."""
    limit = VOCAB_SEQUENCES if limit is None else limit
    ids = train_ids if isinstance(train_ids, pl.Series) else pl.Series(train_ids, dtype=pl.String)
    if ids.len() <= limit:
        return ids.to_list()
    return stable_sample(ids, limit).to_list()


def fit_tokenizer(train_rows: Callable[[], Iterable[pl.DataFrame]], model_cfg: dict,
                  pretrained: str | None = None,
                  vocab_rows: Callable[[], Iterable[pl.DataFrame]] | None = None) -> ValueTokenizer:
    """A WordPiece vocabulary from the train sequences' keys and values (or the pre-trained
    checkpoint's) with numeric bins fitted on the train values (seqenc.numeric), and the markers
    the model config turns on. ``train_rows()`` yields the train rows of the value sequences
    (``key``, ``values``) a batch at a time, in sequence order, and is called once per pass (the
    keys, then the values, then the bins), so a week need not be in memory at once: the texts
    reach the trainer in the order of one frame's ``keys + values.explode()``. ``vocab_rows``
    (default ``train_rows``): the rows the vocabulary is learnt from (:func:`vocab_sample`)."""
    vocab_rows = vocab_rows or train_rows

    def texts():  # batches of texts (the trainer takes lists: no Python step per text)
        for rows in vocab_rows():
            yield rows["key"].to_list()
        for rows in vocab_rows():
            values = rows["values"].explode().drop_nulls()
            for start in range(0, values.len(), TEXT_BATCH):
                yield values.slice(start, TEXT_BATCH).to_list()

    tok = (ValueTokenizer.from_bert(pretrained) if pretrained
           else ValueTokenizer.train(texts(), vocab_size=model_cfg["vocab_size"]))
    defaults = TVMKAConfig()  # bins and how a long S(k) is handled follow the model config
    n_bins = model_cfg.get("numeric_bins", defaults.numeric_bins)
    if n_bins:
        fitter = BinFitter(n_bins, gap_cuts=model_cfg.get("numeric_gap_cuts", defaults.numeric_gap_cuts))
        for rows in train_rows():
            fitter.add(rows["key"].to_list(), rows["values"].to_list())
        tok.with_numeric_bins(fitter.bins())
        log.info("numeric bins for %d key(s): %s", len(tok.numeric.edges), sorted(tok.numeric.edges))
    if model_cfg.get("value_links", defaults.value_links):
        tok.with_value_links()
    if model_cfg.get("value_repeats", defaults.value_repeats):
        tok.with_value_repeats()
    if model_cfg.get("value_end", defaults.value_end):
        tok.with_value_end()
    return tok


def windows_of(value_seqs: pl.DataFrame, tok: ValueTokenizer, model_cfg: dict) -> TokenizedSequences:
    """Every S(k) of ``value_seqs`` tokenised into windows as the model config says."""
    defaults = TVMKAConfig()
    return tokenize_value_sequences(value_seqs, tok, model_cfg["max_positions"],
                                    model_cfg.get("long_sequences", defaults.long_sequences),
                                    model_cfg.get("max_windows", defaults.max_windows))


def grouped_split(sequence_ids: list[str], groups: pl.DataFrame, seed: int, dev: float = 0.2,
                  test: float = 0.2) -> list[str]:
    """``"train" | "dev" | "test"`` per sequence, whole groups at a time (:func:`assign_splits`)."""
    group_of = dict(zip(groups["sequence_id"].to_list(), groups["group"].to_list()))
    members: dict[str, int] = {}
    for s in sequence_ids:
        g = group_of.get(s, s)
        members[g] = members.get(g, 0) + 1
    names = sorted(members)
    order = np.random.default_rng(seed).permutation(len(names))
    where, filled, n = {}, 0, len(sequence_ids)
    for i in order:
        g = names[i]
        where[g] = "test" if filled < test * n else "dev" if filled < (test + dev) * n else "train"
        filled += members[g]
    return [where[group_of.get(s, s)] for s in sequence_ids]


def vocab_and_windows(value_seqs: pl.DataFrame, train_ids: pl.Series, model_cfg: dict,
                      pretrained: str | None = None) -> tuple[ValueTokenizer, TokenizedSequences]:
    """:func:`fit_tokenizer` on the train sequences of an in-memory ``value_seqs`` and
    :func:`windows_of` every sequence (training.tasks.sequence_build does the same a bucket at a time)."""
    train_rows = value_seqs.join(pl.DataFrame({"sequence_id": train_ids}), on="sequence_id", how="semi")
    vocab = vocab_sample(train_ids.to_list())
    vocab_rows = train_rows if len(vocab) == train_ids.len() else \
        train_rows.filter(pl.col("sequence_id").is_in(pl.Series(vocab, dtype=pl.String).implode()))
    tok = fit_tokenizer(lambda: [train_rows], model_cfg, pretrained, lambda: [vocab_rows])
    return tok, windows_of(value_seqs, tok, model_cfg)


def value_sequences(objects: pl.DataFrame, task: Task) -> pl.DataFrame:
    """S(k) of every sequence of the task's objects (its keys, event key and exclusions)."""
    return collect_value_sequences(task_objects(objects, task), tuple(task.exclude_keys))


def item_history_frame(value_seqs: pl.DataFrame, sequence_ids: list[str], task: Task,
                       classes: list[str]) -> pl.DataFrame:
    """The rows of ``item_history.parquet`` of a next_item task: the item-history features of
    every sequence (seqenc.sequences.item_histories; one row per sequence and item it holds)."""
    histories = item_histories(value_seqs, sequence_ids, task.item_key, classes)
    rows = [(s, i, *f) for s, h in zip(sequence_ids, histories) for i, f in h.items()]
    schema = {"sequence_id": pl.String, "item": pl.Int32} | {name: pl.Float32 for name in HISTORY_FEATURES}
    return pl.DataFrame(rows, schema=schema, orient="row")


def read_item_history(seq_dir: Path, sequence_ids: list[str]) -> list[dict[int, tuple[float, ...]]]:
    """What :func:`write_item_history` saved, in the order of ``sequence_ids``."""
    path = Path(seq_dir) / "item_history.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{seq_dir} holds no item_history.parquet: rebuild the task's sequences "
                                "(the model reads the item history)")
    out: dict[str, dict[int, tuple[float, ...]]] = {s: {} for s in sequence_ids}
    frame = pl.read_parquet(path)
    if frame.columns[2:] != list(HISTORY_FEATURES):
        raise ValueError(f"{path} holds the features {frame.columns[2:]}, this version reads {list(HISTORY_FEATURES)}: "
                         "rebuild the task's sequences")
    for s, i, *features in frame.iter_rows():
        if s in out:
            out[s][i] = tuple(features)
    return [out[s] for s in sequence_ids]


def write_task(seq_dir: Path, task: TaskSpec, classes: list[str]) -> None:
    """``task.json``: the task as declared when its sequences were built, with its classes, so
    that training, scoring and a resumed job read the same task whatever the catalogue says later."""
    (seq_dir / "task.json").write_text(json.dumps({"name": task.name, "task": task.task.model_dump(),
                                                   "classes": classes}, indent=2))
    (seq_dir / "classes.json").write_text(json.dumps(classes))


def read_task(seq_dir: str | Path) -> tuple[TaskSpec, list[str]]:
    """(task, classes) that :func:`write_task` saved."""
    path = Path(seq_dir) / "task.json"
    if not path.is_file():
        raise FileNotFoundError(f"{seq_dir} holds no task.json: build the task's sequences first "
                                "(seqenc train does, or training.pipeline.stages.stage_sequences)")
    saved = json.loads(path.read_text())
    return TaskSpec(saved["name"], Task.model_validate(saved["task"])), list(saved["classes"])


def read_classes(seq_dir: str | Path) -> list[str]:
    """The classes the sequences stage wrote (``classes.json``)."""
    return json.loads((Path(seq_dir) / "classes.json").read_text())


def read_task_objects(root: str | Path, task: Task, ingest_date=None) -> pl.DataFrame:
    """The objects of a task's sequences as training reads them (the ingest dates given, or
    all): a table task's texts joined to their tables (training.tasks.table_task)."""
    return example_objects(root, task.source, ingest_date, task.table_source, task.table_key).collect()


def sequence_objects(seq_dir: str | Path, data_root: str | Path, task: Task) -> pl.DataFrame:
    """The objects the sequences stage read for ``seq_dir`` (the same ingest dates, from
    ``input.json``), which the end-to-end modes tokenise themselves: a nightly window's model sees
    that window's objects only, even where a sequence id recurs on other dates."""
    path = Path(seq_dir) / "input.json"
    dates = json.loads(path.read_text())["ingest_dates"] if path.is_file() else None
    return read_task_objects(data_root, task, dates)
