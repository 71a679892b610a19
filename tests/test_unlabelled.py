"""Anomaly detection without labels (training.engine.unlabelled): the masked LM alone ranks sequences
with an unseen value above normal ones; threshold policies; the bundle scores through the
serving path with the trainer's probabilities; loglizer's PCA baseline (count_pca); bench rows."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from shared_data import require
from sklearn.metrics import roc_auc_score
from toy_tokens import split_windows

from parsers import storage
from seqenc.config import TVMKAConfig
from seqenc.model import TVMKA
from seqenc.surprise import SurpriseScorer, squash, unsquash
from training.engine.trainer import TrainConfig
from training.engine.unlabelled import (
    THRESHOLD_POLICIES,
    UnlabelledTrainer,
    check_threshold,
    labelled_metrics,
    policy_threshold,
)
from training.serving.scoring import (
    id_hashes,
    load_bundle,
    read_in_training,
    save_bundle,
    score_objects,
    trained_id_hashes,
)
from training.tasks.baselines import pca_detector

MODEL = {"d_model": 32, "n_layers": 1, "n_heads": 4, "n_shared_heads": 2, "d_ff": 64, "max_positions": 64,
         "vocab_size": 512, "dropout": 0.0, "attn_dropout": 0.0}
STEPS = {"pretrain_steps": 60, "rounds": 2, "tvm_steps_per_round": 20, "batch_tokens": 2048, "warmup_steps": 5,
         "lr_tvm": 2e-3, "log_every": 10, "mlm_mask_unit": "value"}


def _objects(n: int = 160, seed: int = 0) -> tuple[pl.DataFrame, np.ndarray]:
    """Blocks of events E1-E4 in a random order, a port and a status per event; one block in
    eight (y = 1) has one port no other block uses (``6666`` instead of ``50010``)."""
    rng = np.random.default_rng(seed)
    rows, y = [], np.zeros(n, dtype=np.int64)
    y[rng.permutation(n)[: n // 8]] = 1
    for s in range(n):
        events = list(rng.permutation(["E1", "E2", "E3", "E4"])) + ["E2", "E3"]
        odd = int(rng.integers(len(events))) if y[s] else -1
        for step, event in enumerate(events):
            for key, value in (("event", event), ("port", "6666" if step == odd else "50010"), ("status", "ok")):
                rows.append({"sequence_id": f"b{s:03d}", "step": step, "ts": None, "key": key, "value": value,
                             "template_id": None})
    schema = storage.polars_schema(storage.OBJECTS_SCHEMA)
    return pl.DataFrame(rows, schema=schema), y


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A tiny unlabelled training: the masked LM reads every train block, labels unread."""
    import torch

    objects, y_all = _objects()
    tok, data, y, splits = split_windows(objects, y_all, MODEL, n_train=96, n_dev=32)
    torch.manual_seed(0)
    model = TVMKA(TVMKAConfig(**{**MODEL, "vocab_size": tok.vocab_size, "pad_token_id": tok.pad_id,
                                 "val_sep_token_id": tok.val_sep_id, "task": "binary", "n_classes": 2,
                                 "class_names": ["Normal", "Anomaly"]}))
    unlabelled = np.full_like(y, -1)  # the trainer is told nothing: labels evaluate below only
    work = tmp_path_factory.mktemp("unlabelled")
    trainer = UnlabelledTrainer(model, tok, data, unlabelled, splits, TrainConfig(**STEPS, seed=0), work / "job",
                                {"policy": "contamination", "share": 0.125}, progress=False)
    result = trainer.fit()
    return {"trainer": trainer, "result": result, "y": y, "splits": splits, "objects": objects, "tok": tok,
            "data": data, "model": model, "work": work}


def test_unlabelled_model_ranks_unseen_values_above_normal_ones(fitted):
    result, y, splits = fitted["result"], fitted["y"], fitted["splits"]
    scored = np.concatenate([splits["dev"], splits["test"]])
    assert y[scored].sum() >= 4  # anomalies in dev and test to rank
    auc = roc_auc_score(y[scored], result["probs"][scored, 1])
    assert auc > 0.95, auc
    # no label reached the trainer: no metric, and train rows were not scored (NaN)
    assert result["dev"] == {} and result["test"] == {}
    assert np.isnan(result["probs"][splits["train"]]).all()
    assert not np.isnan(result["probs"][scored]).any()
    # the threshold is the contamination quantile of the reference (dev) scores
    ref = result["probs"][splits["dev"], 1]
    assert result["threshold"] == pytest.approx(np.quantile(ref, 1 - 0.125))
    flagged = result["probs"][scored, 1] >= result["threshold"]
    assert flagged.sum() > 0 and y[scored][flagged].mean() > 0.5
    # another policy from the same statistics (the bench's grid): the run's own policy gives the run
    probs, cut = fitted["trainer"].rescore({"policy": "contamination", "share": 0.125})
    np.testing.assert_array_equal(probs, result["probs"])
    assert cut == result["threshold"]
    scorer = fitted["trainer"].surprise
    assert not scorer.uses_ka and scorer.stride == 8 and "port" in scorer.centre
    assert {k for k, v in fitted["trainer"].history.items() if v} == {"train/mlm_loss"}  # no KA step


def test_labels_only_evaluate():
    y = np.array([-1, 0, 1, 1, -1])
    probs = np.stack([1 - np.array([0.1, 0.2, 0.9, 0.3, 0.8]), [0.1, 0.2, 0.9, 0.3, 0.8]], 1)
    m = labelled_metrics(y, probs, np.arange(5), 0.5)
    assert (m["precision"], m["recall"]) == (1.0, 0.5)  # rows 0 and 4 (unlabelled) are not counted
    assert labelled_metrics(y, probs, np.array([0, 4]), 0.5) == {}


def test_threshold_policies():
    scores = np.arange(101, dtype=np.float64)
    assert policy_threshold(scores, {"policy": "contamination", "share": 0.1}) == pytest.approx(90.0)
    assert policy_threshold(scores, {"policy": "quantile", "q": 0.99}) == pytest.approx(99.0)
    assert THRESHOLD_POLICIES == ("contamination", "quantile")
    for bad in ({"policy": "best_f1"}, {}, None):
        with pytest.raises(ValueError, match="contamination"):
            check_threshold(bad)
    for share in (0, 0.6, "0.1", None):
        with pytest.raises(ValueError, match="share"):
            check_threshold({"policy": "contamination", "share": share})
    for q in (0, 1, 1.5):
        with pytest.raises(ValueError, match="q must"):
            check_threshold({"policy": "quantile", "q": q})
    with pytest.raises(ValueError, match="no reference"):
        policy_threshold(np.zeros(0), {"policy": "quantile", "q": 0.5})


def test_tied_scores_at_the_cut_are_not_flagged_whole():
    """HDFS blocks repeat, so scores tie in large blocks: a share (or 1 - q) flags at most that
    share of the reference -- never a whole tied block at the quantile (scikit-learn's convention)."""
    scores = np.array([0.0] * 60 + [1.0] * 30 + list(np.linspace(2, 3, 10)))  # 60 % tie at the floor
    cut = policy_threshold(scores, {"policy": "contamination", "share": 0.5})  # the median is the floor
    assert (scores >= cut).sum() == 40  # the 40 above the floor, not all 100
    cut = policy_threshold(scores, {"policy": "quantile", "q": 0.75})  # inside the block of ones
    assert (scores >= cut).sum() == 10
    rng = np.random.default_rng(0)
    for _ in range(200):  # any ties, any share: never more than asked (+1 of the interpolation)
        scores = rng.integers(0, 5, size=rng.integers(1, 60)).astype(np.float64)
        share = float(rng.choice([0.01, 0.1, 0.3, 0.5]))
        flagged = (scores >= policy_threshold(scores, {"policy": "contamination", "share": share})).sum()
        assert flagged <= share * (len(scores) - 1) + 1
    distinct = rng.permutation(200).astype(np.float64)  # no ties: the share exactly (up to one)
    assert abs((distinct >= policy_threshold(distinct, {"policy": "contamination", "share": 0.1})).sum() - 20) <= 1


def test_a_clean_reference_sets_the_threshold(fitted):
    """``splits["reference"]``: the scorer and the threshold are fitted on those sequences (here
    the normal dev blocks, as a user who declares a clean window), not on dev."""
    trainer, y, splits = fitted["trainer"], fitted["y"], fitted["splits"]
    clean = splits["dev"][y[splits["dev"]] == 0]
    again = UnlabelledTrainer(trainer.model, trainer.tok, trainer.data, y, {**splits, "reference": clean},
                              trainer.cfg, fitted["work"] / "clean", {"policy": "quantile", "q": 0.95}, progress=False)
    again.fit_surprise()  # the same final TVM, another reference
    out = again.evaluate()
    assert out["threshold"] == pytest.approx(np.quantile(out["probs"][clean, 1], 0.95))
    assert set(out["dev"]) >= {"precision", "recall", "f1"} and out["test"]["recall"] >= 0.5


def test_bundle_scores_with_the_surprise_alone(fitted, tmp_path, monkeypatch):
    """Saved like the pipeline saves it, loaded by load_bundle, scored by score_objects from the
    objects: the trainer's probabilities, and the untrained KA is never run."""
    import training.serving.scoring as scoring

    trainer, result, splits = fitted["trainer"], fitted["result"], fitted["splits"]
    meta = {"mode": "unlabelled", "threshold": result["threshold"], "surprise": trainer.surprise.to_dict(),
            "exclude_keys": [], "event_key": False, "task_name": "anomaly"}
    directory = save_bundle(fitted["model"], fitted["tok"], meta, tmp_path / "bundle")
    saved = json.loads((directory / "metadata.json").read_text())["surprise"]
    assert saved["ka_centre"] is None and saved["stride"] == 8
    assert not SurpriseScorer.from_dict(saved).uses_ka
    model, _, loaded_meta = load_bundle(directory)
    assert isinstance(model, TVMKA) and loaded_meta["mode"] == "unlabelled"

    def no_ka(*args, **kwargs):
        raise AssertionError("the KA must not score an unlabelled bundle")

    monkeypatch.setattr(scoring, "predict_proba", no_ka)
    test_ids = [fitted["data"].sequence_ids[i] for i in splits["test"]]
    objects = fitted["objects"].filter(pl.col("sequence_id").is_in(test_ids))
    scored = score_objects(directory, objects, progress=False)
    row = {s: i for i, s in enumerate(fitted["data"].sequence_ids)}
    expected = result["probs"][[row[s] for s in scored["sequence_id"]], 1]
    np.testing.assert_allclose(scored["score"].to_numpy(), expected, rtol=1e-6, atol=1e-9)
    flagged = scored["prediction"].to_numpy() == "Anomaly"
    np.testing.assert_array_equal(flagged, expected >= result["threshold"])

    # the training split's ids are kept as hashes: a scored day learns how many it holds, nothing else
    assert trained_id_hashes(directory) is None  # saved without them (an older bundle)
    train_ids = [fitted["data"].sequence_ids[i] for i in splits["train"]]
    kept = save_bundle(fitted["model"], fitted["tok"], meta, tmp_path / "bundle", trained_ids=train_ids)
    trained = trained_id_hashes(kept)
    assert read_in_training(trained, test_ids) == 0 and read_in_training(trained, []) == 0
    assert read_in_training(trained, train_ids[:7] + test_ids) == 7
    assert read_in_training(trained, [f"x-{s}" for s in train_ids]) == 0
    held = (kept / "train_sequences.safetensors").read_bytes()
    assert not any(s.encode() in held for s in train_ids)  # no id in clear
    assert len(id_hashes(train_ids + train_ids)) == len(train_ids)


def test_resume_continues_to_the_same_scores(fitted, tmp_path):
    """Resumed from the checkpoint after pre-training: the same final probabilities."""
    import torch

    trainer = fitted["trainer"]
    y = np.full(trainer.data.n_sequences, -1)
    steps = {**STEPS, "pretrain_steps": 6, "tvm_steps_per_round": 4, "rounds": 1}

    def make(work):
        torch.manual_seed(3)
        model = TVMKA(trainer.model.config)
        return UnlabelledTrainer(model, trainer.tok, trainer.data, y, fitted["splits"], TrainConfig(**steps, seed=3),
                                 work, {"policy": "quantile", "q": 0.9}, progress=False)

    whole = make(tmp_path / "a").fit()
    checkpoints = sorted((tmp_path / "a" / "checkpoints").glob("step-*"))
    assert len(checkpoints) == 2  # after pre-training and after round 1 (the last two are kept)
    resumed = make(tmp_path / "b")
    assert resumed.resume(checkpoints[0]) and resumed.phase == 1 and resumed.step == 6
    again = resumed.fit()
    np.testing.assert_allclose(again["probs"], whole["probs"], rtol=1e-5, equal_nan=True)
    assert again["threshold"] == pytest.approx(whole["threshold"], rel=1e-5)


def test_trainer_refuses_what_it_cannot_do(fitted, tmp_path):
    trainer = fitted["trainer"]
    args = (trainer.model, trainer.tok, trainer.data, fitted["y"], fitted["splits"])
    with pytest.raises(ValueError, match="policy"):
        UnlabelledTrainer(*args, TrainConfig(**STEPS), tmp_path, {"policy": "oracle"})
    with pytest.raises(ValueError, match="normal train sequences"):
        UnlabelledTrainer(*args, TrainConfig(**STEPS, mlm_sequences="normal"), tmp_path,
                          {"policy": "quantile", "q": 0.9})


def test_count_pca_flags_a_row_outside_the_normal_subspace():
    """loglizer's PCA: tf-idf + zero-mean, 95 % of the variance, Q-statistic at alpha = 0.001.
    Normal rows hold events 0 and 1 in equal counts or events 2 and 3 in the ratio 1:2; a row
    with event 0 alone breaks the first invariant and is flagged, a consistent new row is not."""
    rng = np.random.default_rng(0)
    n = 300
    X = np.zeros((n, 6))
    a, c = rng.random(n) < 0.5, rng.integers(1, 5, n)
    X[a, 0] = X[a, 1] = c[a]
    X[~a, 2], X[~a, 3] = c[~a], 2 * c[~a]
    X[:, 4] = rng.random(n) < 0.3
    transform, spe, threshold = pca_detector(X)
    new = np.zeros((2, 6))
    new[0, 0] = 4  # event 0 without event 1
    new[1, 2], new[1, 3] = 3, 6  # a consistent row never seen with these counts
    flagged = spe(transform(new)) > threshold
    assert flagged.tolist() == [True, False]
    assert (spe(transform(X)) > threshold).sum() == 0
    # the threshold is Jackson-Mudholkar's Q limit on the left-out eigenvalues, c_alpha = 3.2905
    idf = np.log(n / ((X > 0).sum(0) + 1e-8))
    Xt = X * idf - (X * idf).mean(0)
    lam = np.linalg.svd(Xt.T @ Xt / n)[1]
    k = int(np.argmax(np.cumsum(lam) / lam.sum() >= 0.95)) + 1
    p1, p2, p3 = ((lam[k:] ** i).sum() for i in (1, 2, 3))
    h0 = 1 - 2 * p1 * p3 / (3 * p2 ** 2)
    q = p1 * (3.2905 * np.sqrt(2 * p2 * h0 ** 2) / p1 + 1 + p2 * h0 * (h0 - 1) / p1 ** 2) ** (1 / h0)
    assert threshold == pytest.approx(q)
    # everything explained: nothing can leave the subspace
    assert pca_detector(np.array([[1.0], [2.0], [0.0]]))[2] == float("inf")


def test_bench_rows_and_mode_names(tmp_path):
    """``--modes unlabelled,unlabelled+normal``: one row each, beside count_lr, count_pca (and
    count_pca+normal for DeepLog's setting) and always_positive; each unlabelled row carries the
    dev F1 of its policy's grid and the constant it used."""
    from training.bench.accuracy import SHARE_GRID, _unlabelled_parts, bench_accuracy

    assert _unlabelled_parts("unlabelled") == (False, "")
    assert _unlabelled_parts("unlabelled+normal+bag") == (True, "bag")
    assert _unlabelled_parts("interleaved") is None
    with pytest.raises(ValueError, match="unknown bench mode"):
        _unlabelled_parts("unlabelled+sometimes")
    data = require()
    result, described = bench_accuracy(
        data, tmp_path, datasets=["hdfs"], modes=["unlabelled", "unlabelled+normal"], size="tiny",
        limits={"hdfs": 40}, progress=False,
        config={"train": {"pretrain_steps": 4, "rounds": 1, "tvm_steps_per_round": 4},
                "threshold": {"unlabelled": {"policy": "contamination", "share": 0.3}}})
    rows = result["hdfs"]
    assert list(rows) == ["unlabelled", "unlabelled+normal", "count_lr", "count_lr_values", "count_pca", "count_pca+normal",
                          "iforest", "lof", "ocsvm", "iforest+normal", "lof+normal", "ocsvm+normal", "always_positive"]
    for name in ("iforest", "lof", "ocsvm"):  # the peers use the unlabelled modes' rules (training.bench.detectors)
        assert rows[name]["threshold_policy"] == {"policy": "contamination", "share": 0.3}
        assert rows[name + "+normal"]["threshold_policy"] == {"policy": "quantile", "q": 0.98}
        assert 0 <= rows[name]["f1_default"] <= 1 and 0 <= rows[name + "+normal"]["roc_auc"] <= 1
    for name, row in rows.items():
        assert {"precision", "recall", "f1", "macro_f1", "micro_f1", "seconds", "dev_f1"} <= set(row), name
    assert rows["unlabelled"]["share"] == 0.3 and rows["unlabelled+normal"]["q"] == 0.98
    assert all(f"dev_f1_at_share_{s}" in rows["unlabelled"] for s in SHARE_GRID)
    assert rows["unlabelled"]["robust_share"] in SHARE_GRID and "robust_q" in rows["unlabelled+normal"]
    assert 0 <= rows["unlabelled"]["roc_auc"] <= 1
    # beside the dev-labelled constant, one no label chose: what a task gets without a threshold
    assert rows["unlabelled"]["label_free_rule"].startswith("modified z-score > 3.5")
    assert rows["unlabelled+normal"]["label_free_rule"].startswith("the 0.99 quantile of the clean reference")
    for mode in ("unlabelled", "unlabelled+normal"):
        assert 0 <= rows[mode]["f1_label_free"] <= 1 and 0 <= rows[mode]["dev_f1_label_free"] <= 1
    assert described["hdfs"]["thresholds"]["unlabelled"] == {"policy": "contamination", "share": 0.3}
    assert described["hdfs"]["unlabelled_settings"]["train"]["mlm_mask_unit"] == "value"


def test_robust_constant_steps_back_from_a_cliff():
    """The dev curve's pick: the constant whose F1 and its next stricter neighbour's are both
    high, not the grid's best when that sits next to a cliff (hdfs' mean dev curve, seeds 0-2)."""
    from training.bench.accuracy import robust_constant

    hdfs = {"dev_f1_at_q_0.9": 0.986, "dev_f1_at_q_0.95": 0.992, "dev_f1_at_q_0.98": 0.997,
            "dev_f1_at_q_0.99": 0.999, "dev_f1_at_q_0.995": 0.909, "dev_f1_at_q_0.999": 0.606}
    assert robust_constant(hdfs) == 0.98
    flat = {"dev_f1_at_q_0.9": 0.5, "dev_f1_at_q_0.95": 0.9, "dev_f1_at_q_0.99": 0.9}
    assert robust_constant(flat) == 0.99  # a tie goes to the stricter constant
    # shares: stricter is smaller; the strictest counts its own F1 alone
    shares = {"dev_f1_at_share_0.02": 0.333, "dev_f1_at_share_0.05": 0.667, "dev_f1_at_share_0.1": 0.589,
              "dev_f1_at_share_0.2": 0.315}
    assert robust_constant(shares) == 0.1
    assert robust_constant({"dev_f1_at_share_0.1": 0.4}) == 0.1
    assert robust_constant({"f1": 0.9}) is None


def _count_dataset(n: int = 600, seed: int = 0):
    """Sequences of events: normal ones draw from B, C, D, E at random and close with A; an
    anomaly (one in ten) repeats an error event X and never closes."""
    from training.tasks.dataset import LabelledDataset

    rng = np.random.default_rng(seed)
    rows, labels, split = [], [], []
    for i in range(n):
        sid, anomalous = f"s{i:04d}", rng.random() < 0.1
        events = [str(e) for e in rng.choice(list("BCDE"), size=int(rng.integers(3, 9)))]
        events += ["X"] * int(rng.integers(3, 6)) if anomalous else ["A"]
        rows += [(sid, step, "event", e) for step, e in enumerate(events)]
        labels.append((sid, "Anomaly" if anomalous else "Normal"))
        split.append((sid, "train" if i < n // 2 else "dev" if i < 3 * n // 4 else "test"))
    objects = pl.DataFrame(rows, schema=["sequence_id", "step", "key", "value"], orient="row")
    return LabelledDataset("counts", "binary", ("Normal", "Anomaly"), objects,
                        pl.DataFrame(labels, schema=["sequence_id", "label"], orient="row"),
                        pl.DataFrame(split, schema=["sequence_id", "split"], orient="row"), "event", (), "test")


# where each detector sees the anomaly (measured on _count_dataset; the others are real failures of
# the method: Isolation Forest cannot split on an event absent from every fitted row, LOF calls a
# dense cluster of anomalies normal when they are in what it was fitted on)
SEES = {"iforest": (False,), "lof": (True,), "ocsvm": (True, False)}


@pytest.mark.parametrize("name", sorted(SEES))
def test_unsupervised_peers_flag_what_breaks_the_counts(name):
    """scikit-learn's detectors on count_pca's counts, with the unlabelled modes' rules (a quantile
    of the normal dev scores for +normal, a contamination share of the dev scores otherwise): where
    the method can see the anomaly it ranks and flags it; the library's own threshold is reported
    beside."""
    from training.bench.detectors import count_detector

    ds = _count_dataset()
    for normal_only in (True, False):
        policy = {"policy": "quantile", "q": 0.99} if normal_only else {"policy": "contamination", "share": 0.1}
        row = count_detector(ds, name, policy, normal_only=normal_only, seed=0)
        assert 0 <= row["f1_default"] <= 1
        assert (row["n_fit"] < 300) == normal_only and row["policy"] == policy
        if normal_only in SEES[name]:
            assert row["roc_auc"] > 0.95 and row["f1"] > 0.8 and row["dev_f1"] > 0.8, (normal_only, row)


def test_label_free_threshold_is_a_robust_outlier_rule():
    """The label-free threshold: median + 3.5 MAD / 0.6745 of the reference scores (logits); it
    hardly moves when a tenth of the reference is anomalous, and flags what sits far above it."""
    from training.engine.unlabelled import label_free_threshold

    rng = np.random.default_rng(0)
    clean = rng.normal(10.0, 3.0, 2000)  # a spread above the floor: the MAD alone sets the cut
    dirty = np.concatenate([clean[:1800], rng.normal(34.0, 3.0, 200)])

    def prob(z):
        return 1 / (1 + np.exp(-squash(z)))

    def logit(p):
        return float(unsquash(np.log(p / (1 - p))))

    cut_clean, cut_dirty = label_free_threshold(prob(clean)), label_free_threshold(prob(dirty))
    med = np.median(clean)
    assert logit(cut_clean) == pytest.approx(med + 3.5 * np.median(np.abs(clean - med)) / 0.6745, rel=1e-6)
    assert 19.0 < logit(cut_clean) < 22.0 and abs(logit(cut_dirty) - logit(cut_clean)) < 3.0
    assert (prob(dirty[1800:]) >= cut_dirty).mean() > 0.9 and (prob(clean) >= cut_clean).mean() < 0.01


def test_label_free_threshold_on_a_tight_block_of_scores():
    """Most sequences surprising nowhere: their scores tie at a floor, or nearly (a block 0.01
    nats wide). The MAD is that block's width, and a cut just above it flagged a third of such a
    stream (issue 50); the spread's floor (LABEL_FREE_MIN_SPREAD nats, that of calibrated tail
    scores, Exp(1)) puts the cut 3.5 floors above the median, so of the mildly surprising sequences
    (calibrated ones: Exp(1) above the block) only the share e^-2.5 of a calibrated tail is flagged."""
    from training.engine.unlabelled import LABEL_FREE_MIN_SPREAD, LABEL_FREE_Z, label_free_threshold

    rng = np.random.default_rng(1)
    block = 2.0 + rng.uniform(0.0, 0.01, 600)  # 60 % within 0.01 nats
    mild = 2.0 + rng.exponential(1.0, 320)  # 32 % a little surprising
    far = rng.uniform(12.0, 30.0, 80)  # 8 % far above: the anomalies
    for body in (block, np.full(600, 2.0)):  # a near-tie and an exact tie (MAD 0)
        scores = np.concatenate([body, mild, far])
        cut = label_free_threshold(1 / (1 + np.exp(-squash(scores))))
        got = float(unsquash(np.log(cut / (1 - cut))))
        assert got == pytest.approx(np.median(scores) + LABEL_FREE_Z * LABEL_FREE_MIN_SPREAD, abs=0.02)
        flagged = scores >= got
        assert flagged[-80:].all() and flagged[:-80].mean() < 0.05  # the far ones, few of the rest
        assert 0.15 > (flagged[600:-80]).mean() > 0.03  # about e^-2.5 (8 %) of the mild ones
        assert 0.08 <= flagged.mean() < 0.12  # not the 40 % above the block
    same = label_free_threshold(np.full(50, 0.3))  # one score only: nothing is flagged
    assert not (np.full(50, 0.3) >= same).any()


def test_label_free_floor_is_the_spread_of_calibrated_tail_scores():
    """The spread's floor is what calibrated scores show: with uniform tail probabilities a
    stream's scores (-log p) are Exp(1), whose MAD as a normal sigma is the floor, so the rule
    flags about e^-(ln 2 + 2.5) = 4 % of such a stream -- an ordinary day -- and a stream whose
    scores are twice as spread is judged by its own MAD, not the floor."""
    from training.engine.unlabelled import LABEL_FREE_MIN_SPREAD, label_free_threshold

    rng = np.random.default_rng(3)
    calibrated = rng.exponential(1.0, 40_000)
    median = np.median(calibrated)
    assert np.median(np.abs(calibrated - median)) / 0.6745 == pytest.approx(LABEL_FREE_MIN_SPREAD, rel=0.02)
    for scale, share in ((1.0, 0.041), (2.0, 0.041)):  # the same share: the MAD scales with the scores
        scores = scale * calibrated
        cut = label_free_threshold(1 / (1 + np.exp(-squash(scores))))
        assert (1 / (1 + np.exp(-squash(scores))) >= cut).mean() == pytest.approx(share, abs=0.006)


def test_label_free_threshold_flags_anomalies_a_few_nats_above_a_tied_block():
    """The jobs stream of docs/training.md ("The label-free rule on made-up streams"): 72 % of a
    day's jobs tie at the median, and the stuck ones (6 %, read in training, so only moderately
    surprising) sit 3.1-4.3 nats above it. The spread floor of 1.5 nats put the cut 5.25 nats up
    and flagged none; the calibrated floor flags them and little else."""
    from training.engine.unlabelled import label_free_threshold

    rng = np.random.default_rng(4)
    scores = np.concatenate([np.full(720, 1.2), 1.2 + rng.exponential(0.4, 220), 1.2 + rng.uniform(3.1, 4.3, 60)])
    cut = label_free_threshold(1 / (1 + np.exp(-squash(scores))))
    flagged = 1 / (1 + np.exp(-squash(scores))) >= cut
    assert flagged[-60:].all() and flagged[:-60].mean() < 0.01


def test_label_free_threshold_reads_scores_below_zero_as_zero():
    """A tail line extrapolated below its threshold gives sequences in no tail negative scores,
    down to the probability's clip (-27.6); 60 % of HealthApp_2k's 50 s windows sat there and a
    cut 5.25 nats above that (the spread's floor then 1.5 nats) flagged 39 %. Scores are -log of a tail probability, so below 0 they
    count as 0: only the sequences far above 0 are flagged."""
    from training.engine.unlabelled import LABEL_FREE_MIN_SPREAD, LABEL_FREE_Z, label_free_threshold

    rng = np.random.default_rng(2)
    scores = np.concatenate([np.full(600, -27.6), rng.uniform(-12.0, 0.0, 250), rng.uniform(0.0, 2.0, 100),
                             rng.uniform(10.0, 30.0, 50)])
    cut = label_free_threshold(1 / (1 + np.exp(-squash(scores))))
    got = float(unsquash(np.log(cut / (1 - cut))))
    assert got == pytest.approx(LABEL_FREE_Z * LABEL_FREE_MIN_SPREAD, abs=0.02)  # the median is 0
    assert (scores >= got).tolist() == [False] * 950 + [True] * 50  # 5 %, not the 40 % above the clip
