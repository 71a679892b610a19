"""The main job, stage by stage: generate -> ingest -> value sequences -> train -> score.

Each stage is a plain function that reads and writes files under one work directory and returns
a small JSON-serialisable dict (paths, counts, ids), so the same functions run inside
``seqenc demo``, ``seqenc train`` and as Airflow tasks (which pass those dicts between tasks).
Every stage overwrites its outputs: running it again over the same input gives the same files.

What runs is declared in the catalogue (training.tasks.catalog): its sources say how raw files become
objects, its tasks what to predict. The shipped default catalogue holds the built-in demo's
three tasks (HDFS-like logs -> Normal/Anomaly per block; session events -> a milestone class;
purchase events -> the next product, the TVM-KA paper's Instacart task); a user's catalogue
holds theirs, including ``anomaly`` tasks trained without labels (training.engine.unlabelled).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path

import mlflow
import numpy as np
import polars as pl
import torch

from parsers import atomic, objectstore, purchases, storage, synthetic
from parsers.landing import ingest_path
from seqenc.model import TVMKA
from seqenc.pretrained import tvmka_from_bert
from seqenc.sequences import TokenizedSequences
from seqenc.tokenizer import ValueTokenizer
from training.engine.engines import data_parallel
from training.engine.modes import MODES, SELECTABLE, get_mode
from training.engine.rank_share import RankShare
from training.engine.sizes import resolve_size, size_settings
from training.engine.trainer import TrainConfig
from training.serving import tracking
from training.serving.evaluate import count_baseline_metrics, history_rank_metrics, prediction_metrics
from training.serving.registry import registered_model_name
from training.serving.scoring import load_bundle, reference_scores, save_bundle, score_objects, window_rule
from training.tasks.catalog import SPLITS, load_catalog
from training.tasks.kinds import get_kind
from training.tasks.metrics import (
    below_floor,
    plot_confusion,
    plot_losses,
    plot_pr_curve,
    plot_recall_at_k,
    plot_score_histogram,
    predict,
    split_floors,
)
from training.tasks.sequence_build import CHUNK_SEQUENCES, Ranks, build_sequences
from training.tasks.spec import TaskSpec, specs_of
from training.tasks.task_data import (
    UNLABELLED,
    label_vector,
    read_item_history,
    read_task,
    read_task_objects,
    sequence_objects,
    task_input,
    task_objects,
)

log = logging.getLogger(__name__)


# Pre-trained init (``pretrained="minilm"`` or a BERT directory): the architecture and the
# WordPiece vocabulary come from the checkpoint; the size still sets the data, the TVM window and
# the step counts. Choice: smaller learning rates (the paper's grid holds 1e-4 .. 5e-6), and the
# KA starts from the checkpoint's layers too (into_ka).
PRETRAINED_TRAIN = {"lr_tvm": 5e-5, "lr_ka": 1e-4}
# A table encoder trained from scratch (mode "table", no pre-trained init): TrainConfig's lr_task,
# 1e-4, is a fine-tuning rate -- right for the MiniLM-initialised encoders, but a scratch dense or
# MAFiD encoder did not learn even a planted cue at it. Chosen on the dev split of that control
# task (docs/tables.md, "Learning rate of the scratch table encoders"); a given lr_task still wins.
# The size's "table_train" adds its pre-training and task steps, and at size demo its own lr_task,
# 5e-4, chosen on TabFact's dev splits (training.engine.sizes).
# keep_best: the final model is the best dev evaluation's (TabFact, seed 0: dev 0.592 after 500
# task updates, 0.579 at the end of 1,500; docs/tables.md).
SCRATCH_TABLE_TRAIN = {"lr_task": 1e-3, "keep_best": True}
# TVMKAConfig fields a pre-trained checkpoint fixes (seqenc.pretrained.config_from_bert); other
# model overrides (tvm_positions, surprise_scoring, dropout, ...) apply to it as to a fresh model
CHECKPOINT_FIELDS = {"vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "hidden_act", "max_positions",
                     "type_vocab_size", "layer_norm_eps", "pad_token_id"}


def _fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


# --- 1. generate ------------------------------------------------------------------------------
def stage_generate(workdir: str, size: str = "demo", seed: int = 0, catalog=None) -> dict:
    """The built-in data of every catalogue source that names a ``demo_generator``:
    ``{source: {"path": raw file, "labels": labels CSV}}`` under ``<workdir>/raw``."""
    raw = _fresh_dir(Path(workdir) / "raw")
    d = size_settings(size)["data"]
    out = {}
    for name, source in load_catalog(catalog).sources.items():
        if source.demo_generator is None:
            continue
        labels = raw / f"{name}_labels.csv"
        if source.demo_generator == "hdfs_logs":
            path = raw / f"{name}.log"
            synthetic.generate_hdfs_logs(path, labels, n_blocks=d["n_blocks"], anomaly_rate=d["anomaly_rate"],
                                         seed=seed)
        elif source.demo_generator == "session_events":
            path = raw / f"{name}.jsonl"
            synthetic.generate_session_events(path, labels, n_sessions=d["n_sessions"], seed=seed)
        else:  # "purchases"
            path = raw / f"{name}.jsonl"
            purchases.generate_purchases(path, labels, n_users=d["n_users"], n_products=d["n_products"], seed=seed)
        out[name] = {"path": str(path), "labels": str(labels)}
        log.info("generated %s: %s, %s", name, path, labels)
    return out


# --- 2. ingest --------------------------------------------------------------------------------
def stage_ingest(workdir: str, source: str, path: str, labels: str | None = None, ingest_date: str | None = None,
                 catalog=None, data_root: str | None = None) -> dict:
    """One raw file of a catalogue source (and its labels CSV) into ``<workdir>/data`` (or
    ``data_root``: a local folder or ``s3://bucket/prefix``, parsers.objectstore), as the source
    declares (parsers.landing.ingest_path)."""
    root = objectstore.as_path(data_root) if data_root else Path(workdir) / "data"
    ingest_date = storage.ingest_date_str(ingest_date)
    spec = load_catalog(catalog).source(source)
    report = ingest_path(path, root, source, spec, ingest_date=ingest_date)
    if labels:
        report["labels"] = ingest_path(labels, root, source, spec, "labels", ingest_date=ingest_date)
    return {"root": str(root), "source": source, "ingest_date": ingest_date, "report": _jsonable(report)}


def _jsonable(report: dict) -> dict:
    return json.loads(json.dumps(report, default=str))


# --- 3. value sequences -----------------------------------------------------------------------
def sequences_dir(workdir: str | Path, task_name: str) -> Path:
    return Path(workdir) / "sequences" / task_name


def stage_sequences(workdir: str, task: TaskSpec, size: str | None = None, seed: int = 0,
                    ingest_date: str | list[str] | None = None, pretrained: str | None = None,
                    data_root: str | None = None, split: str | None = None, model_overrides: dict | None = None,
                    chunk_sequences: int = CHUNK_SEQUENCES, progress: bool = True, rank: int = 0,
                    world: int = 1) -> dict:
    """S(k) of the task's sequences (every sequence of its source for an ``anomaly`` task, the
    labelled ones otherwise), a train/dev/test split, a WordPiece vocabulary from train (or the
    pre-trained checkpoint's when ``pretrained`` is given), and ``task.json``: the task (resolved
    by the caller, training.tasks.spec) with its classes.

    ``size`` defaults to the task's (else $SEQENC_SIZE, else "demo": :func:`resolve_size`); ``model_overrides`` (TVMKAConfig fields) go on
    top of the task's ``config.model`` and replace the size's tokenisation settings
    (``vocab_size``, ``max_positions``, ``numeric_bins``, ...). ``ingest_date`` restricts the
    input to one ingest partition or a list of them (None: all); ``data_root`` is the ingest root
    (default ``<workdir>/data``). ``split`` (default: the task's): ``"stratified"``, ``"fixed"``
    or ``"time"`` (training.tasks.task_data.assign_splits). The files are written to a folder beside
    the task's and swapped in when all are written: a failed run leaves the previous outputs.
    The input is read lazily and built ``chunk_sequences`` sequences at a time
    (training.tasks.sequence_build): memory follows that, not the number of days read.

    ``rank`` / ``world``: data-parallel ranks (``seqenc train --deepspeed``) call it together and
    divide the building (training.tasks.sequence_build.Ranks: a scratch folder beside the
    task's); rank 0 writes the files and returns the stats, the others return ``{"rank": r}``."""
    split = split or task.split
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    root = objectstore.as_path(data_root) if data_root else Path(workdir) / "data"
    inp = task_input(task, root, ingest_date)
    own = task.kind_spec.task_settings("model", {**task.config.get("model", {}), **(model_overrides or {})},
                                       plain=bool(task.table_source or pretrained))  # training.tasks.kinds
    model_cfg = {**size_settings(resolve_size(size, task.size))["model"], **task.kind_spec.model_settings(own)}
    final = sequences_dir(workdir, task.name)
    ranks = None
    if world > 1:
        from training.engine.deepspeed_engine import barrier

        ranks = Ranks(rank, world, barrier, final.with_name(f".{final.name}.ranks"))
        if rank == 0:  # empty before any rank writes into it
            shutil.rmtree(ranks.scratch, ignore_errors=True)
            ranks.scratch.mkdir(parents=True)
        barrier()
        if rank != 0:
            build_sequences(None, task, inp, split, seed, model_cfg, pretrained, ingest_date, chunk_sequences,
                            progress=False, ranks=ranks)
            return {"rank": rank}
    with atomic.replacing_dir(final) as out:  # swapped in whole at the end
        stats = build_sequences(out, task, inp, split, seed, model_cfg, pretrained, ingest_date,
                                chunk_sequences, progress=progress, ranks=ranks)
    return {"dir": str(final), "stats": stats}


# --- 4. train ---------------------------------------------------------------------------------
def job_dir(workdir: str | Path, task_name: str) -> Path:
    """Where a training job keeps its checkpoints and KR caches (``--resume`` reads it)."""
    return Path(workdir) / "models" / task_name / "job"


def stage_train(workdir: str, task_name: str, size: str | None = None, seed: int = 0, progress: bool = True,
                pretrained: str | None = None, pretrained_layers: int | None = None, mode: str | None = None,
                train_overrides: dict | None = None, model_overrides: dict | None = None,
                resume: bool = False, data_root: str | None = None, tracking_dir: str | None = None) -> dict:
    """One training job on a task whose sequences :func:`stage_sequences` built (the task as
    declared then: ``<workdir>/sequences/<task>/task.json``), logged to MLflow; saves the model
    bundle and evaluation plots and registers it as a version of ``seqenc-<task>``.

    Labelled tasks: Algorithm 1 (``mode`` "interleaved", the default), its ``no_interleave``
    ablation or an end-to-end baseline. ``anomaly`` tasks: the TVM's masked LM alone on the train
    sequences (those labelled normal with ``train_on = "normal"``), scored by masked-value
    surprise, flagged by the task's threshold policy (training.engine.unlabelled).

    ``size`` and ``mode`` default to the task's (else :func:`resolve_size`'s, "interleaved"); ``train_overrides``
    / ``model_overrides`` replace TrainConfig / TVMKAConfig fields on top of the task's
    ``config``. ``pretrained`` ("minilm" or a BERT directory) initialises TVM and KA from that
    checkpoint; stage_sequences must have been run with the same value (its vocabulary).
    ``pretrained_layers`` keeps only the checkpoint's first layers (default: all). The arguments
    are kept in ``<job>/job.json``; ``resume`` continues the job from its latest checkpoint, in the
    same MLflow run (an error if there is none; see :func:`resume_train`). ``data_root`` is the
    ingest root (default ``<workdir>/data``; the end-to-end modes read objects from it);
    ``tracking_dir`` is where the local MLflow store lives when MLFLOW_TRACKING_URI is not set
    (default: workdir)."""
    job_args = {"workdir": str(workdir), "task_name": task_name, "size": size, "seed": seed, "pretrained": pretrained,
                "pretrained_layers": pretrained_layers, "mode": mode, "train_overrides": train_overrides or {},
                "model_overrides": model_overrides or {}, "data_root": data_root, "tracking_dir": tracking_dir}
    data_root = objectstore.as_path(data_root) if data_root else Path(workdir) / "data"
    tracking_dir = tracking_dir or workdir
    seq_dir = sequences_dir(workdir, task_name)
    spec, classes = read_task(seq_dir)
    size = job_args["size"] = resolve_size(size, spec.size)  # resolved: a resumed job keeps it
    sz = size_settings(size)
    mode_name = mode or spec.mode
    # the kind's task defaults under the task's config and the run's (training.tasks.kinds)
    plain, end_to_end = bool(spec.table_source or pretrained), get_mode(mode_name).end_to_end
    model_overrides = spec.kind_spec.task_settings("model", {**spec.config.get("model", {}), **(model_overrides or {})},
                                                   plain, end_to_end)
    train_overrides = spec.kind_spec.task_settings("train", {**spec.config.get("train", {}), **(train_overrides or {})},
                                                   plain, end_to_end)
    if not spec.kind_spec.labelled and mode_name != "interleaved":
        raise ValueError(f"task {task_name} ({spec.kind}, no labels) trains the TVM's masked LM alone; mode "
                         f"{mode_name!r} needs labels: leave mode out")
    # training.engine.modes: an unlabelled task trains the masked LM alone, whatever the default says
    mode = get_mode(mode_name) if spec.kind_spec.labelled else MODES["unlabelled"]
    if mode.name == "table" and not spec.table_source:
        raise ValueError(f"mode table reads a text joined to its table, and task {task_name} has no table_source; "
                         "declare table_source (docs/tables.md) or leave --mode table out")
    tok = ValueTokenizer.from_file(seq_dir / "tokenizer.json")
    # a data-parallel rank of the KR-cache trainers reads the index of every sequence and the windows of its
    # share (training.engine.rank_share); the end-to-end modes encode any batch's windows: every rank reads all
    rank, world = data_parallel(train_overrides.get("deepspeed"))
    share = None if mode.end_to_end else RankShare.read(seq_dir / "windows.parquet", rank, world)
    data = share.index if share else TokenizedSequences.read_parquet(seq_dir / "windows.parquet")
    split_df = pl.read_parquet(seq_dir / "splits.parquet")
    y = label_vector(data.sequence_ids, split_df.filter(pl.col("label").is_not_null()), classes, spec)
    split_of = dict(zip(split_df["sequence_id"].to_list(), split_df["split"].to_list()))
    splits = {name: np.array([i for i, s in enumerate(data.sequence_ids) if split_of[s] == name], dtype=np.int64)
              for name in ("train", "dev", "test")}
    if spec.kind == "anomaly" and spec.train_on == "normal":  # DeepLog's setting: normal train, clean reference
        splits = {**splits, "train": splits["train"][y[splits["train"]] == 0], "dev": splits["dev"][y[splits["dev"]] == 0],
                  "vocabulary": splits["train"]}  # novel values: held by train, never by its normal sequences
    for name in ("train", "dev"):
        if len(splits[name]) == 0:
            raise ValueError(f"task {task_name}: the {name} split is empty ({len(data.sequence_ids)} sequences); "
                             "ingest more sequences (or labels) before training")

    torch.manual_seed(seed)
    surprise = bool(model_overrides.get("surprise_scoring", False))
    task = {"vocab_size": tok.vocab_size, "pad_token_id": tok.pad_id, "val_sep_token_id": tok.val_sep_id,
            "task": spec.model_task, "class_names": classes,
            "numeric_bins": tok.numeric.n_bins if tok.numeric else 0,
            "numeric_gap_cuts": tok.numeric.gap_cuts if tok.numeric else 0, "value_links": tok.value_links,
            "value_repeats": tok.value_repeats, "value_end": tok.value_end,
            **({"n_items": len(classes)} if spec.kind_spec.ranks_items else {"n_classes": len(classes)})}
    model_overrides = spec.kind_spec.model_settings(model_overrides, end_to_end=mode.end_to_end)
    init_train = PRETRAINED_TRAIN if pretrained else \
        {**SCRATCH_TABLE_TRAIN, **sz.get("table_train", {})} if mode.name == "table" else {}
    rule = {"threshold_rule": spec.threshold_policy()["policy"]} if spec.kind == "binary" else {}  # training.tasks.thresholds
    train = {**sz["train"], **init_train, "seed": seed, "mode": mode_name, **rule, **train_overrides}
    if mode.name == "table" and train.get("table_pretrain_steps"):  # lookup pre-training reads its own head
        model_overrides = {**model_overrides, "table_lookup_head": True}
    if mode.end_to_end and surprise:
        raise ValueError(f"surprise_scoring reads the TVM of interleaved / no_interleave training, not mode "
                         f"{mode.name!r}")
    if surprise and train["threshold_rule"] == "half":  # the combined P of nearly every sequence is >= 0.5
        raise ValueError("threshold policy 'half' reads P = 0.5 as the model's own decision, and the masked-LM surprise "
                         "beside the KA has none (it would flag nearly every sequence): use one_se or best_f1, or set "
                         "surprise_scoring = false in the task's config")
    if pretrained and not mode.pretrained_init:
        raise ValueError(f"mode {mode.name!r} has no pre-trained init; use "
                         f"{', '.join(m for m in SELECTABLE if MODES[m].pretrained_init)}")
    if pretrained:
        depth = {"n_layers": pretrained_layers} if pretrained_layers else {}
        fixed = sorted(set(model_overrides) & CHECKPOINT_FIELDS)
        if fixed:
            raise ValueError(f"with a pre-trained init the checkpoint sets {', '.join(fixed)}: leave them out of "
                             "the model config (--pretrained-layers sets the depth)")
        into_ka = model_overrides.get("ka_init", "default") == "default"  # DT-Fixup: a new KA (seqenc.fixup)
        # the TVM's window is the size's; a table model's positions are per cell: the checkpoint's serve
        window = {} if mode.name == "table" else {"max_positions": sz["model"]["max_positions"]}
        model = tvmka_from_bert(pretrained, into_ka=into_ka, config_class=mode.config_class(),
                                **{**window, **model_overrides, **depth, **task})
    else:
        config = mode.config_class()(**{**sz["model"], **model_overrides, **task})  # the family's own class
        if mode.name == "table" and "max_positions" not in model_overrides:  # positions are per cell: the
            # text ([CLS] text [SEP]) is the longest cell, so a size's window must not be shorter
            config = replace(config, max_positions=max(config.max_positions, config.max_text_tokens + 2,
                                                       config.max_cell_tokens))
        model = TVMKA(config)
    train_cfg = TrainConfig(**train)
    rank, _ = data_parallel(train_cfg.deepspeed)  # only rank 0 logs and saves (training.engine.engines)
    job = job_dir(workdir, task_name)
    if not resume and rank == 0:
        _fresh_dir(job)
        (job / "job.json").write_text(json.dumps(job_args, indent=2))
    hooks = {"log_metrics": tracking.log_metrics, "progress": progress, "on_phase_end": tracking.log_phase_run} \
        if rank == 0 else {"progress": False}
    trainer_class = mode.trainer_class()  # training.engine.modes
    if mode.name == "unlabelled":
        trainer = trainer_class(model, tok, data, y, splits, train_cfg, job, threshold=spec.threshold_policy(),
                                share=share, **hooks)
    elif mode.end_to_end:
        objects = task_objects(sequence_objects(seq_dir, data_root, spec), spec)
        model, inputs = mode.build_model(model.config, data, tok, objects, spec.exclude_keys, pretrained)
        trainer = trainer_class(model, inputs, y, splits, train_cfg, job, spec.model_task, len(classes), **hooks)
    else:
        if model.config.item_history:
            data.item_history = read_item_history(seq_dir, data.sequence_ids)
        trainer = trainer_class(model, tok, data, y, splits, train_cfg, job, share=share, **hooks)
    config = model.config
    if resume and not trainer.resume():
        raise FileNotFoundError(f"nothing to resume: no checkpoint under {job / 'checkpoints'}")
    if rank != 0:  # another data-parallel rank: it trains in step with rank 0, which logs and saves
        result = trainer.fit()
        return {"rank": rank, "metrics": {"dev": result["dev"], "test": result["test"]}, "job_dir": str(job),
                "run_id": None, "model_dir": None, "data_parallel": result["data_parallel"]}
    out, plots = job.parent, _fresh_dir(Path(workdir) / "plots" / task_name)
    stats = json.loads((seq_dir / "stats.json").read_text())
    shown_mode = mode.name
    params = {"task": task_name, "kind": spec.kind, "source": spec.source, "mode": shown_mode, "size": size,
              "pretrained": pretrained or "none", "model": config.to_dict(), "train": asdict(train_cfg),
              "data": stats, "threshold_policy": spec.threshold_policy()}
    fingerprint = tracking.dataset_fingerprint(seq_dir / "splits.parquet", seq_dir / "windows.parquet")
    tags = {"task": task_name, "mode": shown_mode, "dataset_fingerprint": fingerprint}
    with tracking.run(tracking_dir, run_name=f"{task_name}-{shown_mode}", params=params, tags=tags,
                      run_id=trainer.run_ids.get("job")) as run:
        trainer.run_ids["job"] = run.info.run_id
        result = trainer.fit()
        metadata = {"task_name": task_name, "task_kind": spec.kind, "source": spec.source,
                    "threshold": result["threshold"], "mode": shown_mode, "exclude_keys": list(spec.exclude_keys),
                    "keep_keys": spec.keep_keys, "event_key": spec.event_key, "item_key": spec.item_key,
                    "table_source": spec.table_source, "table_key": spec.table_key,
                    "mlflow_run_id": run.info.run_id, "best_step": result["best_step"],
                    "window_rule": window_rule(spec),  # anomaly: flags per scored window (training.serving.scoring)
                    "threshold_policy": spec.threshold_policy()}  # how training set "threshold"
        if spec.kind == "anomaly":  # a small scored day is judged beside these; a drifted one is told (scoring)
            metadata["reference_scores"] = reference_scores(result["probs"][trainer.reference, 1])
        if getattr(trainer, "surprise", None) is not None:  # seqenc.surprise: scoring combines the same way
            metadata["surprise"] = trainer.surprise.to_dict()
        trained_ids = split_df.filter(pl.col("split") == "train")["sequence_id"]  # a scored day says which it read
        bundle = save_bundle(model, tok, metadata, out / "bundle", trained_ids=trained_ids)
        _plots(plots, task_name, spec.model_task, classes, y, splits, result, trainer.history)
        metrics = {"dev": result["dev"], "test": result["test"], "threshold": result["threshold"],
                   "seconds": result["seconds"], "best_step": result["best_step"],  # best_step: keep_best's
                   "floor": split_floors(y, splits, spec.model_task, UNLABELLED)}  # flag-all / majority
        warning = below_floor(metrics, metrics["floor"], spec.model_task, declared=spec.kind)
        if warning:
            log.warning("task %s: %s", task_name, warning)
        mlflow.log_metrics({f"floor/{split}/{k}": v for split, m in metrics["floor"].items() for k, v in m.items()})
        (plots / "metrics.json").write_text(json.dumps(metrics, indent=2))
        (plots / "train_config.json").write_text(json.dumps({"model": config.to_dict(), "train": asdict(train_cfg)},
                                                            indent=2))
        mlflow.log_artifacts(str(plots), "plots")
        model_version = tracking.log_bundle_model(bundle, registered_model_name(task_name))
    return {"model_dir": str(bundle), "run_id": run.info.run_id, "metrics": metrics, "job_dir": str(job),
            "registered_model": registered_model_name(task_name), "model_version": model_version,
            "tracking_uri": tracking.tracking_uri(tracking_dir),
            "data_parallel": result["data_parallel"]}  # what each rank computed (training.engine.sharding)


def _plots(plots: Path, task_name: str, task: str, classes: list[str], y: np.ndarray, splits: dict, result: dict,
           history) -> None:
    """The evaluation plots of a training job (test split; only its labelled sequences)."""
    test = splits["test"][y[splits["test"]] != UNLABELLED]
    probs = result["probs"]
    if task == "binary":
        scores = probs[splits["test"], 1]
        flags = [classes[int(p >= result["threshold"])] for p in scores]
        plot_score_histogram(scores, flags, plots / "scores_test.png", f"{task_name}: test scores")
    if len(test) and get_kind(task).ranks_items:
        plot_recall_at_k(y[test], probs[test], plots / "recall_at_k_test.png", f"{task_name}: test recall@k")
    elif len(test):
        pred = predict(probs[test], task, result["threshold"])
        plot_confusion(y[test], pred, classes, plots / "confusion_test.png", f"{task_name}: test confusion matrix")
        if task == "binary" and len(set(y[test].tolist())) == 2:
            plot_pr_curve(y[test], probs[test, 1], result["threshold"], plots / "pr_curve_test.png",
                          f"{task_name}: test precision-recall")
    plot_losses(history, plots / "losses.png", f"{task_name}: training losses")


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


def run_train(workdir: str, task: TaskSpec, size: str | None = None, seed: int = 0, mode: str | None = None,
              config: dict | None = None, pretrained: str | None = None, pretrained_layers: int | None = None,
              progress: bool = True, data_root: str | None = None) -> dict:
    """``seqenc train``: value sequences of a catalogue task from the data already ingested under
    ``data_root`` (default ``workdir/data``; ``s3://bucket/prefix`` too), then one training job.
    ``config``: ``{"model": {...}, "train": {...}}`` overrides on top of the task's own ``config``."""
    config = config or {}
    unknown = set(config) - {"model", "train"}
    if unknown:
        raise ValueError(f"unknown config sections {sorted(unknown)}; use 'model' and 'train'")
    deepspeed = config.get("train", {}).get("deepspeed")
    rank, world = data_parallel(deepspeed)
    # every rank builds its share of the value sequences; rank 0 writes the task's files
    stage_sequences(workdir, task, size, seed, pretrained=pretrained, model_overrides=config.get("model"),
                    data_root=data_root, progress=progress, rank=rank, world=world)
    if world > 1:  # the other ranks read what rank 0 wrote (value sequences, vocabulary, splits)
        from training.engine.deepspeed_engine import barrier

        barrier()
    return stage_train(workdir, task.name, size, seed, progress=progress, pretrained=pretrained,
                       pretrained_layers=pretrained_layers, mode=mode, train_overrides=config.get("train"),
                       model_overrides=config.get("model"), data_root=data_root)


# --- 5. score ---------------------------------------------------------------------------------
def stage_score(workdir: str, task_name: str, split: str = "test", progress: bool = True,
                ingest_date: str | None = None, data_root: str | None = None,
                predictions_root: str | None = None) -> dict:
    """Score the sequences of one split with the saved bundle into a predictions Parquet, and
    the task's metrics on its labelled ones (training.serving.evaluate). ``data_root`` (default
    ``<workdir>/data``) and ``predictions_root`` (default ``<workdir>/predictions``; the file is
    ``<predictions_root>/<task>/<split>.parquet``) may be ``s3://bucket/prefix``
    (parsers.objectstore); the bundle and the value sequences stay in the local workdir."""
    spec, classes = read_task(sequences_dir(workdir, task_name))
    model_dir = Path(workdir) / "models" / task_name / "bundle"
    split_df = pl.read_parquet(sequences_dir(workdir, task_name) / "splits.parquet")
    chosen = split_df.filter(pl.col("split") == split)
    root = objectstore.as_path(data_root) if data_root else Path(workdir) / "data"
    objects = read_task_objects(root, spec, ingest_date)
    objects = objects.join(chosen.select("sequence_id"), on="sequence_id", how="semi")
    bundle = load_bundle(model_dir)  # loaded once: scoring and the run id both read it
    predictions = score_objects(bundle, objects, progress=progress)
    predictions = predictions.join(chosen.select("sequence_id", "label"), on="sequence_id", how="left")
    meta = bundle[2]
    predictions = predictions.with_columns(pl.lit(meta["mlflow_run_id"]).alias("mlflow_run_id"))
    out = objectstore.as_path(predictions_root) if predictions_root else Path(workdir) / "predictions"
    path = out / task_name / f"{split}.parquet"
    storage.write_parquet_atomic(predictions, path)
    metrics = prediction_metrics(predictions, spec, classes)
    return {"predictions": str(path), "rows": predictions.height, "metrics": metrics}


# --- the whole job ----------------------------------------------------------------------------
def run_demo(out_dir: str, size: str = "demo", seed: int = 0, progress: bool = True,
             pretrained: str | None = None, pretrained_layers: int | None = None, catalog=None) -> dict:
    """Every task of the catalogue (default: the shipped one) on the built-in data its sources'
    ``demo_generator`` writes: generate, ingest, sequences, train, score; plus each task's floor
    on its test split (flag-all or the train majority; none for next_item), the count
    baseline of each task on the same split (training.serving.evaluate.count_baseline_metrics) and, for
    next_item tasks, the ranking of each sequence's own items (history_rank_metrics)."""
    t0 = time.time()
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    catalog = load_catalog(catalog)
    raw = stage_generate(str(out), size, seed, catalog)
    shutil.rmtree(out / "data", ignore_errors=True)  # re-running the demo replaces its data partitions
    ingest = {name: stage_ingest(str(out), name, files["path"], files["labels"], catalog=catalog)
              for name, files in raw.items()}
    summary = {"metrics": {}, "floors": {}, "baselines": {}, "history_baselines": {}, "run_ids": [], "predictions": [],
               "ingest": {}, "test_metrics_from_predictions": {},
               "seed": seed, "torch_threads": torch.get_num_threads()}  # a seed reproduces on the same thread count
    for task in specs_of(catalog):
        task_name = task.name
        if task.source not in ingest:
            log.warning("demo: task %s skipped: its source %s has no demo_generator", task_name, task.source)
            continue
        summary["ingest"][task_name] = ingest[task.source]["report"]
        date = ingest[task.source]["ingest_date"]
        stage_sequences(str(out), task, size, seed, ingest_date=date, pretrained=pretrained)
        trained = stage_train(str(out), task_name, size, seed, progress=progress, pretrained=pretrained,
                              pretrained_layers=pretrained_layers)
        scored = stage_score(str(out), task_name, progress=progress, ingest_date=date)
        summary["metrics"][task_name] = trained["metrics"]["test"]
        if trained["metrics"]["floor"]:  # flag-all / train majority on the test split (split_floors)
            summary["floors"][task_name] = trained["metrics"]["floor"]["test"]
        summary["baselines"][task_name] = count_baseline_metrics(str(out), task_name, seed)
        if task.kind_spec.baseline == "own_items":  # the sequence's own items, most frequent first: no training
            summary["history_baselines"][task_name] = history_rank_metrics(str(out), task_name)
        summary["run_ids"].append(trained["run_id"])
        summary["predictions"].append(scored["predictions"])
        summary["test_metrics_from_predictions"][task_name] = scored["metrics"]
    summary["mlflow_tracking_uri"] = tracking.tracking_uri(out)
    summary["seconds"] = round(time.time() - t0, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
