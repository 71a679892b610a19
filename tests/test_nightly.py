"""training.pipeline.nightly's promotion rule and metric, and training.serving.registry's errors (the whole
nightly DAG, with a real registry, is in test_ops_dags.py)."""

from __future__ import annotations

import numpy as np
import pytest

from training.pipeline.nightly import decide, promotion_score, window_dates
from training.serving.registry import resolve_model
from training.tasks.spec import resolve_task


def test_promotion_only_on_improvement():
    assert decide(0.5, None) == (True, "no champion yet")
    assert decide(0.81, 0.80)[0] is True
    assert decide(0.80, 0.80)[0] is False  # a tie keeps the champion
    assert decide(0.79, 0.80)[0] is False
    assert decide(0.805, 0.80, min_delta=0.01)[0] is False  # better, but not by min_delta
    assert "does not beat champion 0.8000" in decide(0.79, 0.80)[1]


def test_promotion_metric_needs_no_threshold():
    y = np.array([0, 0, 1, 1])
    ranked = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.4, 0.6]])
    assert promotion_score("binary", y, ranked) == pytest.approx(1.0)  # perfect ranking at any threshold
    squeezed = np.array([[0.99, 0.01], [0.98, 0.02], [0.97, 0.03], [0.96, 0.04]])
    assert promotion_score("binary", y, squeezed) == pytest.approx(1.0)  # F1 at 0.5 would be 0
    y3 = np.array([0, 1, 2])
    assert promotion_score("multiclass", y3, np.eye(3)) == pytest.approx(1.0)


def test_window_dates():
    assert window_dates("2025-03-02", 3) == ["2025-02-28", "2025-03-01", "2025-03-02"]
    with pytest.raises(ValueError):
        window_dates("2025-03-02", 0)


def test_resolve_model_explains_what_it_wants(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a model URI"):
        resolve_model(tmp_path)


def test_a_source_never_ingested_is_told_apart_from_a_late_one(tmp_path):
    """The nightly DAG skips a task whose source this deployment never feeds, and fails one
    whose data is missing from the night's window."""
    from parsers import storage
    from training.pipeline.nightly import SourceNeverIngested, nightly_train

    with pytest.raises(SourceNeverIngested, match="'purchases' was ever ingested"):
        nightly_train(str(tmp_path), resolve_task(None, "next_item"), "2025-03-02")
    # an old day's partition: the source is fed, but not in the night's 7-day window
    storage.objects_path(tmp_path / "data", "purchases", "2025-01-01", "old.jsonl").parent.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="in the 7 days up to 2025-03-02") as caught:
        nightly_train(str(tmp_path), resolve_task(None, "next_item"), "2025-03-02")
    assert not isinstance(caught.value, SourceNeverIngested)
