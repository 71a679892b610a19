"""Every trained figure beside its floor (training.tasks.metrics.split_floors): flag-all for a
binary task, the train split's majority class for a C-way one, and a warning when the dev
headline does not beat it."""

import numpy as np
import pytest

from training.tasks.metrics import below_floor, split_floors, task_metrics


def _splits(n_train, n_dev, n_test):
    ids = np.arange(n_train + n_dev + n_test)
    return {"train": ids[:n_train], "dev": ids[n_train:n_train + n_dev], "test": ids[n_train + n_dev:]}


def test_a_binary_floor_is_flagging_every_labelled_sequence():
    y = np.array([0, 1, 0, 0] + [1, 0, 0, 0, -1] + [1, 1, 0, 0])  # one dev row unlabelled
    floors = split_floors(y, _splits(4, 5, 4), "binary")
    p = 1 / 4  # dev: 1 positive of 4 labelled
    assert floors["dev"]["f1"] == pytest.approx(2 * p / (1 + p))
    assert floors["dev"]["precision"] == pytest.approx(p) and floors["dev"]["recall"] == 1.0
    assert floors["test"]["f1"] == pytest.approx(2 * 0.5 / 1.5)


def test_a_multiclass_floor_predicts_the_train_majority_not_the_split_s_own():
    y = np.array([2, 2, 2, 0, 1] + [0, 0, 0, 2] + [1, 2])
    floors = split_floors(y, _splits(5, 4, 2), "multiclass")
    assert floors["dev"] == task_metrics(np.array([0, 0, 0, 2]), np.full(4, 2), "multiclass")
    assert floors["dev"]["micro_f1"] == pytest.approx(0.25)  # class 2, dev's minority
    assert split_floors(y, _splits(5, 4, 2), "next_item") == {}  # a ranking has no constant floor
    assert split_floors(np.full(11, -1), _splits(5, 4, 2), "binary") == {}  # no labels


def test_a_dev_figure_at_its_floor_is_told_and_one_above_it_is_not():
    """The case that found it: a balanced binary task whose threshold slid to calling most
    sequences positive (docs/tables.md, "Table tasks")."""
    floors = {"dev": {"f1": 0.673, "micro_f1": 0.507, "macro_f1": 0.336}}
    warning = below_floor({"dev": {"f1": 0.668, "macro_f1": 0.50}}, floors, "binary")
    assert "0.668 does not beat flagging every sequence (0.673)" in warning and "multiclass" in warning
    assert below_floor({"dev": {"f1": 0.80}}, floors, "binary") is None
    told = below_floor({"dev": {"macro_f1": 0.30}}, floors, "multiclass")
    assert "most frequent class (0.336)" in told and "kind =" not in told
    assert below_floor({"dev": {}}, {}, "binary") is None
    anomaly = below_floor({"dev": {"f1": 0.5}}, floors, "binary", declared="anomaly")  # a binary head, no advice
    assert "flagging every sequence" in anomaly and "multiclass" not in anomaly


def test_one_constant_rule_and_seqenc_evaluate_s_floor_without_a_train_split():
    """constant_class is the one rule behind every floor (trainings, bench accuracy's
    always_positive, the depth study); ``seqenc evaluate`` on data without the model's train split
    takes the evaluated rows' own majority and says so."""
    import polars as pl

    from training.serving.evaluate import prediction_floor
    from training.tasks.catalog import parse_catalog
    from training.tasks.metrics import constant_class

    assert constant_class(np.array([0, 0, 1]), "binary") == 1  # flag-all whatever the shares
    assert constant_class(np.array([2, 1, 1, 2]), "multiclass") == 1  # a tie goes to the lower index
    with pytest.raises(ValueError, match="labelled train rows"):
        constant_class(np.array([], dtype=np.int64), "multiclass")
    catalog = parse_catalog({"sources": {"s": {"kind": "events"}},
                             "tasks": {"t": {"source": "s", "kind": "multiclass"}}})
    task, classes = catalog.task("t"), ["a", "b", "c"]
    predictions = pl.DataFrame({"sequence_id": ["1", "2", "3", "4"], "prediction": ["a", "a", "b", "c"],
                                "score": [0.5] * 4, "label": ["c", "c", "b", None]})
    own = prediction_floor(predictions, task, classes)
    assert own["rule"] == "majority of the evaluated rows" and own["micro_f1"] == pytest.approx(2 / 3)
    trained = prediction_floor(predictions, task, classes, train_labels=["b", "b", "a"])
    assert trained["rule"] == "train majority" and trained["micro_f1"] == pytest.approx(1 / 3)
