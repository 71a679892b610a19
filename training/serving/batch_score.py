"""Batch scoring of ingest partitions (``seqenc score`` and the ``seqenc_batch_score`` DAG).

:func:`score_partitions` scores every sequence of one ingest date (or of each date found) with one
model of any training mode -- a bundle directory or a registry URI such as
``models:/seqenc-anomaly@champion`` (training.serving.registry) -- and writes::

    <out>/date=<YYYY-MM-DD>/part-0.parquet
        sequence_id, score, label, prob_<class>..., model_name, model_version, model_uri

``score`` is P(positive class) for a binary task and the winning class's probability otherwise;
``label`` is the predicted class (binary: the bundle's threshold). A next_item model writes
``top_items`` / ``top_scores`` (its 10 best items, best first) instead of a column per item,
and its label counts cover the 20 most predicted items. The part is written
atomically and replaces the date's earlier output, so re-scoring a day leaves the same rows.

With a tracking store (``tracking_dir``, or MLFLOW_TRACKING_URI) each scored date is one MLflow
run in the experiment ``seqenc-scoring`` (tags ``interval`` and ``model_name``): params (model
URI and version, date, source), metrics (``sequences``, ``label_count/<class>``,
``label_share/<class>``, ``score_mean`` and ``score_p50/p90/p99``; a binary or anomaly model's
``flagged``, ``flagged_share``, ``threshold``, and an anomaly model's ``reference_percentile``;
``read_in_training`` and its share when the bundle keeps its training ids: how many of the day's
sequences the model trained on, scored in-sample, with a warning) and a histogram of the
scores as an artifact. Choice: re-scoring a date deletes the earlier run of the same model name
and date, so the experiment holds one run per scored day, as the Parquet output does.

``device`` places the model (training.engine.engines.training_device): ``auto`` (the default) scores on
the first CUDA device when there is one, else on the CPU; every batch follows the model. A day is
scored about ``chunk_sequences`` sequences at a time (:func:`score_in_chunks`: the day's rows
bucketed by sequence in one streaming pass), so memory does not grow with the day's size.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
from tqdm.auto import tqdm

from parsers import objectstore, storage
from training.serving import tracking
from training.serving.registry import is_model_uri, resolve_model
from training.serving.scoring import (
    DRIFT_PERCENTILE,
    load_bundle,
    read_in_training,
    reference_percentile,
    score_objects,
    trained_id_hashes,
    window_threshold,
)
from training.tasks.buckets import sequence_chunks
from training.tasks.kinds import get_kind
from training.tasks.table_task import example_objects

log = logging.getLogger(__name__)

SCORING_EXPERIMENT = "seqenc-scoring"
# sequences scored per chunk: memory follows it (2,000 HDFS blocks, d256 4-layer model: a 2.2 GB
# peak for the whole scoring process, torch included: seqenc bench score on 10,000 blocks); a
# chunk that size already fills the TVM's length-sorted batches. Chosen, not tuned.
CHUNK_SEQUENCES = 2000


def _source_of(meta: dict, source: str | None) -> str:
    if source:
        return source
    if meta.get("source"):
        return meta["source"]
    raise ValueError("the model's metadata names no source (a bundle older than its metadata's source field); "
                     "give --source")


def score_partitions(model: str, data_root: str | Path, out_dir: str | Path, source: str | None = None,
                     dates: list[str] | None = None, tracking_dir: str | Path | None = None,
                     progress: bool = True, device: str = "auto", chunk_sequences: int = CHUNK_SEQUENCES) -> dict:
    """Score the objects of ``source`` for each date of ``dates`` (default: every ingest date
    under ``data_root``) into ``out_dir/date=<d>/part-0.parquet``; see the module docstring.

    A registry URI is resolved against ``tracking_dir``'s store (or MLFLOW_TRACKING_URI);
    runs are logged when either is given."""
    track = tracking_dir is not None or tracking._USER_URI is not None
    if is_model_uri(str(model)):
        if not track:
            raise ValueError(f"{model} is a registry URI: give the tracking store (--tracking-dir WORKDIR, or set "
                             "MLFLOW_TRACKING_URI)")
    if track:
        tracking.use_store(tracking_dir or out_dir)
    with tempfile.TemporaryDirectory(prefix="seqenc-score-") as tmp:
        resolved = resolve_model(model, tmp)
        directory = os.path.realpath(resolved.bundle)  # one version for the model and its training ids
        bundle = load_bundle(directory, device)  # any training mode's model (training.serving.scoring)
        trained = trained_id_hashes(directory)  # None for a bundle saved without them
        source = _source_of(bundle.meta, source)
        dates = [storage.ingest_date_str(d) for d in dates] if dates else storage.ingest_dates(data_root, source)
        if not dates:
            raise FileNotFoundError(f"no ingested objects of source {source!r} under {data_root}")
        results = []
        for day in dates:
            objects = example_objects(data_root, source, day, bundle.meta.get("table_source"),
                                      bundle.meta.get("table_key") or "table")  # a table task: texts + tables
            predictions, flags = _flag_window(bundle, _predictions(bundle, objects, resolved, progress,
                                                                   chunk_sequences))
            if predictions.is_empty():
                log.warning("%s: no objects of source %s on %s", data_root, source, day)
            flags |= _training_overlap(trained, predictions)
            for warning in ("drift_warning", "in_sample_warning"):
                if warning in flags:
                    log.warning("scored %s %s: %s", source, day, flags[warning])
            path = objectstore.as_path(out_dir) / f"date={day}" / "part-0.parquet"  # s3:// too
            storage.write_parquet_atomic(predictions, path)
            summary = summarize(predictions, _reported_labels(bundle.model.config, predictions)) | flags
            summary.update(date=day, source=source, predictions=str(path), model_uri=resolved.uri,
                           model_name=resolved.name, model_version=resolved.version)
            if track:
                summary["mlflow_run_id"] = _log_run(summary, predictions, tracking_dir or out_dir)
            log.info("scored %s %s: %d sequences -> %s", source, day, predictions.height, path)
            results.append(summary)
    return {"model_uri": str(model), "model_name": resolved.name, "model_version": resolved.version,
            "source": source, "dates": results}


REPORTED_ITEMS = 20  # next_item: the most predicted items get a count and share each


def _reported_labels(config, predictions: pl.DataFrame) -> list[str]:
    """Labels whose counts a scored day reports: every class, or for next_item (a catalogue of
    maybe thousands) the REPORTED_ITEMS most often predicted next items."""
    if not get_kind(config.task).ranks_items:
        return [str(c) for c in config.class_names or []]
    if predictions.is_empty():
        return []
    counts = predictions.group_by("label").len().sort(["len", "label"], descending=[True, False])
    return counts["label"].head(REPORTED_ITEMS).to_list()


def score_in_chunks(bundle, objects: pl.LazyFrame, chunk_sequences: int = CHUNK_SEQUENCES,
                    progress: bool = True, spill_dir: str | Path | None = None) -> pl.DataFrame | None:
    """Score the sequences of a lazy objects frame about ``chunk_sequences`` at a time, so memory
    follows the chunk, not the partition. Rows sorted by ``sequence_id``; None when there are no
    objects.

    One pass over the partition spills its rows into buckets of whole sequences (Parquet in a
    temporary folder under ``spill_dir``, default the system's; training.tasks.buckets.sequence_chunks);
    each chunk is then read, scored (training.serving.scoring.score_objects) and dropped. A sequence's score does not depend on the others in its chunk, so the rows
    equal one call over all sequences, up to float rounding in differently padded batches:
    ``seqenc bench score`` compares every score with small chunks."""
    if chunk_sequences < 1:
        raise ValueError(f"chunk_sequences must be >= 1, got {chunk_sequences}")
    ids = objects.select("sequence_id").unique().collect()["sequence_id"].sort()
    if not ids.len():
        return None
    frames = []
    with tempfile.TemporaryDirectory(prefix="seqenc-chunks-", dir=spill_dir) as tmp:
        for chunk in tqdm(sequence_chunks(objects, ids, chunk_sequences, tmp), total=-(-ids.len() // chunk_sequences),
                          desc=f"scoring {ids.len()} sequences", unit="chunk", disable=not progress):
            frames.append(score_objects(bundle, chunk, progress=False))
    return pl.concat(frames).sort("sequence_id")


def _predictions(bundle, objects: pl.LazyFrame, resolved, progress: bool,
                 chunk_sequences: int = CHUNK_SEQUENCES) -> pl.DataFrame:
    frame = score_in_chunks(bundle, objects, chunk_sequences, progress)
    if frame is None:
        config = bundle.model.config
        frame = pl.DataFrame({"sequence_id": [], "score": [], "prediction": []},
                             schema={"sequence_id": pl.String, "score": pl.Float64, "prediction": pl.String})
        if get_kind(config.task).ranks_items:
            frame = frame.with_columns(pl.lit(None, pl.List(pl.String)).alias("top_items"),
                                       pl.lit(None, pl.List(pl.Float64)).alias("top_scores"))
        else:
            frame = frame.with_columns([pl.lit(None, pl.Float64).alias(f"prob_{c}") for c in config.class_names or []])
    frame = frame.rename({"prediction": "label"}).sort("sequence_id")
    return frame.with_columns(pl.lit(resolved.name, pl.String).alias("model_name"),
                              pl.lit(resolved.version, pl.String).alias("model_version"),
                              pl.lit(resolved.uri, pl.String).alias("model_uri"))


def _flag_window(bundle, predictions: pl.DataFrame) -> tuple[pl.DataFrame, dict]:
    """A binary or anomaly bundle's flags of one scored day and how they were set
    (training.serving.scoring.window_threshold): an anomaly task's labels are set again from the day's own
    scores (scoring is chunked, so only here is the whole day at hand); every scoring run reports
    ``flagged``, ``flagged_share``, ``threshold`` and ``threshold_rule``. Other tasks: unchanged, {}."""
    config = bundle.model.config
    if config.task != "binary":
        return predictions, {}
    threshold, why = window_threshold(bundle.meta, predictions["score"].to_numpy())
    negative, positive = (config.class_names or [str(i) for i in range(config.n_classes)])[:2]
    if bundle.meta.get("window_rule") is not None and predictions.height:  # an anomaly task
        predictions = predictions.with_columns(label=pl.when(pl.col("score") >= threshold).then(pl.lit(positive))
                                               .otherwise(pl.lit(negative)))
    flagged = int((predictions["label"] == positive).sum())
    report = {"flagged": flagged, "flagged_share": flagged / predictions.height if predictions.height else 0.0,
              "threshold": threshold, "threshold_rule": why}
    percentile = reference_percentile(bundle.meta, predictions["score"].to_numpy())
    if percentile is not None:  # an anomaly bundle: how far the day's scores sit from the training reference's
        report["reference_percentile"] = percentile
        if percentile >= DRIFT_PERCENTILE:
            report["drift_warning"] = (
                f"the day's median score sits at the training reference's {percentile:.0f}th percentile (about "
                "the 50th for data like the training's): its values may have drifted, so what is flagged may be "
                "the drift rather than single sequences; retrain on recent days, or give the task a "
                "contamination share")
    return predictions, report


def _training_overlap(trained: np.ndarray | None, predictions: pl.DataFrame) -> dict:
    """``read_in_training`` (how many of the day's sequences were in the model's training split,
    training.serving.scoring.read_in_training) and its share, with a warning when any were: their
    scores are in-sample. {} for a bundle saved without its training ids (``trained`` None)."""
    if trained is None:
        return {}
    count = read_in_training(trained, predictions["sequence_id"].to_list())
    report = {"read_in_training": count,
              "read_in_training_share": count / predictions.height if predictions.height else 0.0}
    if count:
        report["in_sample_warning"] = (
            f"{count} of {predictions.height} sequences were in the model's training split: their scores are "
            "in-sample (an anomaly the model trained on looks less surprising than a new one; a labelled "
            "sequence was fitted), so judge the model on days after its training data")
    return report


def summarize(predictions: pl.DataFrame, class_names: list[str]) -> dict:
    """Counts per predicted label and the score distribution of one scored date."""
    n = predictions.height
    counts = dict(predictions.group_by("label").len().iter_rows()) if n else {}
    scores = predictions["score"].to_numpy() if n else np.zeros(0)
    out = {"sequences": n, "label_count": {c: int(counts.get(c, 0)) for c in class_names}}
    out["label_share"] = {c: (out["label_count"][c] / n if n else 0.0) for c in class_names}
    if n:
        out.update(score_mean=float(scores.mean()), score_p50=float(np.quantile(scores, 0.5)),
                   score_p90=float(np.quantile(scores, 0.9)), score_p99=float(np.quantile(scores, 0.99)))
    return out


def _log_run(summary: dict, predictions: pl.DataFrame, store_dir) -> str:
    import mlflow

    from training.tasks.metrics import plot_score_histogram

    experiment = tracking.experiment_id(store_dir, SCORING_EXPERIMENT)
    client = mlflow.MlflowClient()
    name = summary["model_name"] or Path(summary["model_uri"]).name
    previous = client.search_runs([experiment], f"tags.interval = '{summary['date']}' and "
                                                f"tags.model_name = '{name}' and tags.source = '{summary['source']}'")
    for run in previous:  # re-scoring a date replaces its run
        client.delete_run(run.info.run_id)
    with mlflow.start_run(experiment_id=experiment, run_name=f"score-{name}-{summary['date']}") as run:
        mlflow.set_tags({"interval": summary["date"], "model_name": name, "source": summary["source"],
                         "git_commit": tracking.git_commit()})
        mlflow.log_params({"model_uri": summary["model_uri"], "model_version": summary["model_version"],
                           "date": summary["date"], "source": summary["source"]})
        metrics = {k: summary[k] for k in ("sequences", "score_mean", "score_p50", "score_p90", "score_p99", "flagged",
                                           "flagged_share", "threshold", "reference_percentile",
                                           "read_in_training", "read_in_training_share") if k in summary}
        metrics.update({f"label_count/{c}": v for c, v in summary["label_count"].items()})
        metrics.update({f"label_share/{c}": v for c, v in summary["label_share"].items()})
        mlflow.log_metrics({tracking.mlflow_key(k): float(v) for k, v in metrics.items()})
        with tempfile.TemporaryDirectory() as tmp:
            plot_score_histogram(predictions["score"].to_numpy(), predictions["label"].to_list(),
                                 Path(tmp) / "score_histogram.png",
                                 f"{name} v{summary['model_version']} on {summary['date']}: scores")
            (Path(tmp) / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
            mlflow.log_artifacts(tmp, "scoring")
        return run.info.run_id
