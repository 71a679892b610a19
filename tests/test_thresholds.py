"""Binary threshold rules (training.tasks.thresholds): the dev-best threshold sits on a cliff when dev
has few positives; the one-standard-error rule steps back to the model's own 0.5 there and
follows the best where dev is large; the rules are compared on dev alone (cv_f1)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import f1_score

from training.engine.trainer import TrainConfig
from training.tasks.thresholds import (
    DEFAULT_RULE,
    THRESHOLD_RULES,
    best_f1,
    check_rule,
    cv_f1,
    fit_threshold,
    one_se,
    rule_fields,
)


def _scores(n_pos: int, n_neg: int, seed: int, separation: float = 4.0):
    """Logits: negatives ~ N(-3, 1), positives ~ N(-3 + separation, 1); -> (y, P(positive))."""
    rng = np.random.default_rng(seed)
    logits = np.concatenate([rng.normal(-3 + separation, 1.0, n_pos), rng.normal(-3, 1.0, n_neg)])
    y = np.concatenate([np.ones(n_pos, int), np.zeros(n_neg, int)])
    return y, 1 / (1 + np.exp(-logits))


def test_best_f1_hugs_the_cliff_and_one_se_steps_back():
    """A checkout-like dev: 8 positives scored 0.9991-0.9999, one negative at 0.999, the rest
    below 0.4. The best threshold is the lowest positive's score (the cliff: dev F1 1.0); a new
    draw of positives a little lower is all missed there. With 8 positives the one-SE band is
    wide (F1 >= 0.89), 0.5 (dev F1 0.94) is in it, and it catches them."""
    y = np.array([1] * 8 + [0] * 201)
    negatives = np.concatenate([np.linspace(0.001, 0.4, 200), [0.999]])
    p = np.concatenate([np.linspace(0.9991, 0.9999, 8), negatives])
    cliff = best_f1(y, p)
    assert cliff == pytest.approx(0.9991) and f1_score(y, p >= cliff) == 1.0
    assert one_se(y, p) == 0.5
    p_next = np.concatenate([np.linspace(0.95, 0.999, 8), negatives])  # the next draw
    assert f1_score(y, p_next >= cliff) == 0.0 and f1_score(y, p_next >= 0.5) > 0.9


def test_one_se_follows_the_best_on_a_large_dev():
    """Thousands of positives: the band is narrow, 0.5 is outside it when the best lies far
    away, and the rule's threshold scores within the band of the best."""
    y, p = _scores(3000, 3000, seed=0, separation=3.0)
    p = p ** 0.05  # every score squeezed towards 1: 0.5 flags everything
    best, chosen = best_f1(y, p), one_se(y, p)
    assert chosen != 0.5
    f_best, f_chosen = f1_score(y, p >= best), f1_score(y, p >= chosen)
    adjusted = (f_best * 3000 + 2) / 3004
    assert f_chosen >= f_best - np.sqrt(adjusted * (1 - adjusted) / 3004) - 1e-12
    assert f1_score(y, p >= 0.5) < f_chosen - 0.1


def test_a_score_without_a_decision_of_its_own_takes_the_band_median():
    """A combined surprise score lies at 0.5 or above for nearly every sequence. Pivoting at 0.5
    took the band's lowest threshold -- the most flags the band allows; with no pivot (None) the
    rule takes the band's median threshold: above the lowest, at or below the best's cliff, its
    dev F1 inside the band. best_f1 and half ignore the pivot."""
    y, p = _scores(30, 400, seed=3, separation=3.5)
    p = 0.5 + 0.5 * p  # every score at 0.5 or above: 0.5 flags all
    lowest, median, best = one_se(y, p), one_se(y, p, pivot=None), best_f1(y, p)
    assert f1_score(y, p >= 0.5) < 0.2
    assert lowest < median <= best
    assert (p >= median).sum() < (p >= lowest).sum()
    f_best = f1_score(y, p >= best)
    adjusted = (f_best * 30 + 2) / 34
    assert f1_score(y, p >= median) >= f_best - np.sqrt(adjusted * (1 - adjusted) / 34) - 1e-12
    assert fit_threshold("one_se", y, p, None) == median
    assert best_f1(y, p, None) == best and fit_threshold("half", y, p, None) == 0.5
    fields = rule_fields(y, p, y, p, pivot=None)
    assert fields["f1_one_se"] == pytest.approx(f1_score(y, p >= median))


def test_a_dev_without_positives_keeps_the_decision_or_flags_only_above_dev():
    """No dev positive, no F1 to read: a probability keeps its own 0.5; a combined surprise score
    (no decision of its own, nearly everything at 0.5 or above) flags only what scores above
    every dev sequence, where 0.5 would flag them all."""
    y = np.zeros(200, int)
    p = 0.5 + 0.5 * np.random.default_rng(0).random(200)
    assert one_se(y, p) == 0.5 and best_f1(y, p) == 0.5
    for rule in ("one_se", "best_f1"):
        cut = fit_threshold(rule, y, p, None)
        assert (p >= cut).sum() == 0 and cut == pytest.approx(p.max())
        assert np.array([p.max() * 1.001]) >= cut


def test_rules_registry_and_config():
    assert set(THRESHOLD_RULES) == {"best_f1", "one_se", "half"}
    assert fit_threshold("half", np.array([0, 1]), np.array([0.2, 0.9])) == 0.5
    assert best_f1(np.zeros(5, int), np.linspace(0, 1, 5)) == 0.5 and one_se(np.zeros(5, int), np.ones(5)) == 0.5
    with pytest.raises(ValueError, match="unknown threshold rule 'oracle'"):
        check_rule("oracle")
    with pytest.raises(ValueError, match="threshold rule"):
        TrainConfig(threshold_rule="oracle")
    assert TrainConfig(threshold_rule="one_se").threshold_rule == "one_se"


def test_cv_f1_reads_dev_alone_and_is_repeatable():
    """Fit on one stratified half, score on the other: the rule that hugs the cliff of a small
    dev scores lower there than the one that steps back; the same seed gives the same figure."""
    y, p = _scores(12, 300, seed=3, separation=4.5)
    assert cv_f1("best_f1", y, p) == cv_f1("best_f1", y, p)
    assert cv_f1("one_se", y, p) >= cv_f1("best_f1", y, p) - 0.02
    assert cv_f1("half", np.array([1, 0, 0, 0]), np.array([0.9, 0.1, 0.2, 0.3])) is None  # one positive
    fields = rule_fields(y, p, y, p)
    assert set(fields) == {f"{k}{r}" for r in THRESHOLD_RULES for k in ("dev_cv_f1_", "f1_")}
    assert fields["f1_best_f1"] == pytest.approx(f1_score(y, p >= best_f1(y, p)))


def test_the_catalogue_names_the_rules():
    from training.tasks.catalog import Task, Threshold

    assert Task(source="s", kind="binary", positive="x").threshold_policy() == {"policy": DEFAULT_RULE}
    for rule in THRESHOLD_RULES:
        assert Task(source="s", kind="binary", positive="x", threshold=Threshold(policy=rule)).threshold_policy() \
            == {"policy": rule}
    with pytest.raises(ValueError, match="does not apply to a binary task"):
        Task(source="s", kind="binary", positive="x", threshold=Threshold(policy="contamination", share=0.1))
    with pytest.raises(ValueError, match="does not apply to a anomaly task"):
        Task(source="s", kind="anomaly", threshold=Threshold(policy="one_se"))


def _catalog() -> str:
    """The checkout source of tests/test_window_threshold.py, with a binary task on it."""
    from test_window_threshold import CATALOG

    source = CATALOG[:CATALOG.index("[tasks.")]
    return source + '''[tasks.checkout_fraud]
source = "checkout"
kind = "binary"
positive = "fraud"
size = "tiny"
threshold = {policy = "one_se"}
config = {train = {tvm_ka_ratio = 0.1, checkpoint_every = 0}}
'''


def test_a_binary_task_fits_its_rule_on_dev_and_the_threshold_carries_to_the_next_day(tmp_path):
    """The checkout stream (fraud only in the amounts, tests/test_window_threshold.py) as a
    binary task with ``threshold = {policy = "one_se"}``: the bundle's threshold is that rule
    fitted on the dev sessions' scores (with about ten dev positives: 0.5 here, where the dev-best
    threshold sits on its lowest positive), and it catches the next day's fraud."""
    import json

    import polars as pl
    from test_window_threshold import _stream

    from parsers import storage
    from training.cli.main import main
    from training.pipeline.stages import sequences_dir
    from training.serving.scoring import score_objects

    catalog = tmp_path / "seqenc.toml"
    catalog.write_text(_catalog())
    work = tmp_path / "work"
    root = work / "data"
    _stream(tmp_path / "d1.jsonl", tmp_path / "d1.csv", "2025-04-01", 600, 0, 1.0)
    _stream(tmp_path / "d2.jsonl", tmp_path / "d2.csv", "2025-04-02", 600, 100, 1.0)

    def ingest(d: str, day: str) -> None:
        assert main(["ingest", "events", str(tmp_path / f"{d}.jsonl"), "--root", str(root), "--source", "checkout",
                     "--catalog", str(catalog), "--labels", str(tmp_path / f"{d}.csv"), "--date", day]) == 0

    ingest("d1", "2025-04-01")
    assert main(["train", "--catalog", str(catalog), "--task", "checkout_fraud", "--workdir", str(work),
                 "--no-progress"]) == 0
    ingest("d2", "2025-04-02")
    bundle = work / "models" / "checkout_fraud" / "bundle"
    threshold = json.loads((bundle / "metadata.json").read_text())["threshold"]
    dev = pl.read_parquet(sequences_dir(work, "checkout_fraud") / "splits.parquet").filter(pl.col("split") == "dev")
    day1 = score_objects(bundle, storage.read_objects(root, "checkout", "2025-04-01"), progress=False)
    truth1 = dict(pl.read_csv(tmp_path / "d1.csv").iter_rows())
    scored = day1.filter(pl.col("sequence_id").is_in(dev["sequence_id"].implode()))
    y_dev = np.array([truth1[s] == "fraud" for s in scored["sequence_id"]], dtype=int)
    assert 5 <= y_dev.sum() <= 20  # a small dev: the case the rule is for
    assert threshold == pytest.approx(one_se(y_dev, scored["score"].to_numpy()), abs=1e-6)
    day2 = score_objects(bundle, storage.read_objects(root, "checkout", "2025-04-02"), progress=False)
    truth2 = dict(pl.read_csv(tmp_path / "d2.csv").iter_rows())
    y2 = np.array([truth2[s] == "fraud" for s in day2["sequence_id"]], dtype=int)
    f1 = f1_score(y2, day2["score"].to_numpy() >= threshold)
    floor = f1_score(y2, np.ones_like(y2))  # flag every session
    assert f1 > max(0.6, 3 * floor), (f1, floor)
