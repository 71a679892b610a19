"""Model bundles and batch scoring, for every training mode.

A model bundle is one directory: ``config.json`` + ``model.safetensors`` + ``architecture.json``
(which model class it holds and that class's options, see
:meth:`seqenc.model.SaveLoadMixin.save_pretrained`), ``tokenizer.json`` (with
``numeric_bins.json`` beside it when the tokenizer has numeric bins) and ``metadata.json``
(task, training mode, decision threshold, how the objects became the model's input --
``event_key``, ``exclude_keys`` --, and the fitted ``surprise`` scorer when the model was
trained with ``surprise_scoring``, seqenc.surprise; value-link markers, seqenc.links, live in
``tokenizer.json``), and ``train_sequences.safetensors``: 64-bit hashes of the ids of the
sequences it trained on (:func:`id_hashes`; not the ids themselves), so a scored day can say how
many of its sequences the model read (:func:`trained_id_hashes`, :func:`read_in_training`). Nothing in it is pickled. Saved bundles are versions
(:func:`save_bundle`): ``models/<task>/bundle`` is a link to ``models/<task>/bundle.versions/<n>``,
a folder never written again, so a scorer never reads a bundle that training is replacing.

Every mode's bundle loads (:func:`load_bundle`) and scores (:func:`score_objects`) the same way;
the one difference is the input each model reads, built by the functions training built it with:

* ``interleaved`` / ``no_interleave`` (:class:`~seqenc.model.TVMKA`): S(k) windows, KRs batched by
  length, then the KA (seqenc.inference.predict_proba), plus the surprise when trained with it;
* ``unlabelled`` (:class:`~seqenc.model.TVMKA`, training.engine.unlabelled): the same windows, scored by
  the TVM's masked-LM surprise alone: the bundle's scorer has no KA line
  (``metadata.json``: ``surprise.ka_centre`` null), so the untrained KA is never run;
* ``joint`` (:class:`~seqenc.baselines.JointTVMKA`): the same windows, one batch of sequences at
  a time through its end-to-end forward;
* ``flattened`` / ``record_view`` (:class:`~seqenc.baselines.FlattenedEncoder`,
  :class:`~seqenc.baselines.RecordViewEncoder`): the tokenised objects
  (seqenc.baselines.ObjectSequences), cut by the model's own ``batch_inputs`` exactly as in
  training (its limits are saved with it: ``max_positions`` in config.json, the record view's
  ``max_object_tokens`` in architecture.json).

The same code serves the demo, ``seqenc score`` (training.serving.batch_score), the MLflow pyfunc
(training.serving.mlflow_model) and champion promotion (training.pipeline.nightly).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import polars as pl
from torch import nn

from parsers import atomic
from seqenc.baselines import (
    END_TO_END_MODELS,
    MODEL_CLASSES,
    FlattenedEncoder,
    ObjectSequences,
    RecordViewEncoder,
    end_to_end_proba,
    load_pretrained,
)
from seqenc.inference import model_device, predict_proba
from seqenc.model import read_architecture
from seqenc.sequences import collect_value_sequences, item_histories, tokenize_value_sequences
from seqenc.surprise import SurpriseScorer, key_surprise
from seqenc.table_model import TABLE_MODELS, TableExamples
from seqenc.tokenizer import ValueTokenizer
from training.engine.engines import training_device
from training.engine.modes import MODES
from training.serving.registry import BUNDLE_FILES
from training.tasks.kinds import get_kind
from training.tasks.metrics import predict
from training.tasks.task_data import keyed_objects

log = logging.getLogger(__name__)

TRAINED_IDS_FILE = "train_sequences.safetensors"  # optional (bundles before it lack it): see read_in_training
END_TO_END_BATCH = 32  # sequences per forward pass of an end-to-end model (its trainer evaluates 2 x 16)


class Bundle(NamedTuple):
    """A loaded bundle; unpacks as ``model, tok, meta``."""

    model: nn.Module  # TVMKA, JointTVMKA, FlattenedEncoder or RecordViewEncoder, in eval mode
    tok: ValueTokenizer
    meta: dict


def id_hashes(ids) -> np.ndarray:
    """Sorted, distinct 64-bit hashes (BLAKE2b) of sequence ids: what a bundle keeps of the
    sequences it trained on. Hashes, not ids: 8 bytes a sequence whatever the id, and a bundle
    handed on does not list the user's block or session names."""
    digests = {hashlib.blake2b(str(i).encode(), digest_size=8).digest() for i in ids}
    return np.sort(np.frombuffer(b"".join(digests), dtype="<i8")) if digests else np.zeros(0, dtype="<i8")


def trained_id_hashes(directory: str | Path) -> np.ndarray | None:
    """The :func:`id_hashes` of the training split a bundle at ``directory`` keeps
    (:data:`TRAINED_IDS_FILE`); None for a bundle saved without them. Read once per scoring run."""
    path = Path(directory) / TRAINED_IDS_FILE
    if not path.is_file():
        return None
    from safetensors.numpy import load_file

    return load_file(path)["id_hashes"]


def read_in_training(trained: np.ndarray, ids) -> int:
    """How many of ``ids`` (a scored day's sequence ids) are among ``trained``
    (:func:`trained_id_hashes`).

    Why (issue 50): the README's flows score the days they trained on, and a sequence the model
    read in training is scored in-sample -- an anomaly the masked LM learned looks less surprising
    (logins trial: 17 of 35 anomalies flagged on the training day, 18 of 20 on the next), a
    labelled one was fitted. ``seqenc score`` reports the count and says so."""
    return int(np.isin(id_hashes(ids), trained, assume_unique=True).sum()) if len(ids) else 0


def save_bundle(model: nn.Module, tok: ValueTokenizer, metadata: dict, directory: str | Path,
                trained_ids=None) -> Path:
    """Any of the MODEL_CLASSES with its tokenizer and metadata (see the module docstring), as a
    new version: ``<directory>.versions/<n>``, never written again, and ``directory`` a link to
    it (parsers.atomic.write_version). ``trained_ids``: the ids of the training split's sequences
    (kept as :func:`id_hashes`). Returns the version's folder."""
    if type(model).__name__ not in MODEL_CLASSES:
        raise TypeError(f"a bundle holds one of {sorted(MODEL_CLASSES)}, not a {type(model).__name__}")

    def write(folder: Path) -> None:
        model.save_pretrained(folder, extra=metadata)
        tok.save(folder / "tokenizer.json")
        if trained_ids is not None:
            from safetensors.numpy import save_file

            save_file({"id_hashes": id_hashes(trained_ids)}, str(folder / TRAINED_IDS_FILE))

    return atomic.write_version(directory, write)


def load_bundle(directory: str | Path, device: str = "cpu") -> Bundle:
    """The model of whichever class the bundle's ``architecture.json`` names (safetensors + JSON
    only), its tokenizer and metadata. A bundle whose metadata names a training mode of another
    architecture is refused. ``device`` is where the model goes (training.engine.engines.training_device:
    ``auto``, ``cpu``, ``cuda``, ...); scoring batches follow it (seqenc.inference.to_model).
    ``directory`` is resolved once (a link to a saved version, see :func:`save_bundle`), so every
    file comes from the same version even if a newer one is saved while this loads."""
    directory = Path(os.path.realpath(directory))
    for name in BUNDLE_FILES:
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory} is not a seqenc model bundle: {name} is missing")
    meta = json.loads((directory / "metadata.json").read_text())
    held, mode = read_architecture(directory)["class"], MODES.get(meta.get("mode"))  # training.engine.modes
    names = list(mode.architectures) if mode is not None else []
    if mode is not None and held in MODEL_CLASSES and held not in names:  # unknown: load_pretrained says
        raise ValueError(f"{directory}: metadata.json says mode {meta['mode']!r} ({' or '.join(names)}), but "
                         f"architecture.json names a {held}")
    model = load_pretrained(directory).to(training_device(device))
    model.eval()
    log.info("loaded %s (%s, mode %s) from %s on %s", type(model).__name__, model.config.task, meta.get("mode"),
             directory, model_device(model))
    return Bundle(model, ValueTokenizer.from_file(directory / "tokenizer.json"), meta)


def model_inputs(bundle: Bundle, objects: pl.DataFrame):
    """Long-form objects -> what the bundle's model reads, as training built it: the S(k)
    windows (seqenc.sequences.TokenizedSequences) or the tokenised objects
    (seqenc.baselines.ObjectSequences) of every sequence."""
    model, tok, meta = bundle
    objects = keyed_objects(objects, meta.get("keep_keys"), bool(meta.get("event_key")))  # as training read them
    exclude_keys = tuple(meta.get("exclude_keys", ()))
    if isinstance(model, FlattenedEncoder | RecordViewEncoder):
        return ObjectSequences.from_objects(objects, tok, exclude_keys)
    if isinstance(model, TABLE_MODELS):  # a table task's objects, joined as training joined them
        return TableExamples.from_objects(objects.filter(~pl.col("key").is_in(list(exclude_keys))))
    config = model.config
    value_seqs = collect_value_sequences(objects, exclude_keys)
    data = tokenize_value_sequences(value_seqs, tok, config.max_positions, config.long_sequences, config.max_windows)
    if config.item_history:  # next_item: the head reads each sequence's own items (seqenc.heads)
        if not meta.get("item_key"):
            raise ValueError("the model reads the item history but its metadata names no item_key: retrain it")
        data.item_history = item_histories(value_seqs, data.sequence_ids, meta["item_key"], config.class_names)
    return data


def model_probabilities(bundle: Bundle, objects: pl.DataFrame, progress: bool = True) -> tuple[list[str], np.ndarray]:
    """(sequence ids, class probabilities [n_sequences, n_classes]) of the sequences in ``objects``."""
    model, tok, meta = bundle
    data = model_inputs(bundle, objects)
    if isinstance(model, END_TO_END_MODELS):  # JointTVMKA first: it is a TVMKA too
        return list(data.sequence_ids), end_to_end_proba(model, data, tok, END_TO_END_BATCH, progress)
    if not meta.get("surprise"):
        return list(data.sequence_ids), predict_proba(model, data, tok.pad_id, progress=progress)
    # trained with surprise_scoring (combine with the KA as the trainer did) or without labels
    # (training.engine.unlabelled: a scorer with no KA line, the KA untrained and never run)
    scorer = SurpriseScorer.from_dict(meta["surprise"])
    stats = key_surprise(model.tvm, data, tok.mask_id, tok.val_sep_id, tok.pad_id, tok.marker_kinds,
                         progress=progress, stride=scorer.stride)
    probs = predict_proba(model, data, tok.pad_id, progress=progress) if scorer.uses_ka else None
    return list(data.sequence_ids), scorer.combine(probs, stats, data)


TOP_ITEMS = 10  # next_item: ranked items per sequence in a predictions file (recall@1/5/10)
WINDOW_MIN = 20  # an anomaly bundle's window rule needs this many scores; a smaller day borrows the reference's
REFERENCE_KEEP = 200  # at most this many of the training reference's scores kept in a bundle (reference_scores)
DRIFT_PERCENTILE = 80  # a day whose median score sits this high among the reference's gets a drift warning


def window_rule(task) -> dict | None:
    """How an ``anomaly`` task's bundle flags a scored window (a day's partition) instead of with
    the threshold fitted at training, whose scores a new stream need not share (issue 50: a stream
    nothing was tuned on was ranked well, ROC AUC 0.97, and flagged 0 of 2,000):

    * the catalogue's ``contamination`` share, when the task gives one: the top share of the window;
    * a ``quantile`` policy -- a clean reference the user declared, or ``train_on = "normal"``'s
      default (its reference is the normal dev sequences): None, the trained threshold, a quantile
      of normal scores, which no share of anomalies in a scored day moves;
    * no threshold given: ``label_free``, a modified z-score above 3.5 among the window's scores
      (training.engine.unlabelled.label_free_threshold: median and MAD, robust to the anomalies in it,
      scores below 0 read as 0 and the spread at least that of calibrated tail scores, 0.713 nats,
      so neither the tail line's extrapolation nor a tight block of unsurprising scores sets it).

    None for every other kind (their threshold is fitted on labels)."""
    if task.kind != "anomaly":
        return None
    policy = task.threshold_policy()
    if policy["policy"] == "quantile":
        return None
    if task.threshold is None:
        return {"rule": "label_free"}
    return {"rule": "contamination", "share": policy["share"]}


def reference_scores(probs: np.ndarray) -> list[float]:
    """The training reference's scores as a bundle keeps them (``meta["reference_scores"]``): sorted,
    at most ``REFERENCE_KEEP`` (evenly spaced order statistics of a larger reference), so a day too
    small to read a distribution of its own is judged beside them (:func:`window_threshold`)."""
    probs = np.asarray(probs, dtype=np.float64)
    probs = np.sort(probs[~np.isnan(probs)])
    if len(probs) > REFERENCE_KEEP:
        probs = probs[np.linspace(0, len(probs) - 1, REFERENCE_KEEP).round().astype(int)]
    return [float(p) for p in probs]


def _kept_reference(meta: dict) -> np.ndarray:
    """The bundle's ``reference_scores`` (:func:`reference_scores`); empty for a bundle without them."""
    return np.asarray(meta.get("reference_scores") or [], dtype=np.float64)


def reference_percentile(meta: dict, scores: np.ndarray) -> float | None:
    """Where a scored day's median score sits among the training reference's scores, as a percentile
    (mid-rank: ties count half): about 50 for a day like the data the model was trained on, near
    100 when the day's values have drifted away from it. None without ``WINDOW_MIN`` scores on both
    sides (or a bundle that predates ``reference_scores``).

    Why (issue 50): on a day whose every amount had drifted x 1.6, the demo-size checkout model
    ranked fraud below chance (ROC AUC 0.45) and the label-free rule flagged 17 % -- drifted
    normal sessions; the day's median sat at the reference's 95th percentile (100th when trained
    on normal sessions only; 87th for the tiny model of tests/test_window_threshold.py), against
    20 and 40 on the undrifted second day of a print-job trial (docs/training.md, "Small days").
    A flagged share then says more about the drift than about single sequences, and ``seqenc
    score`` says so. ``DRIFT_PERCENTILE`` is a warning level, not a tuned
    constant: a day like the reference sits at 50 give or take 100 * sqrt(0.25 / n) for a reference of
    n scores (11 at n = 20, 6.5 at 60, 3.5 at 200), so 80 is 2.7 or more such errors above it."""
    reference = _kept_reference(meta)
    scores = np.asarray(scores, dtype=np.float64)
    if len(reference) < WINDOW_MIN or len(scores) < WINDOW_MIN:
        return None
    median = float(np.median(scores))
    return float(100.0 * (np.sum(reference < median) + 0.5 * np.sum(reference == median)) / len(reference))


def window_threshold(meta: dict, scores: np.ndarray) -> tuple[float, str]:
    """(threshold, what set it) for one scored window of a bundle (:func:`window_rule`).

    A window of fewer than ``WINDOW_MIN`` scores cannot show a distribution of its own, so the
    rule reads it together with the training reference's scores the bundle keeps
    (:func:`reference_scores`). Only when even those together are fewer than ``WINDOW_MIN`` (or the
    bundle predates them) does the threshold fitted at training apply. Why (issue 50): HealthApp_2k
    makes 18 windows of 600 s; its reference (dev) held 4, the trained threshold (top 5 % of 4
    scores) sat below the highest of them, and it flagged 6 of the 18 (33 %)."""
    from training.engine.unlabelled import LABEL_FREE_RULE, label_free_threshold, quantile_cut

    rule, trained = meta.get("window_rule"), float(meta.get("threshold", 0.5))
    scores = np.asarray(scores, dtype=np.float64)
    basis, whose = scores, "the window's scores"
    if rule is not None and len(scores) < WINDOW_MIN:
        reference = _kept_reference(meta)
        basis = np.concatenate([scores, reference])
        whose = f"the window's {len(scores)} scores and the training reference's {len(reference)}"
    if rule is None or len(basis) < WINDOW_MIN:
        why = "the threshold fitted at training"
        policy = meta.get("threshold_policy") or {}
        if rule is not None:
            why += f" (fewer than {WINDOW_MIN} sequences scored)"
        elif policy.get("policy") == "quantile":
            why += f": the {policy['q']} quantile of the training reference's scores"
        return trained, why
    if rule["rule"] == "contamination":
        return quantile_cut(basis, 1.0 - rule["share"]), f"the top {rule['share']} of {whose}"
    return label_free_threshold(basis), LABEL_FREE_RULE.replace("the reference scores", whose)


def score_objects(model_dir, objects: pl.DataFrame, progress: bool = True) -> pl.DataFrame:
    """Long-form objects -> one row per sequence: sequence_id, score, prediction, then
    prob_<class>... (binary, C-way) or top_items, top_scores (next_item).

    ``model_dir`` is a bundle directory or an already loaded :class:`Bundle` (or ``model, tok,
    meta`` triple) of any training mode. ``score`` is P(positive class) for a binary task and the
    winning class's probability otherwise; ``prediction`` is the class name (threshold from the
    bundle for binary tasks). For next_item a column per catalogue item would not scale (the
    paper's catalogue has 3,212 products), so the row carries the ``TOP_ITEMS`` best items, best
    first, and their probabilities.
    """
    bundle = Bundle(*model_dir) if isinstance(model_dir, tuple) else load_bundle(model_dir)
    config, meta = bundle.model.config, bundle.meta
    sequence_ids, probs = model_probabilities(bundle, objects, progress)
    pred = predict(probs, config.task, meta.get("threshold", 0.5))
    names = config.class_names or [str(i) for i in range(config.n_classes)]
    score = probs[:, 1] if config.task == "binary" else probs.max(axis=1)
    columns = {
        "sequence_id": sequence_ids,
        "score": score.astype(np.float64),
        "prediction": [names[i] for i in pred],
    }
    if get_kind(config.task).ranks_items:
        top = np.argsort(-probs, axis=1, kind="stable")[:, :TOP_ITEMS]
        columns["top_items"] = [[names[i] for i in row] for row in top]
        columns["top_scores"] = np.take_along_axis(probs, top, axis=1).astype(np.float64).tolist()
        return pl.DataFrame(columns, schema_overrides={"top_items": pl.List(pl.String),
                                                       "top_scores": pl.List(pl.Float64)})
    for i, name in enumerate(names):
        columns[f"prob_{name}"] = probs[:, i].astype(np.float64)
    return pl.DataFrame(columns)
