"""Model bundles and batch scoring.

A model bundle is one directory: ``config.json`` + ``model.safetensors`` (the TVM-KA weights,
see :meth:`seqenc.model.TVMKA.save_pretrained`), ``tokenizer.json`` (with ``numeric_bins.json``
beside it when the tokenizer has numeric bins) and ``metadata.json``
(task, class names, decision threshold, keys left out of the value sequences, and the fitted
``surprise`` scorer when the model was trained with ``surprise_scoring``, seqenc.surprise;
value-link markers, seqenc.links, live in ``tokenizer.json``). Nothing in it is pickled. :func:`score_objects` turns long-form objects into predictions with it: the same code
serves the demo, the CLI and the Airflow tasks.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import polars as pl

from seqenc.inference import predict_proba
from seqenc.model import TVMKA
from seqenc.sequences import collect_value_sequences, tokenize_value_sequences, with_event_key
from seqenc.surprise import SurpriseScorer, key_surprise
from seqenc.tokenizer import ValueTokenizer
from training.metrics import predict

log = logging.getLogger(__name__)


def save_bundle(model: TVMKA, tok: ValueTokenizer, metadata: dict, directory: str | Path) -> Path:
    directory = Path(directory)
    model.save_pretrained(directory, extra=metadata)
    tok.save(directory / "tokenizer.json")
    return directory


def load_bundle(directory: str | Path) -> tuple[TVMKA, ValueTokenizer, dict]:
    directory = Path(directory)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "metadata.json"):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory} is not a seqenc model bundle: {name} is missing")
    model = TVMKA.from_pretrained(directory)
    model.eval()
    tok = ValueTokenizer.from_file(directory / "tokenizer.json")
    return model, tok, json.loads((directory / "metadata.json").read_text())


TOP_ITEMS = 10  # next_item: ranked items per sequence in a predictions file (recall@1/5/10)


def score_objects(model_dir, objects: pl.DataFrame, progress: bool = True) -> pl.DataFrame:
    """Long-form objects -> one row per sequence: sequence_id, score, prediction, then
    prob_<class>... (binary, C-way) or top_items, top_scores (next_item).

    ``model_dir`` is a bundle directory or an already loaded ``load_bundle`` triple. ``score``
    is P(positive class) for a binary task and the winning class's probability otherwise;
    ``prediction`` is the class name (threshold from the bundle for binary tasks). For next_item
    a column per catalogue item would not scale (the paper's catalogue has 3,212 products), so
    the row carries the ``TOP_ITEMS`` best items, best first, and their probabilities.
    """
    model, tok, meta = model_dir if isinstance(model_dir, tuple) else load_bundle(model_dir)
    config = model.config
    if meta.get("event_key"):
        objects = with_event_key(objects)
    sequences = collect_value_sequences(objects, tuple(meta.get("exclude_keys", ())))
    data = tokenize_value_sequences(sequences, tok, config.max_positions, config.long_sequences,
                                    config.max_windows)
    probs = predict_proba(model, data, tok.pad_id, progress=progress)
    if meta.get("surprise"):  # trained with surprise_scoring: combine as the trainer did
        stats = key_surprise(model.tvm, data, tok.mask_id, tok.val_sep_id, tok.pad_id, tok.marker_kinds,
                             progress=progress)
        probs = SurpriseScorer.from_dict(meta["surprise"]).combine(probs, stats, data)
    pred = predict(probs, config.task, meta.get("threshold", 0.5))
    names = config.class_names or [str(i) for i in range(config.n_classes)]
    score = probs[:, 1] if config.task == "binary" else probs.max(axis=1)
    columns = {
        "sequence_id": data.sequence_ids,
        "score": score.astype(np.float64),
        "prediction": [names[i] for i in pred],
    }
    if config.task == "next_item":
        top = np.argsort(-probs, axis=1, kind="stable")[:, :TOP_ITEMS]
        columns["top_items"] = [[names[i] for i in row] for row in top]
        columns["top_scores"] = np.take_along_axis(probs, top, axis=1).astype(np.float64).tolist()
        return pl.DataFrame(columns, schema_overrides={"top_items": pl.List(pl.String),
                                                       "top_scores": pl.List(pl.Float64)})
    for i, name in enumerate(names):
        columns[f"prob_{name}"] = probs[:, i].astype(np.float64)
    return pl.DataFrame(columns)
