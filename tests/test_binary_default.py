"""The binary kind's task defaults (training.tasks.kinds, docs/training.md "One binary default"):
the masked-LM surprise beside the KA, kept only where the task's own dev says it helps
(choose_surprise: a tie keeps the KA alone). Trained with the defaults, a stream whose fraud lives
in its amounts and one whose fraud shows in its events both catch the next day's fraud, and the
second drops the surprise (its KA is exact on dev); the preset "paper" turns the defaults off;
tables, pre-trained inits and the end-to-end modes do not take them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from sklearn.metrics import f1_score

from training.engine.sizes import TRAINING_PRESETS
from training.tasks.kinds import KINDS


def _catalog() -> str:
    """The checkout source of tests/test_window_threshold.py, with a binary task of defaults on it."""
    from test_window_threshold import CATALOG

    return CATALOG[:CATALOG.index("[tasks.")] + '''[tasks.fraud]
source = "checkout"
kind = "binary"
positive = "fraud"
size = "tiny"
config = {train = {tvm_ka_ratio = 0.1, checkpoint_every = 0}}
'''


def test_task_defaults_sit_under_the_task_and_stay_out_of_tables_and_end_to_end_modes():
    binary = KINDS["binary"]
    model = binary.task_settings("model", {"numeric_bins": 8})
    assert model["surprise_scoring"] and model["value_links"] and model["numeric_bins"] == 8  # the task's wins
    assert binary.task_settings("train", {})["surprise_choice"] == "dev"
    assert binary.task_settings("model", {"d_model": 64}, plain=True) == {"d_model": 64}  # tables, pre-trained
    assert "surprise_scoring" not in binary.task_settings("model", {}, end_to_end=True)
    assert binary.task_settings("model", {"surprise_scoring": True}, end_to_end=True)["surprise_scoring"]
    for kind in ("multiclass", "next_item", "anomaly"):
        assert KINDS[kind].task_settings("model", {}) == {}
    paper = TRAINING_PRESETS["paper"]  # every binary task default, undone
    for part in ("model", "train"):
        for key, value in binary.task_defaults[part].items():
            assert key == "surprise_choice" or paper[part][key] != value, key


def _stream(path: Path, labels: Path, day: str, n: int, seed: int, in_values: bool) -> None:
    """Checkout sessions (open, view, cart, pay, close); a fraudulent one (8 %) either pays an
    amount far outside the usual (``in_values``: only the values tell) or pays four times over
    at ordinary amounts (the events tell)."""
    rng = random.Random(seed)
    events, rows = [], []
    for i in range(n):
        sid, bad = f"{day}-s{i:04d}", rng.random() < 0.08
        actions = ["open", "view", "cart", "pay", "close"]
        if bad and not in_values:
            actions = ["open", "view", "cart", "pay", "pay", "pay", "pay", "close"]
        for j, action in enumerate(actions):
            amount = rng.uniform(900, 1500) if bad and in_values else rng.uniform(20, 60)
            events.append({"session": sid, "at": f"{day}T{i % 24:02d}:{j:02d}:{rng.randint(0, 59):02d}Z",
                           "action": action, "amount": round(amount, 2), "device": rng.choice(["ios", "android"])})
        rows.append(f"{sid},{'fraud' if bad else 'ok'}\n")
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    labels.write_text("session,verdict\n" + "".join(rows))


def _train(tmp_path: Path, in_values: bool, preset: list[str]) -> tuple[Path, float]:
    """Train the task on day 1 (defaults, or ``preset``); -> (bundle, F1 on day 2 at its threshold)."""
    from parsers import storage
    from training.cli.main import main
    from training.serving.scoring import score_objects

    tmp_path.mkdir(parents=True, exist_ok=True)
    catalog = tmp_path / "seqenc.toml"
    catalog.write_text(_catalog())
    work, root = tmp_path / "work", tmp_path / "work" / "data"
    for d, day, seed in (("d1", "2025-04-01", 0), ("d2", "2025-04-02", 100)):
        _stream(tmp_path / f"{d}.jsonl", tmp_path / f"{d}.csv", day, 600, seed, in_values)
        assert main(["ingest", "events", str(tmp_path / f"{d}.jsonl"), "--root", str(root), "--source", "checkout",
                     "--catalog", str(catalog), "--labels", str(tmp_path / f"{d}.csv"), "--date", day]) == 0
        if d == "d1":
            assert main(["train", "--catalog", str(catalog), "--task", "fraud", "--workdir", str(work),
                         "--no-progress", *preset]) == 0
    bundle = work / "models" / "fraud" / "bundle"
    threshold = json.loads((bundle / "metadata.json").read_text())["threshold"]
    day2 = score_objects(bundle, storage.read_objects(root, "checkout", "2025-04-02"), progress=False)
    truth = dict(pl.read_csv(tmp_path / "d2.csv").iter_rows())
    y = np.array([truth[s] == "fraud" for s in day2["sequence_id"]], dtype=int)
    return bundle, f1_score(y, day2["score"].to_numpy() >= threshold)


class _Finished:
    """The state choose_surprise reads of a trained InterleavedTrainer: a fitted scorer, the dev
    labels, and the dev scores with and without it (what split_probabilities returns)."""

    from training.engine.trainer import InterleavedTrainer

    task, step = "binary", 7
    dev_choice_figure = InterleavedTrainer.dev_choice_figure
    threshold_pivot = InterleavedTrainer.threshold_pivot
    evaluate = InterleavedTrainer.evaluate

    def __init__(self, y, with_it, without):
        from training.engine.trainer import TrainConfig

        self.cfg, self.y, self.splits = TrainConfig(), np.asarray(y), {"dev": np.arange(len(y))}
        self.surprise, self.p, self.logged = "scorer", {True: np.asarray(with_it), False: np.asarray(without)}, {}

    def split_probabilities(self, splits):
        p = self.p[self.surprise is not None]
        return np.stack([1 - p, p], axis=1)

    def log_metrics(self, metrics, step):
        self.logged = metrics


def _dev_scores(seed: int, separation: float, n_pos: int = 30, n_neg: int = 300, squeeze: bool = False):
    rng = np.random.default_rng(seed)
    logits = np.concatenate([rng.normal(separation, 1.0, n_pos), rng.normal(0.0, 1.0, n_neg)])
    p = 1 / (1 + np.exp(-(logits - 2)))
    return 0.5 + 0.5 * p if squeeze else p  # squeeze: a combined score, 0.5 or more everywhere


@pytest.mark.parametrize("with_sep, without_sep, kept", [(5.0, 1.0, True), (1.0, 5.0, False)],
                         ids=["surprise_separates", "ka_separates"])
def test_dev_decides_whether_the_surprise_stays(with_sep, without_sep, kept):
    """The cross-validated dev F1 of the rule decides (training.tasks.thresholds.cv_f1), the
    combined score at its own pivot (None: it has no 0.5 of its own), the KA's at 0.5."""
    from training.engine.trainer import InterleavedTrainer
    from training.tasks.thresholds import cv_f1

    y = np.r_[np.ones(30, int), np.zeros(300, int)]
    with_it, without = _dev_scores(2, with_sep, squeeze=True), _dev_scores(1, without_sep)
    trainer = _Finished(y, with_it, without)
    InterleavedTrainer.choose_surprise(trainer)
    assert (trainer.surprise is not None) == kept
    assert trainer.logged == {"surprise/dev_with": cv_f1("one_se", y, with_it, pivot=None),
                              "surprise/dev_without": cv_f1("one_se", y, without), "surprise/kept": float(kept)}


def test_a_tie_keeps_the_ka_alone():
    from training.engine.trainer import InterleavedTrainer

    class Level(_Finished):
        def dev_choice_figure(self):
            return 0.8

    trainer = Level(np.r_[1, 1, 0, 0], [0.9] * 4, [0.9] * 4)
    InterleavedTrainer.choose_surprise(trainer)
    assert trainer.surprise is None and trainer.logged["surprise/kept"] == 0.0


def test_a_dev_without_two_positives_decides_in_sample():
    """cv_f1 needs 2 positives (one per half): with one, the dev F1 at the rule's threshold decides."""
    from training.engine.trainer import InterleavedTrainer

    y = np.r_[1, np.zeros(50, int)]
    without = np.r_[0.3, np.linspace(0.01, 0.6, 50)]  # the positive under 20 negatives: F1 < 1
    with_it = np.r_[0.99, np.linspace(0.5, 0.7, 50)]  # the positive on top: dev F1 1.0
    trainer = _Finished(y, with_it, without)
    InterleavedTrainer.choose_surprise(trainer)
    assert trainer.surprise is not None and trainer.logged["surprise/dev_with"] == 1.0
    assert trainer.logged["surprise/dev_without"] < 1.0


@pytest.mark.parametrize("in_values", [True, False], ids=["fraud_in_values", "fraud_in_events"])
def test_a_binary_task_trains_with_the_defaults_and_dev_decides(tmp_path, in_values, caplog):
    import re

    caplog.set_level("INFO", logger="training.engine.trainer")
    bundle, f1 = _train(tmp_path / "default", in_values, [])
    meta = json.loads((bundle / "metadata.json").read_text())
    config = json.loads((bundle / "config.json").read_text())
    assert config["surprise_scoring"] and config["value_links"] and config["numeric_bins"] == 16
    assert config["numeric_gap_cuts"] == 2
    said = re.search(r"surprise scoring (kept|dropped): cross-validated dev f1 ([0-9.]+) with it, ([0-9.]+) with the KA alone",
                     caplog.text)
    assert said, "the trainer says what dev decided"
    assert (said[1] == "kept") == (float(said[2]) > float(said[3])) == bool(meta.get("surprise"))
    floor = 2 * 0.08 / 1.08  # F1 of flagging every session
    assert f1 > max(0.6, 3 * floor), f1
    if not in_values:  # four payments: the KA alone is exact on dev, so the surprise cannot beat it
        assert said[1] == "dropped" and f1 > 0.9, f1


def test_the_paper_preset_trains_without_them(tmp_path):
    bundle, _ = _train(tmp_path, True, ["--preset", "paper"])
    config = json.loads((bundle / "config.json").read_text())
    assert not config["surprise_scoring"] and not config["value_links"] and config["numeric_bins"] == 0
    assert config["numeric_gap_cuts"] == 0
    assert not json.loads((bundle / "metadata.json").read_text()).get("surprise")


def test_half_with_the_surprise_is_refused_in_one_line(tmp_path):
    """``threshold = {policy = "half"}`` reads P = 0.5 as the model's decision; the combined score of
    the surprise and the KA has none (nearly every sequence's P is >= 0.5), so training stops with a
    one-line error rather than flag every sequence; without the surprise, half trains."""
    from training.cli.main import main

    work = tmp_path / "work"
    _stream(tmp_path / "d1.jsonl", tmp_path / "d1.csv", "2025-04-01", 200, 0, True)
    catalog = tmp_path / "seqenc.toml"
    task = _catalog()[_catalog().index("[tasks.fraud]"):]
    half = 'threshold = {policy = "half"}\nconfig = {'
    catalog.write_text(_catalog().replace("config = {", half)
                       + task.replace("[tasks.fraud]", "[tasks.plain]").replace("config = {", half + "model = {surprise_scoring = false}, "))
    assert main(["ingest", "events", str(tmp_path / "d1.jsonl"), "--root", str(work / "data"), "--source", "checkout",
                 "--catalog", str(catalog), "--labels", str(tmp_path / "d1.csv"), "--date", "2025-04-01"]) == 0
    with pytest.raises(SystemExit) as refused:
        main(["train", "--catalog", str(catalog), "--task", "fraud", "--workdir", str(work), "--no-progress"])
    said = str(refused.value)
    assert "'half'" in said and "one_se" in said and "\n" not in said, said
    assert main(["train", "--catalog", str(catalog), "--task", "plain", "--workdir", str(work), "--no-progress"]) == 0
