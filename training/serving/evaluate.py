"""A task's metrics on any labelled data, and its count baseline on the same split.

* :func:`prediction_metrics` -- the metrics of a predictions table (``sequence_id, prediction,
  score, ...`` from training.serving.scoring.score_objects, joined with ``label``) for the task's kind:
  binary and anomaly tasks: precision, recall, F1 of the positive class at the model's
  threshold, micro / macro F1 and the average precision of the score; multiclass: micro and
  macro F1; next_item: recall@1/5/10 and MRR. Only labelled rows count.
* :func:`evaluate_task` -- ``seqenc evaluate``: score a task's sequences (a split of a work
  directory, or every labelled sequence of some ingest dates) with a model (the work
  directory's bundle, another bundle, or a registry URI) and report those metrics.
* :func:`count_baseline_metrics` -- logistic regression on count vectors of the task's values
  (its event key's values for log tasks, every key=value pair otherwise), trained on the same
  train split and scored on the same test split: the simplest model a user would try, shown
  beside TVM-KA in the demo summary.
* :func:`history_rank_metrics` -- next_item only: each sequence's own items ranked, the most
  frequent first, ties to the most recent (:func:`history_rank_scores`), no training at all: the
  simplest next-item baseline, and what a head reading the item history must beat.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
from sklearn.metrics import average_precision_score

from parsers import objectstore, storage
from parsers.names import check_name
from training.tasks.catalog import Task
from training.tasks.metrics import below_floor, constant_class, ranking_metrics, ranking_metrics_of_lists, task_metrics
from training.tasks.spec import TaskSpec, resolve_task
from training.tasks.task_data import read_task, read_task_objects, task_objects

log = logging.getLogger(__name__)

OWN_MAJORITY = "majority of the evaluated rows"  # prediction_floor's rule without the model's train split


def _labelled(predictions: pl.DataFrame, task: Task, classes: list[str]) -> tuple[pl.DataFrame, np.ndarray]:
    """The labelled rows of a predictions table and their class indices (an anomaly task: the
    positive label against the rest)."""
    rows = predictions.filter(pl.col("label").is_not_null())
    labels = rows["label"].cast(pl.String).to_list()
    if not task.kind_spec.labelled:  # labels only evaluate it: the positive label against the rest
        return rows, np.array([int(v == task.positive) for v in labels], dtype=np.int64)
    unknown = sorted(set(labels) - set(classes))
    if unknown:
        raise ValueError(f"labels {unknown[:5]} are not among the model's classes {classes}; evaluate with a model "
                         "of this task")
    return rows, np.array([classes.index(v) for v in labels], dtype=np.int64)


def prediction_metrics(predictions: pl.DataFrame, task: Task, classes: list[str]) -> dict:
    """See the module docstring; ``{"labelled": 0}`` when no row has a label."""
    rows = predictions.filter(pl.col("label").is_not_null())
    if rows.height == 0:
        return {"labelled": 0}
    if task.kind_spec.ranks_items:
        return {**ranking_metrics_of_lists(rows["label"].cast(pl.String).to_list(), rows["top_items"].to_list()),
                "labelled": rows.height}
    rows, y = _labelled(predictions, task, classes)
    pred = np.array([classes.index(v) for v in rows["prediction"].to_list()])
    kind = task.kind_spec.head  # the model's head: an anomaly task's is binary
    out = {**task_metrics(y, pred, kind), "labelled": rows.height}
    if kind == "binary" and len(set(y.tolist())) == 2:
        out["average_precision"] = float(average_precision_score(y, rows["score"].to_numpy()))
    return out


def prediction_floor(predictions: pl.DataFrame, task: Task, classes: list[str],
                     train_labels: list[str] | None = None) -> dict:
    """The floor beside :func:`prediction_metrics`, on the same labelled rows: the metrics of one
    constant prediction (training.tasks.metrics.constant_class) -- every sequence positive for a
    binary or anomaly task (``rule`` "flag-all"), else the most frequent class of ``train_labels``
    (the model's train split: "train majority") or, without them, of the evaluated rows themselves
    ("majority of the evaluated rows", a floor no lower than the train one). {} for a ranking task
    or no labelled row."""
    if task.kind_spec.ranks_items:
        return {}
    _, y = _labelled(predictions, task, classes)
    if not len(y):
        return {}
    kind = task.kind_spec.head
    if kind == "binary":
        rule, constant = "flag-all", constant_class(y, kind)
    elif train_labels:
        known = [classes.index(v) for v in train_labels if v in classes]
        rule, constant = "train majority", constant_class(np.array(known, dtype=np.int64), kind)
    else:
        rule, constant = OWN_MAJORITY, constant_class(y, kind)
    return {"rule": rule, **task_metrics(y, np.full(len(y), constant), kind)}


def task_of_workdir(workdir: str | Path, name: str, catalog=None) -> TaskSpec:
    """The task ``name`` as the work directory's last sequences build saved it (what its model was
    trained on), else as ``catalog`` declares it: how ``seqenc evaluate`` resolves its --task."""
    seq_dir = Path(workdir) / "sequences" / check_name(name, "task")
    if (seq_dir / "task.json").is_file():
        return read_task(seq_dir)[0]
    return resolve_task(catalog, name)


def evaluate_task(workdir: str | Path, task: TaskSpec, model: str | None = None,
                  split: str | None = None, dates: list[str] | None = None, tracking_dir: str | None = None,
                  progress: bool = True, data_root: str | None = None) -> dict:
    """``seqenc evaluate``: the task's metrics on the sequences of ``split`` (train / dev / test
    of the work directory's last sequences build) or, with ``dates``, on every labelled
    sequence of those ingest dates (``split`` then narrows them). ``model``: a bundle
    directory or a registry URI (default: the work directory's bundle of the task). ``task``:
    resolved by the caller (:func:`task_of_workdir`). ``data_root``: where the objects and labels
    are (default ``workdir/data``; ``s3://bucket/prefix`` too)."""
    from training.serving.registry import is_model_uri, resolve_model
    from training.serving.scoring import load_bundle, score_objects

    workdir = Path(workdir)
    root = objectstore.as_path(data_root) if data_root else workdir / "data"
    task_name = task.name
    seq_dir = workdir / "sequences" / task_name
    classes = read_task(seq_dir)[1] if (seq_dir / "task.json").is_file() else None
    labels, _ = storage.unique_labels(root, task.source)
    if labels.height == 0:
        raise FileNotFoundError(f"source {task.source!r} has no labels under {root}: nothing to evaluate "
                                "against; ingest labels with --labels")
    chosen = labels
    splits = pl.read_parquet(seq_dir / "splits.parquet") if (seq_dir / "splits.parquet").is_file() else None
    if split is not None or dates is None:
        split = split or "test"
        if splits is None:
            raise FileNotFoundError(f"{seq_dir} has no splits: train the task in this work directory first, or "
                                    "give --date to evaluate on every labelled sequence of those days")
        ids = splits.filter(pl.col("split") == split).select("sequence_id")
        chosen = chosen.join(ids, on="sequence_id", how="semi")
    objects = read_task_objects(root, task, dates)
    objects = objects.join(chosen.select("sequence_id"), on="sequence_id", how="semi")
    if objects.height == 0:
        where = " and ".join(w for w in (f"split {split}" if split else "",
                                         f"ingest dates {', '.join(dates)}" if dates else "") if w)
        raise ValueError(f"no labelled sequence of source {task.source!r} in {where}; nothing to evaluate (seqenc "
                         f"tasks --root ... lists what is ingested)")
    if model is None:
        model = str(workdir / "models" / task_name / "bundle")
    track = tracking_dir is not None or is_model_uri(str(model))
    if track:
        from training.serving import tracking

        tracking.use_store(tracking_dir or workdir)
    with tempfile.TemporaryDirectory(prefix="seqenc-evaluate-") as tmp:
        resolved = resolve_model(str(model), tmp)
        bundle = load_bundle(resolved.bundle)
        classes = list(bundle.model.config.class_names or classes or [])
        predictions = score_objects(bundle, objects, progress=progress)
    predictions = predictions.join(chosen, on="sequence_id", how="left")
    train_labels = None  # the model's train split, for a C-way task's majority floor
    if splits is not None:
        train_labels = splits.filter(pl.col("split") == "train").drop_nulls("label")["label"].cast(pl.String).to_list()
    metrics = prediction_metrics(predictions, task, classes)
    floor = prediction_floor(predictions, task, classes, train_labels)
    if floor:  # below_floor names flag-all and the train majority itself
        what = "predicting the evaluated rows' most frequent class" if floor["rule"] == OWN_MAJORITY else None
        name = split or "evaluated"
        warning = below_floor({name: metrics}, {name: floor}, task.kind_spec.head, name, what, declared=task.kind)
        if warning:
            log.warning("%s", warning)
    return {"task": task_name, "model": str(model), "split": split, "dates": dates,
            "sequences": predictions.height, "metrics": metrics, "floor": floor}


def count_baseline_metrics(workdir: str | Path, task_name: str, seed: int = 0) -> dict | None:
    """The count baseline (module docstring) on the work directory's split of a labelled task;
    None for an ``anomaly`` task (its unsupervised baseline is the bench's count_pca)."""
    from training.tasks.baselines import count_baseline, value_count_dataset
    from training.tasks.dataset import LabelledDataset

    seq_dir = Path(workdir) / "sequences" / task_name
    task, classes = read_task(seq_dir)
    if task.kind == "anomaly":
        return None
    split = pl.read_parquet(seq_dir / "splits.parquet")
    dates = json.loads((seq_dir / "input.json").read_text())["ingest_dates"]
    objects = task_objects(read_task_objects(Path(workdir) / "data", task, dates), task)
    ds = LabelledDataset(name=task_name, task=task.kind, class_names=tuple(classes),
                      objects=objects.join(split.select("sequence_id"), on="sequence_id", how="semi"),
                      labels=split.select("sequence_id", "label"), split=split.select("sequence_id", "split"),
                      event_key="event", exclude_keys=tuple(task.exclude_keys), description="count baseline of a task")
    if not task.event_key:  # every key=value pair is one countable token
        ds = value_count_dataset(ds)
    rule = {"rule": task.threshold_policy()["policy"]} if task.kind == "binary" else {}  # the task's, like for like
    result = count_baseline(ds, seed, **rule)
    return {k: v for k, v in result.items() if v is not None and k not in ("seconds", "vocab", "n_train", "n_test")}


def history_rank_scores(item_history: list[dict[int, tuple[float, ...]]], n_items: int) -> np.ndarray:
    """[n_sequences, n_items]: log(1 + count) + recency / 1000 of every item a sequence holds
    (seqenc.sequences.item_histories), 0 for the others (which then tie below them, ranked
    pessimistically by training.tasks.metrics.ranking_metrics)."""
    scores = np.zeros((len(item_history), n_items))
    for row, history in enumerate(item_history):
        for item, (log_count, recency, *_) in history.items():
            scores[row, item] = log_count + recency / 1000
    return scores


def history_rank_metrics(workdir: str | Path, task_name: str) -> dict | None:
    """:func:`history_rank_scores` on the work directory's test split of a next_item task
    (recall@1/5/10, MRR, and the dev recall@10); None for another kind of task."""
    from training.tasks.task_data import read_item_history

    seq_dir = Path(workdir) / "sequences" / task_name
    task, classes = read_task(seq_dir)
    if not task.kind_spec.ranks_items:
        return None
    split = pl.read_parquet(seq_dir / "splits.parquet").filter(pl.col("label").is_not_null())
    index = {c: i for i, c in enumerate(classes)}
    out = {}
    for name in ("dev", "test"):
        rows = split.filter(pl.col("split") == name)
        scores = history_rank_scores(read_item_history(seq_dir, rows["sequence_id"].to_list()), len(classes))
        y = np.array([index[c] for c in rows["label"].to_list()], dtype=np.int64)
        out[name] = ranking_metrics(y, scores) if len(y) else {}
    return {**out["test"], "dev_recall_at_10": out["dev"].get("recall_at_10")}
