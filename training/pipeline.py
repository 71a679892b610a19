"""The main job, stage by stage: generate -> ingest -> value sequences -> train -> score.

Each stage is a plain function that reads and writes files under one work directory and returns
a small JSON-serialisable dict (paths, counts, ids), so the same functions run inside
``seqenc demo`` and as Airflow tasks (which pass those dicts between tasks). Every stage
overwrites its outputs: running it again over the same input gives the same files.

Three tasks run on the built-in data:
* ``anomaly``: HDFS-like raw logs -> Drain3 -> one sequence per block -> Normal/Anomaly;
* ``milestone``: JSON session events -> one sequence per session -> none/upgrade/help_chat;
* ``next_item``: JSON purchase events -> one sequence per user -> the product bought next
  (retrieval over the catalogue, recall@k; the TVM-KA paper's Instacart task).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import mlflow
import numpy as np
import polars as pl
import torch

from parsers import events as event_ingest
from parsers import logs as log_ingest
from parsers import purchases, storage, synthetic
from seqenc.config import TVMKAConfig
from seqenc.model import TVMKA
from seqenc.numeric import NumericBins
from seqenc.pretrained import tvmka_from_bert
from seqenc.sequences import TokenizedSequences, collect_value_sequences, tokenize_value_sequences, with_event_key
from seqenc.tokenizer import ValueTokenizer
from training import tracking
from training.data import fixed_split, label_array, split_indices
from training.end_to_end import EndToEndTrainer, comparison_model
from training.engines import data_parallel
from training.metrics import (
    plot_confusion,
    plot_losses,
    plot_pr_curve,
    plot_recall_at_k,
    predict,
    ranking_metrics_of_lists,
    task_metrics,
)
from training.scoring import load_bundle, save_bundle, score_objects
from training.trainer import END_TO_END, InterleavedTrainer, TrainConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskSpec:
    source: str
    task: str  # "binary" | "multiclass" | "next_item"
    # The classes; empty for next_item, whose classes are the catalogue, read from the data
    # (:func:`task_classes`).
    class_names: tuple[str, ...]
    # Header fields that are unique per line (clock time, thread id) say nothing about a block
    # and would flood the vocabulary; they stay in the Parquet objects but out of S(k).
    exclude_keys: tuple[str, ...] = ()
    # Log tasks: add a key "event" whose value is the line's Drain3 template id ("E<id>"), one
    # token per line, so S(event) holds a whole block's event order in one short window. The
    # long template text stays in Parquet (key "template") and is left out of S(k).
    event_key: bool = False
    # next_item: the key whose values are catalogue items (the label is the next such value)
    item_key: str | None = None


TASKS = {
    "anomaly": TaskSpec("hdfs", "binary", ("Normal", "Anomaly"), ("date", "time", "pid", "template"),
                        event_key=True),
    "milestone": TaskSpec("sessions", "multiclass", ("none", "upgrade", "help_chat")),
    # event_type is always "purchase": it says nothing and stays out of S(k)
    "next_item": TaskSpec("purchases", "next_item", (), ("event_type",), item_key="product"),
}

# Built-in sizes: "demo" is the main job (minutes on 2 CPU cores), "tiny" serves tests and DAG runs.
SIZES = {
    "demo": {
        "data": {"n_blocks": 2000, "anomaly_rate": 0.04, "n_sessions": 1200, "n_users": 600, "n_products": 200},
        "model": {"d_model": 128, "n_layers": 2, "n_heads": 4, "n_shared_heads": 2, "d_ff": 256,
                  "max_positions": 128, "vocab_size": 4096},
        "train": {"pretrain_steps": 200, "rounds": 3, "tvm_steps_per_round": 80, "batch_tokens": 8192,
                  "ka_batch_size": 128},
    },
    "tiny": {
        "data": {"n_blocks": 200, "anomaly_rate": 0.1, "n_sessions": 150, "n_users": 120, "n_products": 40},
        "model": {"d_model": 32, "n_layers": 1, "n_heads": 4, "n_shared_heads": 2, "d_ff": 64,
                  "max_positions": 64, "vocab_size": 1024, "dropout": 0.0, "attn_dropout": 0.0},
        "train": {"pretrain_steps": 10, "rounds": 2, "tvm_steps_per_round": 6, "batch_tokens": 4096,
                  "warmup_steps": 2, "log_every": 2},
    },
}


# Pre-trained init (``pretrained="minilm"`` or a BERT directory): the architecture and the
# WordPiece vocabulary come from the checkpoint; the size still sets the data, the TVM window and
# the step counts. Choice: smaller learning rates (the paper's grid holds 1e-4 .. 5e-6), and the
# KA starts from the checkpoint's layers too (into_ka).
PRETRAINED_TRAIN = {"lr_tvm": 5e-5, "lr_ka": 1e-4}
# TVMKAConfig fields a pre-trained checkpoint fixes (seqenc.pretrained.config_from_bert); other
# model overrides (tvm_positions, surprise_scoring, dropout, ...) apply to it as to a fresh model
CHECKPOINT_FIELDS = {"vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "hidden_act", "max_positions",
                     "type_vocab_size", "layer_norm_eps", "pad_token_id"}


def _size(size: str) -> dict:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose from {sorted(SIZES)}")
    return SIZES[size]


def _fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


# --- 1. generate ------------------------------------------------------------------------------
def stage_generate(workdir: str, size: str = "demo", seed: int = 0) -> dict:
    raw = _fresh_dir(Path(workdir) / "raw")
    d = _size(size)["data"]
    hdfs = synthetic.generate_hdfs_logs(raw / "hdfs.log", raw / "hdfs_labels.csv", n_blocks=d["n_blocks"],
                                        anomaly_rate=d["anomaly_rate"], seed=seed)
    sessions = synthetic.generate_session_events(raw / "sessions.jsonl", raw / "sessions_labels.csv",
                                                 n_sessions=d["n_sessions"], seed=seed)
    bought = purchases.generate_purchases(raw / "purchases.jsonl", raw / "purchases_labels.csv",
                                          n_users=d["n_users"], n_products=d["n_products"], seed=seed)
    log.info("generated: %s | %s | %s", hdfs, sessions, bought)
    return {"hdfs_log": str(raw / "hdfs.log"), "hdfs_labels": str(raw / "hdfs_labels.csv"),
            "events": str(raw / "sessions.jsonl"), "events_labels": str(raw / "sessions_labels.csv"),
            "purchases": str(raw / "purchases.jsonl"), "purchases_labels": str(raw / "purchases_labels.csv")}


# --- 2. ingest --------------------------------------------------------------------------------
def stage_ingest_logs(workdir: str, log_path: str, labels_path: str, ingest_date: str | None = None) -> dict:
    root = Path(workdir) / "data"
    ingest_date = storage.ingest_date_str(ingest_date)
    report = log_ingest.ingest_logs(log_path, root, source="hdfs", preset="hdfs", ingest_date=ingest_date)
    log_ingest.ingest_labels(labels_path, root, "hdfs", id_column="BlockId", label_column="Label")
    return {"root": str(root), "source": "hdfs", "ingest_date": ingest_date, "report": _jsonable(report)}


def stage_ingest_events(workdir: str, events_path: str, labels_path: str, ingest_date: str | None = None,
                        source: str = "sessions") -> dict:
    root = Path(workdir) / "data"
    ingest_date = storage.ingest_date_str(ingest_date)
    report = event_ingest.ingest_events(events_path, root, source=source, ingest_date=ingest_date)
    log_ingest.ingest_labels(labels_path, root, source, id_column="session_id", label_column="label")
    return {"root": str(root), "source": source, "ingest_date": ingest_date, "report": _jsonable(report)}


def _jsonable(report: dict) -> dict:
    return json.loads(json.dumps(report, default=str))


# --- 3. value sequences -----------------------------------------------------------------------
def vocab_and_windows(value_seqs: pl.DataFrame, train_ids: pl.Series, model_cfg: dict,
                      pretrained: str | None = None) -> tuple[ValueTokenizer, TokenizedSequences]:
    """A WordPiece vocabulary from the train sequences' keys and values (or the pre-trained
    checkpoint's) with numeric bins fitted on the train values (seqenc.numeric), and every S(k)
    tokenised into windows as the model config says."""
    train_rows = value_seqs.join(pl.DataFrame({"sequence_id": train_ids}), on="sequence_id", how="semi")
    texts = train_rows["key"].to_list() + train_rows["values"].explode().to_list()
    tok = (ValueTokenizer.from_bert(pretrained) if pretrained
           else ValueTokenizer.train(texts, vocab_size=model_cfg["vocab_size"]))
    defaults = TVMKAConfig()  # bins and how a long S(k) is handled follow the model config
    n_bins = model_cfg.get("numeric_bins", defaults.numeric_bins)
    if n_bins:
        tok.with_numeric_bins(NumericBins.fit(train_rows["key"].to_list(), train_rows["values"].to_list(), n_bins))
        log.info("numeric bins for %d key(s): %s", len(tok.numeric.edges), sorted(tok.numeric.edges))
    if model_cfg.get("value_links", defaults.value_links):
        tok.with_value_links()
    if model_cfg.get("value_repeats", defaults.value_repeats):
        tok.with_value_repeats()
    data = tokenize_value_sequences(value_seqs, tok, model_cfg["max_positions"],
                                    model_cfg.get("long_sequences", defaults.long_sequences),
                                    model_cfg.get("max_windows", defaults.max_windows))
    return tok, data


def stage_sequences(workdir: str, task_name: str, size: str = "demo", seed: int = 0,
                    ingest_date: str | list[str] | None = None, pretrained: str | None = None,
                    data_root: str | None = None, split: str = "stratified", model_overrides: dict | None = None) -> dict:
    """S(k) for every labelled sequence, a train/dev/test split, a WordPiece vocabulary from
    train (or the pre-trained checkpoint's vocabulary when ``pretrained`` is given).
    ``model_overrides`` (TVMKAConfig fields) replace the size's tokenisation settings as they do
    the model's in :func:`stage_train` (``vocab_size``, ``max_positions``, ``numeric_bins``, ...).

    ``ingest_date`` restricts the input to one ingest partition or a list of them (None: all);
    ``data_root`` is the ingest root (default ``<workdir>/data``). ``split``: ``"stratified"``
    (by label, seeded) or ``"fixed"`` (by a hash of the sequence id, training.data.fixed_split:
    the same sequence is in the same split whatever the data window)."""
    if split not in ("stratified", "fixed"):
        raise ValueError(f"split must be 'stratified' or 'fixed', not {split!r}")
    spec = TASKS[task_name]
    root = Path(data_root) if data_root else Path(workdir) / "data"
    out = _fresh_dir(Path(workdir) / "sequences" / task_name)
    objects = storage.read_objects(root, spec.source, ingest_date)
    labels = storage.read_labels(root, spec.source).unique("sequence_id", keep="last")
    objects = objects.join(labels.select("sequence_id"), on="sequence_id", how="semi")
    value_seqs = collect_value_sequences(with_event_key(objects) if spec.event_key else objects,
                                         spec.exclude_keys)

    sequence_ids = value_seqs["sequence_id"].unique(maintain_order=True).to_list()
    by_id = dict(zip(labels["sequence_id"].to_list(), labels["label"].to_list()))
    classes = task_classes(spec, objects, labels)
    y = label_array(sequence_ids, labels, classes)
    if not sequence_ids:
        raise ValueError(f"{task_name}: no labelled sequences of source {spec.source!r} under {root} "
                         f"(ingest dates {ingest_date or 'all'})")
    if split == "fixed":
        split_of = np.array(fixed_split(sequence_ids), dtype=object)
    else:
        split_of = np.empty(len(y), dtype=object)
        # next_item: one stratum (stratified by target, most items' few sequences would all land in train)
        for name, idx in split_indices(np.zeros_like(y) if spec.task == "next_item" else y, seed).items():
            split_of[idx] = name
    split_df = pl.DataFrame({"sequence_id": sequence_ids, "split": split_of.tolist(),
                             "label": [by_id[s] for s in sequence_ids]})
    split_df.write_parquet(out / "splits.parquet")

    tok, data = vocab_and_windows(value_seqs, split_df.filter(pl.col("split") == "train")["sequence_id"],
                                  {**_size(size)["model"], **(model_overrides or {})}, pretrained)
    tok.save(out / "tokenizer.json")
    data.write_parquet(out / "windows.parquet")
    (out / "classes.json").write_text(json.dumps(classes))
    dates = None if ingest_date is None else sorted(
        storage.ingest_date_str(d) for d in (ingest_date if isinstance(ingest_date, (list, tuple)) else [ingest_date]))
    (out / "input.json").write_text(json.dumps({"source": spec.source, "ingest_dates": dates}))
    counts = np.bincount(y, minlength=len(classes))
    stats = {**data.stats, "vocab_size": tok.vocab_size, "n_classes": len(classes)}
    if spec.task == "next_item":  # a catalogue: how many items are ever a target, not one count each
        stats["distinct_targets"] = int((counts > 0).sum())
    else:
        stats["class_counts"] = {c: int(counts[i]) for i, c in enumerate(classes)}
    (out / "stats.json").write_text(json.dumps(stats, indent=2))
    return {"dir": str(out), "stats": stats}


def task_classes(spec: TaskSpec, objects: pl.DataFrame, labels: pl.DataFrame) -> list[str]:
    """The task's classes, in model-output order. next_item: the catalogue, i.e. every item seen
    as a value of ``spec.item_key`` or as a label, sorted (choice: the data defines the
    catalogue, so a user's own item ids need no list; an item first seen tomorrow joins the
    catalogue of tomorrow's model)."""
    if spec.task != "next_item":
        return list(spec.class_names)
    seen = objects.filter(pl.col("key") == spec.item_key)["value"].cast(pl.String)
    return sorted(set(seen.to_list()) | set(labels["label"].cast(pl.String).to_list()))


def sequence_objects(seq_dir: str | Path, data_root: str | Path, source: str) -> pl.DataFrame:
    """The objects :func:`stage_sequences` read for ``seq_dir`` (the same ingest dates, from
    ``input.json``), which the end-to-end modes tokenise themselves: a nightly window's model sees
    that window's objects only, even where a sequence id recurs on other dates. A sequences folder
    written before ``input.json`` existed reads every date, as it did."""
    path = Path(seq_dir) / "input.json"
    dates = json.loads(path.read_text())["ingest_dates"] if path.is_file() else None
    return storage.read_objects(data_root, source, dates)


def read_classes(seq_dir: Path) -> list[str]:
    """The classes :func:`stage_sequences` wrote (``classes.json``)."""
    return json.loads((Path(seq_dir) / "classes.json").read_text())


# --- 4. train ---------------------------------------------------------------------------------
def job_dir(workdir: str | Path, task_name: str) -> Path:
    """Where a training job keeps its checkpoints and KR caches (``--resume`` reads it)."""
    return Path(workdir) / "models" / task_name / "job"


def stage_train(workdir: str, task_name: str, size: str = "demo", seed: int = 0, progress: bool = True,
                pretrained: str | None = None, pretrained_layers: int | None = None, mode: str = "interleaved",
                train_overrides: dict | None = None, model_overrides: dict | None = None,
                resume: bool = False, data_root: str | None = None, tracking_dir: str | None = None) -> dict:
    """Algorithm 1 (or its ``no_interleave`` ablation) on one task, logged to MLflow; saves the
    model bundle and evaluation plots.

    ``pretrained`` ("minilm" or a BERT directory) initialises TVM and KA from that checkpoint;
    stage_sequences must have been run with the same value (its vocabulary). ``pretrained_layers``
    keeps only the checkpoint's first layers (default: all). ``train_overrides`` /
    ``model_overrides`` replace TrainConfig / TVMKAConfig fields. The arguments are kept in
    ``<job>/job.json``; ``resume`` continues the job from its latest checkpoint, in the same MLflow
    run (an error if there is none; see :func:`resume_train`). ``data_root`` is the ingest root
    (default ``<workdir>/data``; the end-to-end modes read objects from it); ``tracking_dir`` is
    where the local MLflow store lives when MLFLOW_TRACKING_URI is not set (default: workdir)."""
    job_args = {"workdir": str(workdir), "task_name": task_name, "size": size, "seed": seed, "pretrained": pretrained,
                "pretrained_layers": pretrained_layers, "mode": mode, "train_overrides": train_overrides or {},
                "model_overrides": model_overrides or {}, "data_root": data_root, "tracking_dir": tracking_dir}
    data_root = Path(data_root) if data_root else Path(workdir) / "data"
    tracking_dir = tracking_dir or workdir
    spec, sz = TASKS[task_name], _size(size)
    seq_dir = Path(workdir) / "sequences" / task_name
    tok = ValueTokenizer.from_file(seq_dir / "tokenizer.json")
    data = TokenizedSequences.read_parquet(seq_dir / "windows.parquet")
    split_df = pl.read_parquet(seq_dir / "splits.parquet")
    classes = read_classes(seq_dir)
    y = label_array(data.sequence_ids, split_df, classes)
    split_of = dict(zip(split_df["sequence_id"].to_list(), split_df["split"].to_list()))
    splits = {name: np.array([i for i, s in enumerate(data.sequence_ids) if split_of[s] == name])
              for name in ("train", "dev", "test")}

    torch.manual_seed(seed)
    surprise = bool((model_overrides or {}).get("surprise_scoring", False))
    task = {"vocab_size": tok.vocab_size, "pad_token_id": tok.pad_id, "val_sep_token_id": tok.val_sep_id,
            "task": spec.task, "class_names": classes,
            "numeric_bins": tok.numeric.n_bins if tok.numeric else 0, "value_links": tok.value_links,
            "value_repeats": tok.value_repeats,
            **({"n_items": len(classes)} if spec.task == "next_item" else {"n_classes": len(classes)})}
    train = {**sz["train"], **(PRETRAINED_TRAIN if pretrained else {}), "seed": seed, "mode": mode,
             **(train_overrides or {})}
    if mode in END_TO_END and surprise:
        raise ValueError(f"surprise_scoring reads the TVM of interleaved / no_interleave training, not mode {mode!r}")
    if pretrained and mode in ("joint", "record_view"):
        raise ValueError(f"mode {mode!r} has no pre-trained init; use interleaved, no_interleave or flattened")
    if pretrained:
        depth = {"n_layers": pretrained_layers} if pretrained_layers else {}
        fixed = sorted(set(model_overrides or {}) & CHECKPOINT_FIELDS)
        if fixed:
            raise ValueError(f"with a pre-trained init the checkpoint sets {', '.join(fixed)}: leave them out of "
                             "the model config (--pretrained-layers sets the depth)")
        model = tvmka_from_bert(pretrained, into_ka=True, **{"max_positions": sz["model"]["max_positions"],
                                                             **(model_overrides or {}), **depth, **task})
    else:
        model = TVMKA(TVMKAConfig(**{**sz["model"], **(model_overrides or {}), **task}))
    train_cfg = TrainConfig(**train)
    rank, _ = data_parallel(train_cfg.deepspeed)  # only rank 0 logs and saves (training.engines)
    job = job_dir(workdir, task_name)
    if not resume and rank == 0:
        _fresh_dir(job)
        (job / "job.json").write_text(json.dumps(job_args, indent=2))
    hooks = {"log_metrics": tracking.log_metrics, "progress": progress, "on_phase_end": tracking.log_phase_run} \
        if rank == 0 else {"progress": False}
    if mode in END_TO_END:
        objects = sequence_objects(seq_dir, data_root, spec.source)
        model, inputs = comparison_model(mode, model.config, data, tok, with_event_key(objects) if spec.event_key
                                         else objects, spec.exclude_keys, pretrained)
        trainer = EndToEndTrainer(model, inputs, y, splits, train_cfg, job, spec.task, len(classes), **hooks)
    else:
        trainer = InterleavedTrainer(model, tok, data, y, splits, train_cfg, job, **hooks)
    config = model.config
    if resume and not trainer.resume():
        raise FileNotFoundError(f"nothing to resume: no checkpoint under {job / 'checkpoints'}")
    if rank != 0:  # another data-parallel rank: it trains in step with rank 0, which logs and saves
        result = trainer.fit()
        return {"rank": rank, "metrics": {"dev": result["dev"], "test": result["test"]}, "job_dir": str(job),
                "run_id": None, "model_dir": None}
    out, plots = job.parent, _fresh_dir(Path(workdir) / "plots" / task_name)
    stats = json.loads((seq_dir / "stats.json").read_text())
    params = {"task": task_name, "mode": mode, "size": size, "pretrained": pretrained or "none",
              "model": config.to_dict(), "train": asdict(train_cfg), "data": stats}
    fingerprint = tracking.dataset_fingerprint(seq_dir / "splits.parquet", seq_dir / "windows.parquet")
    tags = {"task": task_name, "mode": mode, "dataset_fingerprint": fingerprint}
    with tracking.run(tracking_dir, run_name=f"{task_name}-{mode}", params=params, tags=tags,
                      run_id=trainer.run_ids.get("job")) as run:
        trainer.run_ids["job"] = run.info.run_id
        result = trainer.fit()
        metadata = {"task_name": task_name, "source": spec.source, "threshold": result["threshold"], "mode": mode,
                    "exclude_keys": list(spec.exclude_keys), "event_key": spec.event_key,
                    "mlflow_run_id": run.info.run_id}
        if getattr(trainer, "surprise", None) is not None:  # seqenc.surprise: scoring combines the same way
            metadata["surprise"] = trainer.surprise.to_dict()
        bundle = save_bundle(model, tok, metadata, out / "bundle")
        test = splits["test"]
        if spec.task == "next_item":
            plot_recall_at_k(y[test], result["probs"][test], plots / "recall_at_k_test.png",
                             f"{task_name}: test recall@k")
        else:
            pred = predict(result["probs"][test], spec.task, result["threshold"])
            plot_confusion(y[test], pred, classes, plots / "confusion_test.png", f"{task_name}: test confusion matrix")
        plot_losses(trainer.history, plots / "losses.png", f"{task_name}: training losses")
        if spec.task == "binary":
            plot_pr_curve(y[test], result["probs"][test, 1], result["threshold"], plots / "pr_curve_test.png",
                          f"{task_name}: test precision-recall")
        metrics = {"dev": result["dev"], "test": result["test"], "threshold": result["threshold"],
                   "seconds": result["seconds"]}
        (plots / "metrics.json").write_text(json.dumps(metrics, indent=2))
        (plots / "train_config.json").write_text(json.dumps({"model": config.to_dict(), "train": asdict(train_cfg)},
                                                            indent=2))
        mlflow.log_artifacts(str(plots), "plots")
        model_version = tracking.log_bundle_model(bundle, registered_model_name(task_name))
    return {"model_dir": str(bundle), "run_id": run.info.run_id, "metrics": metrics, "job_dir": str(job),
            "registered_model": registered_model_name(task_name), "model_version": model_version,
            "tracking_uri": tracking.tracking_uri(tracking_dir)}


def registered_model_name(task_name: str) -> str:
    """Model Registry name of a task's models (every mode registers a version of it)."""
    return f"seqenc-{task_name}"


def resume_train(job: str | Path, progress: bool = True, device: str | None = None) -> dict:
    """Continue a killed or stopped training job from its directory (``seqenc train --resume``);
    ``device`` moves it (e.g. a job started on a CPU continues on a GPU: same results up to
    floating-point differences)."""
    path = Path(job) / "job.json"
    if not path.exists():
        raise FileNotFoundError(f"{job} is not a training job directory (no job.json)")
    kwargs = json.loads(path.read_text())
    if device is not None:
        kwargs["train_overrides"] = {**kwargs.get("train_overrides", {}), "device": device}
    return stage_train(**kwargs, progress=progress, resume=True)


def run_train(workdir: str, task_name: str, size: str = "demo", seed: int = 0, mode: str = "interleaved",
              config: dict | None = None, pretrained: str | None = None, pretrained_layers: int | None = None,
              progress: bool = True) -> dict:
    """``seqenc train``: value sequences from the data already ingested under ``workdir/data``,
    then one training job. ``config``: ``{"model": {...}, "train": {...}}`` overrides."""
    config = config or {}
    unknown = set(config) - {"model", "train"}
    if unknown:
        raise ValueError(f"unknown config sections {sorted(unknown)}; use 'model' and 'train'")
    deepspeed = config.get("train", {}).get("deepspeed")
    rank, world = data_parallel(deepspeed)
    if rank == 0:
        stage_sequences(workdir, task_name, size, seed, pretrained=pretrained, model_overrides=config.get("model"))
    if world > 1:  # the other ranks read what rank 0 wrote (value sequences, vocabulary, splits)
        from training.deepspeed_engine import barrier

        barrier()
    return stage_train(workdir, task_name, size, seed, progress=progress, pretrained=pretrained,
                       pretrained_layers=pretrained_layers, mode=mode, train_overrides=config.get("train"),
                       model_overrides=config.get("model"))


# --- 5. score ---------------------------------------------------------------------------------
def stage_score(workdir: str, task_name: str, split: str = "test", progress: bool = True,
                ingest_date: str | None = None) -> dict:
    """Score the sequences of one split with the saved bundle into a predictions Parquet."""
    spec = TASKS[task_name]
    model_dir = Path(workdir) / "models" / task_name / "bundle"
    split_df = pl.read_parquet(Path(workdir) / "sequences" / task_name / "splits.parquet")
    chosen = split_df.filter(pl.col("split") == split)
    objects = storage.read_objects(Path(workdir) / "data", spec.source, ingest_date)
    objects = objects.join(chosen.select("sequence_id"), on="sequence_id", how="semi")
    bundle = load_bundle(model_dir)  # loaded once: scoring and the run id both read it
    predictions = score_objects(bundle, objects, progress=progress)
    predictions = predictions.join(chosen.select("sequence_id", "label"), on="sequence_id", how="left")
    meta = bundle[2]
    predictions = predictions.with_columns(pl.lit(meta["mlflow_run_id"]).alias("mlflow_run_id"))
    path = Path(workdir) / "predictions" / task_name / f"{split}.parquet"
    storage.write_parquet_atomic(predictions, path)
    if spec.task == "next_item":
        metrics = ranking_metrics_of_lists(predictions["label"].to_list(), predictions["top_items"].to_list())
    else:
        y = np.array([spec.class_names.index(v) for v in predictions["label"].to_list()])
        pred = np.array([spec.class_names.index(v) for v in predictions["prediction"].to_list()])
        metrics = task_metrics(y, pred, spec.task)
    return {"predictions": str(path), "rows": predictions.height, "metrics": metrics}


# --- the whole job ----------------------------------------------------------------------------
def run_demo(out_dir: str, size: str = "demo", seed: int = 0, progress: bool = True,
             pretrained: str | None = None, pretrained_layers: int | None = None) -> dict:
    t0 = time.time()
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    raw = stage_generate(str(out), size, seed)
    for stale in ("data",):  # re-running the demo replaces its data partitions
        shutil.rmtree(out / stale, ignore_errors=True)
    ingest = {"anomaly": stage_ingest_logs(str(out), raw["hdfs_log"], raw["hdfs_labels"]),
              "milestone": stage_ingest_events(str(out), raw["events"], raw["events_labels"]),
              "next_item": stage_ingest_events(str(out), raw["purchases"], raw["purchases_labels"],
                                               source="purchases")}
    summary = {"metrics": {}, "run_ids": [], "predictions": [], "ingest": {}, "test_metrics_from_predictions": {}}
    for task_name in TASKS:
        summary["ingest"][task_name] = ingest[task_name]["report"]
        date = ingest[task_name]["ingest_date"]
        stage_sequences(str(out), task_name, size, seed, ingest_date=date, pretrained=pretrained)
        trained = stage_train(str(out), task_name, size, seed, progress=progress, pretrained=pretrained,
                              pretrained_layers=pretrained_layers)
        scored = stage_score(str(out), task_name, progress=progress, ingest_date=date)
        summary["metrics"][task_name] = trained["metrics"]["test"]
        summary["run_ids"].append(trained["run_id"])
        summary["predictions"].append(scored["predictions"])
        summary["test_metrics_from_predictions"][task_name] = scored["metrics"]
    summary["mlflow_tracking_uri"] = tracking.tracking_uri(out)
    summary["seconds"] = round(time.time() - t0, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
