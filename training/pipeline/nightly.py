"""Nightly training with champion promotion (the ``seqenc_nightly_training`` DAG's logic).

One night, one task:

1. :func:`nightly_train` -- value sequences from the ingest partitions of the last ``window_days``
   days up to the night's date, split by a hash of the sequence id (training.tasks.data.fixed_split:
   a sequence is in the same split every night, so no night's model has trained on another
   night's dev or test sequences), then one training job (interleaved by default), logged to
   the shared MLflow store and registered as a new version of ``seqenc-<task>``. Work files go
   to ``<workdir>/nightly/<task>/<date>/``, replaced when the night is run again.
2. :func:`promote_if_better` -- the new version and the current ``champion`` are scored by the
   same code (training.serving.scoring.score_objects, whatever mode trained either of them: each model
   reads its own kind of input) on the *same* dev sequences, tonight's; the alias
   moves to the new version only when it beats the champion by more than ``min_delta``.
   Otherwise nothing moves and the reason is recorded: tags ``promotion`` and
   ``promotion_reason`` on the model version and on its training run, metrics
   ``promotion/dev_<metric>_new`` and ``promotion/dev_<metric>_champion`` on the run, and
   ``promotion.json`` in the night's folder.

The promotion metric (choice): binary tasks use the dev *average precision* of P(anomaly). It
needs no threshold; a dev F1 would flatter the new model, whose threshold was fitted on these
very dev sequences, while the champion's came from another night. C-way tasks use dev macro
F1 of the arg-max class (no threshold either). next_item uses dev recall@10, read from each
model's ranked ``top_items``: two nights' catalogues may differ (the catalogue comes from the
data), and item names compare across them where output columns would not.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path

import mlflow
import numpy as np
import polars as pl
from sklearn.metrics import average_precision_score, f1_score

from parsers import objectstore, storage
from training.pipeline.stages import sequences_dir, stage_sequences, stage_train
from training.serving import tracking
from training.serving.registry import CHAMPION, NoChampionError, resolve_model
from training.serving.scoring import Bundle, load_bundle, score_objects
from training.tasks.catalog import Task
from training.tasks.metrics import ranking_metrics_of_lists
from training.tasks.spec import TaskSpec
from training.tasks.task_data import read_task, read_task_objects

log = logging.getLogger(__name__)



class SourceNeverIngested(FileNotFoundError):
    """The task's source has no ingest partition at all (the deployment does not feed it; the
    DAG skips the task), as opposed to none in the night's window (a late ingest: an error)."""


def window_dates(end_date: str, window_days: int) -> list[str]:
    """The ``window_days`` days ending with ``end_date`` (inclusive), oldest first."""
    if window_days < 1:
        raise ValueError(f"window_days must be >= 1, got {window_days}")
    end = dt.date.fromisoformat(storage.ingest_date_str(end_date))
    return [(end - dt.timedelta(days=i)).isoformat() for i in range(window_days - 1, -1, -1)]


def night_dir(workdir: str | Path, task_name: str, date: str) -> Path:
    return Path(workdir) / "nightly" / task_name / date


def nightly_train(workdir: str, task: TaskSpec, date: str, window_days: int = 7, size: str | None = None,
                  seed: int = 0, mode: str | None = None, config: dict | None = None, progress: bool = False,
                  data_root: str | None = None) -> dict:
    """Train tonight's model of ``task`` (resolved by the caller, training.tasks.spec) on the data
    of the window ending at ``date``.

    ``workdir`` holds the data root (``data/``, unless ``data_root`` names another: a folder or
    ``s3://bucket/prefix``) and, unless MLFLOW_TRACKING_URI is set, the MLflow store; ``config`` is ``{"model": {...}, "train": {...}}`` overrides on top of the
    task's. The split is fixed by sequence id (a task declared ``split = "time"`` keeps it), so
    that no night trains on another night's dev or test sequences."""
    config = config or {}
    unknown = set(config) - {"model", "train"}
    if unknown:
        raise ValueError(f"unknown training config sections {sorted(unknown)}; use 'model' and 'train'")
    root = objectstore.as_path(data_root) if data_root else Path(workdir) / "data"
    task_name, source = task.name, task.source
    ingested = storage.ingest_dates(root, source)
    if not ingested:
        raise SourceNeverIngested(f"{task_name}: no data of source {source!r} was ever ingested under {root}")
    dates = [d for d in window_dates(date, window_days) if d in ingested]
    if not dates:
        raise FileNotFoundError(f"{task_name}: no ingested data of source {source!r} under {root} in the "
                                f"{window_days} days up to {date}; run seqenc_ingest for those days first")
    night = night_dir(workdir, task_name, date)
    seqs = stage_sequences(str(night), task, size, seed, ingest_date=dates, data_root=str(root),
                           split="time" if task.split == "time" else "fixed")
    trained = stage_train(str(night), task_name, size, seed, progress=progress, mode=mode,
                          train_overrides=config.get("train"), model_overrides=config.get("model"),
                          data_root=str(root), tracking_dir=str(workdir))
    log.info("%s %s: trained version %s of %s on %s", task_name, date, trained["model_version"],
             trained["registered_model"], dates)
    return {"task_name": task_name, "date": date, "dates": dates, "night_dir": str(night), "data_root": str(root),
            "sequences": seqs["stats"], "model_dir": trained["model_dir"], "run_id": trained["run_id"],
            "registered_model": trained["registered_model"], "model_version": trained["model_version"],
            "test": trained["metrics"]["test"], "dev": trained["metrics"]["dev"]}


def promotion_score(task: str, y: np.ndarray, probs: np.ndarray) -> float:
    """The promotion metric (module docstring) of class probabilities ``probs`` [n, C]."""
    if task == "binary":
        return float(average_precision_score(y, probs[:, 1])) if y.any() else 0.0
    return float(f1_score(y, probs.argmax(axis=1), average="macro", zero_division=0))


def dev_score(bundle: Bundle, objects: pl.DataFrame, dev: pl.DataFrame, task: Task, class_names: list[str]) -> float:
    """Score ``dev``'s sequences (``sequence_id, label``) with a loaded bundle of any mode; the
    promotion metric."""
    model = bundle.model
    pred = score_objects(bundle, objects, progress=False).join(dev, on="sequence_id", how="inner")
    if task.kind_spec.ranks_items:
        return ranking_metrics_of_lists(pred["label"].to_list(), pred["top_items"].to_list())["recall_at_10"]
    if list(model.config.class_names or []) != list(class_names):
        raise ValueError(f"model classes {model.config.class_names} differ from the task's {class_names}")
    labels = pred["label"].to_list()
    y = np.array([int(v == task.positive) for v in labels] if task.kind == "anomaly"
                 else [class_names.index(v) for v in labels])
    probs = pred.select([f"prob_{c}" for c in class_names]).to_numpy()
    return promotion_score(model.config.task, y, probs)


def decide(new: float, champion: float | None, min_delta: float = 0.0) -> tuple[bool, str]:
    """(promote?, reason). Promote when there is no champion, or ``new > champion + min_delta``."""
    if champion is None:
        return True, "no champion yet"
    if new > champion + min_delta:
        return True, f"dev {new:.4f} beats champion {champion:.4f} by more than {min_delta:g}"
    return False, f"dev {new:.4f} does not beat champion {champion:.4f} by more than {min_delta:g}"


def promote_if_better(workdir: str, trained: dict, min_delta: float = 0.0) -> dict:
    """Compare ``trained`` (what :func:`nightly_train` returned) with the champion on tonight's
    dev sequences and move the alias only on improvement; see the module docstring."""
    tracking.use_store(workdir)
    client = mlflow.MlflowClient()
    task_name, name, version = trained["task_name"], trained["registered_model"], str(trained["model_version"])
    night = Path(trained["night_dir"])
    spec, classes = read_task(sequences_dir(night, task_name))
    splits = pl.read_parquet(sequences_dir(night, task_name) / "splits.parquet")
    dev = splits.filter((pl.col("split") == "dev") & pl.col("label").is_not_null()).select("sequence_id", "label")
    root = trained.get("data_root") or Path(workdir) / "data"  # the root nightly_train read
    objects = read_task_objects(objectstore.as_path(root), spec, trained["dates"])
    objects = objects.join(dev.select("sequence_id"), on="sequence_id", how="semi")
    metric = spec.kind_spec.promotion_metric  # training.tasks.kinds
    try:
        current = resolve_model(f"models:/{name}@{CHAMPION}", night / "champion")
        champion_version = current.version
    except NoChampionError:
        current, champion_version = None, None
    if dev.height == 0:  # an anomaly task without labels: nothing to compare on
        new, champion = None, None
        promoted, reason = True, "no labelled dev sequences to compare on: the newest model becomes champion"
    else:
        new = dev_score(load_bundle(trained["model_dir"]), objects, dev, spec, classes)
        champion = None if current is None else dev_score(load_bundle(current.bundle), objects, dev, spec, classes)
        promoted, reason = decide(new, champion, min_delta)
    if champion_version == version:
        promoted, reason = False, "this version is already the champion"
    reason = f"{metric}: {reason} (champion version {champion_version}, {dev.height} dev sequences)"
    if promoted:
        client.set_registered_model_alias(name, CHAMPION, version)
    state = "champion" if promoted else "rejected"
    dev_value = "none" if new is None else f"{new:.6f}"
    for key, value in (("promotion", state), ("promotion_reason", reason), (f"dev_{metric}", dev_value)):
        client.set_model_version_tag(name, version, key, value)
        client.set_tag(trained["run_id"], key, value)
    if new is not None:
        client.log_metric(trained["run_id"], f"promotion/dev_{metric}_new", new)
    if champion is not None:
        client.log_metric(trained["run_id"], f"promotion/dev_{metric}_champion", champion)
    result = {"registered_model": name, "model_version": version, "promoted": promoted, "reason": reason,
              "metric": metric, "new": new, "champion": champion, "champion_version": champion_version,
              "dev_sequences": dev.height}
    storage.write_bytes_atomic(json.dumps(result, indent=2).encode(), night / "promotion.json")
    log.info("%s version %s: %s", name, version, reason)
    return result
