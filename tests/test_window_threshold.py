"""Thresholds that transfer (issue 50, item 4): an ``anomaly`` task flags each scored window by
its own scores -- the catalogue's contamination share, or without one a label-free rule -- and
every scoring run says how many it flagged and why. End to end on an event stream written here,
whose anomalies live only in values, scored on a later day whose values have drifted."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from training.cli.main import main
from training.serving.scoring import (
    REFERENCE_KEEP,
    WINDOW_MIN,
    reference_percentile,
    reference_scores,
    window_rule,
    window_threshold,
)
from training.tasks.catalog import Task, Threshold


def test_the_window_rule_follows_the_catalogue():
    assert window_rule(Task(source="s", kind="anomaly")) == {"rule": "label_free"}
    given = Task(source="s", kind="anomaly", threshold=Threshold(policy="contamination", share=0.08))
    assert window_rule(given) == {"rule": "contamination", "share": 0.08}
    clean = Task(source="s", kind="anomaly", threshold=Threshold(policy="quantile", q=0.99))
    assert window_rule(clean) is None  # a clean reference the user declared: the trained threshold
    normal = Task(source="s", kind="anomaly", positive="alert", train_on="normal")  # a clean reference by default
    assert normal.threshold_policy() == {"policy": "quantile", "q": 0.99} and window_rule(normal) is None
    declared = Task(source="s", kind="anomaly", positive="alert", train_on="normal",
                    threshold=Threshold(policy="contamination", share=0.02))
    assert window_rule(declared) == {"rule": "contamination", "share": 0.02}
    assert window_rule(Task(source="s", kind="binary", positive="x")) is None


def test_a_window_threshold_follows_the_window_not_the_training():
    """Scores of a new stream all sit below the trained threshold: the trained one flags nothing,
    the window's rules flag its outliers (or its top share)."""
    rng = np.random.default_rng(0)
    logits = np.concatenate([rng.normal(1, 0.5, 950), rng.normal(9, 0.3, 50)])  # 5 % far (8 nats) above the rest
    scores = 1 / (1 + np.exp(-logits))
    trained = {"threshold": 0.99999}  # logit 11.5
    assert (scores >= window_threshold(trained, scores)[0]).sum() == 0
    clean = {**trained, "window_rule": None, "threshold_policy": {"policy": "quantile", "q": 0.99}}
    assert window_threshold(clean, scores) == (0.99999, "the threshold fitted at training: the 0.99 quantile of the "
                                                        "training reference's scores")
    cut, why = window_threshold({**trained, "window_rule": {"rule": "label_free"}}, scores)
    flagged = scores >= cut
    assert flagged[950:].all() and flagged[:950].mean() < 0.01 and "modified z-score" in why
    cut, why = window_threshold({**trained, "window_rule": {"rule": "contamination", "share": 0.1}}, scores)
    assert (scores >= cut).mean() == pytest.approx(0.1, abs=0.002) and "top 0.1" in why
    tied = np.concatenate([np.full(80, 0.01), scores[-20:]])  # most of a window at one score
    cut, _ = window_threshold({**trained, "window_rule": {"rule": "contamination", "share": 0.5}}, tied)
    assert (tied >= cut).sum() == 20  # the top half is asked for; the tied block is not flagged whole
    small = scores[:WINDOW_MIN - 1]  # too few to read a distribution, and no reference kept: the trained threshold
    assert window_threshold({**trained, "window_rule": {"rule": "label_free"}}, small) == \
        (0.99999, f"the threshold fitted at training (fewer than {WINDOW_MIN} sequences scored)")


def test_a_small_window_is_judged_beside_the_training_reference():
    """A day of a few sequences cannot show a distribution; the bundle keeps its training
    reference's scores and the rule reads the day with them (HealthApp_2k: 18 windows, whose
    trained threshold from 4 reference scores flagged a third of them)."""
    rng = np.random.default_rng(1)
    reference = 1 / (1 + np.exp(-np.concatenate([rng.normal(1, 0.5, 950), rng.normal(9, 0.3, 50)])))
    kept = reference_scores(np.concatenate([reference, [np.nan]]))  # a rank's unscored row is left out
    assert len(kept) == REFERENCE_KEEP and kept == sorted(kept) and kept[0] == reference.min() \
        and kept[-1] == reference.max()
    assert reference_scores(reference[:3]) == sorted(reference[:3].tolist())  # a small reference: all of it
    day = 1 / (1 + np.exp(-np.array([0.8, 1.2, 0.9, 1.1, 1.0, 0.7, 1.3, 1.0, 9.0])))
    meta = {"threshold": 1 / (1 + np.exp(1)), "window_rule": {"rule": "label_free"}}  # trained: flags all 9
    cut, why = window_threshold({**meta, "reference_scores": kept}, day)
    assert (day >= cut).tolist() == [False] * 8 + [True]  # only the one far above the rest
    assert f"the window's 9 scores and the training reference's {REFERENCE_KEEP}" in why
    share = {**meta, "window_rule": {"rule": "contamination", "share": 0.05}, "reference_scores": kept}
    cut, why = window_threshold(share, day)
    assert (day >= cut).tolist() == [False] * 8 + [True] and "top 0.05 of the window's 9 scores" in why
    tiny = {**meta, "reference_scores": kept[:3]}  # the day and the reference still too few: the trained one
    assert window_threshold(tiny, day)[0] == meta["threshold"]


def test_where_a_day_sits_among_the_reference_scores():
    """A day like the reference sits near its 50th percentile, a drifted one near its 100th; ties
    count half; too few scores on either side: None."""
    rng = np.random.default_rng(2)
    meta = {"reference_scores": reference_scores(rng.uniform(0, 1, 500))}
    assert 40 < reference_percentile(meta, rng.uniform(0, 1, 300)) < 60
    assert reference_percentile(meta, rng.uniform(0.9, 1.2, 300)) > 95
    assert reference_percentile({"reference_scores": [0.1] * 10 + [0.5] * 20}, np.full(30, 0.5)) == \
        pytest.approx(100 * (10 + 10) / 30)
    assert reference_percentile(meta, rng.uniform(0, 1, WINDOW_MIN - 1)) is None
    assert reference_percentile({}, rng.uniform(0, 1, 300)) is None


def _stream(path: Path, labels: Path, day: str, n: int, seed: int, scale: float) -> int:
    """Checkout sessions: the same actions every time; a fraudulent one (8 %) only pays an amount
    far outside the usual (values, not events, give it away). ``scale`` drifts every amount."""
    rng = random.Random(seed)
    events, rows, fraud = [], [], 0
    for i in range(n):
        sid, bad = f"{day}-s{i:04d}", rng.random() < 0.08
        fraud += bad
        for j, action in enumerate(["open", "view", "cart", "pay", "close"]):
            amount = rng.uniform(20, 60) * scale if not bad else rng.uniform(900, 1500)
            events.append({"session": sid, "at": f"{day}T{i % 24:02d}:{j:02d}:{rng.randint(0, 59):02d}Z",
                           "action": action, "amount": round(amount, 2), "device": rng.choice(["ios", "android"])})
        rows.append(f"{sid},{'fraud' if bad else 'ok'}\n")
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    labels.write_text("session,verdict\n" + "".join(rows))
    return fraud


CATALOG = '''
[sources.checkout]
kind = "events"
session_field = "session"
ts_field = "at"
label_id_column = "session"
label_column = "verdict"

[tasks.checkout_watch]
source = "checkout"
kind = "anomaly"
positive = "fraud"
size = "tiny"
config = {train = {tvm_ka_ratio = 0.1, checkpoint_every = 0}}
'''


def test_an_anomaly_task_flags_a_drifted_day_by_its_own_scores(tmp_path, capsys, caplog):
    """Trained on one day; a later day whose every amount drifted (x 1.6) gets a small share
    flagged by its own scores (the threshold fitted at training flagged 19 % of it, for a 5 %
    policy), and a day like the first gets its fraud flagged. The tiny model ranks the drifted
    day's fraud at ROC AUC ~0.87 but its top by drifted normal sessions, so only the undrifted day
    can show that what is flagged is fraud."""
    catalog = tmp_path / "seqenc.toml"
    catalog.write_text(CATALOG)
    work = tmp_path / "work"
    root = work / "data"
    _stream(tmp_path / "d1.jsonl", tmp_path / "d1.csv", "2025-04-01", 300, 0, 1.0)
    _stream(tmp_path / "d2.jsonl", tmp_path / "d2.csv", "2025-04-02", 300, 1, 1.6)
    fraud = _stream(tmp_path / "d3.jsonl", tmp_path / "d3.csv", "2025-04-03", 300, 2, 1.0)

    def ingest(d: str, day: str) -> None:
        assert main(["ingest", "events", str(tmp_path / f"{d}.jsonl"), "--root", str(root), "--source", "checkout",
                     "--catalog", str(catalog), "--labels", str(tmp_path / f"{d}.csv"), "--date", day]) == 0

    def score(day: str) -> tuple[pl.DataFrame, str]:
        capsys.readouterr()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="training.serving.batch_score"):
            assert main(["score", "--model", str(bundle), "--input", str(root), "--out", str(tmp_path / "pred"),
                         "--date", day, "--no-progress"]) == 0
        return pl.read_parquet(tmp_path / "pred" / f"date={day}" / "part-0.parquet"), capsys.readouterr().out

    ingest("d1", "2025-04-01")  # trained on the first day only; the others arrive later
    assert main(["train", "--catalog", str(catalog), "--task", "checkout_watch", "--workdir", str(work),
                 "--no-progress"]) == 0
    ingest("d2", "2025-04-02")
    ingest("d3", "2025-04-03")
    bundle = work / "models" / "checkout_watch" / "bundle"
    meta = json.loads((bundle / "metadata.json").read_text())
    assert meta["window_rule"] == {"rule": "label_free"}
    assert len(meta["reference_scores"]) == 60 and meta["reference_scores"] == sorted(meta["reference_scores"])

    drifted, out = score("2025-04-02")
    assert "flagged" in out and "modified z-score" in out  # every scoring run says what it flagged, and why
    flagged = drifted.filter(pl.col("label") == "fraud")
    assert 0 < flagged.height <= 0.1 * drifted.height, flagged.height  # a small share, not none, not a third
    assert flagged["score"].min() > drifted.filter(pl.col("label") != "fraud")["score"].max()  # the day's top
    assert "may have drifted" in caplog.text  # the day's median sits high among the training reference's

    same, out = score("2025-04-03")
    assert "may have drifted" not in caplog.text
    assert "in training" not in out and "in-sample" not in caplog.text  # no sequence of a later day was read

    # the training day: the sequences of its training split are scored in-sample, and the run says so
    trained = pl.read_parquet(work / "sequences" / "checkout_watch" / "splits.parquet").filter(pl.col("split") == "train")
    first, out = score("2025-04-01")
    assert 0 < trained.height < first.height
    assert f"; {trained.height} of the {first.height} in the model's training split (scored in-sample)" in out
    assert f"{trained.height} of {first.height} sequences were in the model's training split" in caplog.text
    truth = dict(pl.read_csv(tmp_path / "d3.csv").iter_rows())
    flagged = same.filter(pl.col("label") == "fraud")["sequence_id"].to_list()
    caught = sum(truth[s] == "fraud" for s in flagged)
    # 25 of 300 are fraud: a share near theirs is flagged (3, all fraud, under the spread floor of 1.5
    # nats; 33 with 18 fraud under the calibrated floor), mostly fraud
    assert 0 < len(flagged) <= 0.15 * same.height and caught / len(flagged) >= 0.5, (caught, fraud, len(flagged))
