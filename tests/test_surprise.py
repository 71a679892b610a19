"""Reconstruction surprise (seqenc.surprise): the statistics, the scorer, and the trained model
and batch scoring combining scores the same way."""

import json

import numpy as np
import pytest
import torch

from seqenc.config import TVMKAConfig
from seqenc.model import TVMKA
from seqenc.sequences import TokenizedSequences
from seqenc.surprise import STAT_MIN_SCALE, STATS, TAIL_SHARE, SurpriseScorer, key_maxima, key_surprise, tail_fit
from training.tasks.catalog import load_catalog
from training.tasks.spec import resolve_task

CLS, MASK, SEP, PAD = 2, 4, 5, 0  # ids in a toy vocabulary of 20 tokens


def _data() -> TokenizedSequences:
    """Two sequences; sequence 0 has keys a (two values, one window) and b; sequence 1 has key a
    in two windows (three values) and no b."""
    windows = [[CLS, 10, SEP, 11, 12, SEP, 13],  # seq 0, key a: values [11 12], [13]
               [CLS, 14, SEP, 15],  # seq 0, key b: value [15]
               [CLS, 10, SEP, 11, 12],  # seq 1, key a, window 1
               [CLS, 10, SEP, 16, SEP, 17]]  # seq 1, key a, window 2
    return TokenizedSequences(["s0", "s1"], ["a", "b", "a"], np.array([0, 0, 1]), windows, np.array([0, 1, 2, 2]))


def _tvm():
    torch.manual_seed(0)
    config = TVMKAConfig(vocab_size=20, d_model=16, n_layers=1, n_heads=2, n_shared_heads=1, d_ff=32,
                         max_positions=16, pad_token_id=PAD)
    return TVMKA(config).tvm.eval()


def _nll(tvm, window, start, end):
    """Per-token NLL of window[start:end] with those tokens masked, computed directly."""
    ids = torch.tensor([window[:start] + [MASK] * (end - start) + window[end:]])
    with torch.no_grad():
        logp = tvm.mlm_logits(tvm(ids, ids != PAD)[0, start:end]).log_softmax(-1)
    return -logp[torch.arange(end - start), torch.tensor(window[start:end])].numpy()


def _stats(*value_nlls):
    """The expected (link, repeat, bin, token, value) of one key row without marker tokens from
    its values' per-token NLLs."""
    return [0.0, 0.0, 0.0, max(v.max() for v in value_nlls), max(v.sum() for v in value_nlls)]


def test_key_surprise_masks_each_value_whole_and_aggregates_per_key():
    tvm, data = _tvm(), _data()
    assert STATS == ("link", "repeat", "bin", "token", "value")
    stats = key_surprise(tvm, data, MASK, SEP, PAD, progress=False)
    assert stats.shape == (3, len(STATS))
    w0 = data.windows[0]
    v1, v2 = _nll(tvm, w0, 3, 5), _nll(tvm, w0, 6, 7)  # [11 12] and [13] of sequence 0, key a
    # the first token's NLL with the *whole* value masked (not the first token alone)
    assert _nll(tvm, w0, 3, 4)[0] != pytest.approx(v1[0])
    np.testing.assert_allclose(stats[0], _stats(v1, v2), rtol=1e-5)
    np.testing.assert_allclose(stats[1], _stats(_nll(tvm, data.windows[1], 3, 4)), rtol=1e-5)
    # key a of sequence 1 spans two windows: its three values are aggregated together
    vals = [_nll(tvm, data.windows[2], 3, 5), _nll(tvm, data.windows[3], 3, 4), _nll(tvm, data.windows[3], 5, 6)]
    np.testing.assert_allclose(stats[2], _stats(*vals), rtol=1e-5)


def test_marker_statistics_read_each_kind_of_marker():
    """A value's link / repeat marker and bin token each have a statistic of their own: the NLL
    of that token (the whole value masked), zero for a value without it; token and value do
    not depend on which tokens are markers."""
    tvm, data = _tvm(), _data()
    plain = key_surprise(tvm, data, MASK, SEP, PAD, progress=False)
    # 11 leads the value [11 12] of key a in both sequences; 13 is key a's other value in sequence 0
    stats = key_surprise(tvm, data, MASK, SEP, PAD, markers={"repeat": frozenset({11}), "bin": frozenset({13})},
                         progress=False)
    np.testing.assert_array_equal(stats[:, 3:], plain[:, 3:])
    v1, v2 = _nll(tvm, data.windows[0], 3, 5), _nll(tvm, data.windows[0], 6, 7)
    assert stats[0, STATS.index("repeat")] == pytest.approx(v1[0], rel=1e-5)
    assert stats[0, STATS.index("bin")] == pytest.approx(v2[0], rel=1e-5)
    assert stats[0, STATS.index("link")] == 0.0 and stats[1, :3].tolist() == [0.0, 0.0, 0.0]  # key b: no marker
    w2 = data.windows[2]
    assert stats[2, STATS.index("repeat")] == pytest.approx(_nll(tvm, w2, 3, 5)[0], rel=1e-5)


def test_tail_fit_estimates_the_log_tail_probability():
    """On an exponential sample -log P(X >= v) = v: the fitted line is close to it in the tail;
    a constant sample gets the floor as its scale; one value gets scale 1."""
    x = np.random.default_rng(0).exponential(1.0, 20000)
    centre, scale = tail_fit(x, STAT_MIN_SCALE)
    assert scale == pytest.approx(1.0, rel=0.05) and centre == pytest.approx(0.0, abs=0.1)
    t = np.quantile(x, 1 - TAIL_SHARE)
    assert (t - centre) / scale == pytest.approx(-np.log(TAIL_SHARE), rel=0.02)  # the threshold scores -log 0.1
    assert tail_fit(np.full(50, 3.0), STAT_MIN_SCALE)[1] == STAT_MIN_SCALE
    assert tail_fit(np.array([2.0]), STAT_MIN_SCALE) == (2.0, 1.0)


def test_scorer_standardises_per_key_and_takes_the_larger_score():
    keys = ["a", "b"] * 6 + ["a", "c"]  # six fitting sequences with a and b; one new with a and an unseen c
    data = TokenizedSequences([f"s{i}" for i in range(7)], keys, np.repeat(np.arange(7), 2), [], np.zeros(0))
    rng = np.random.default_rng(0)
    stats = rng.normal(1.0, 0.1, size=(14, len(STATS)))
    stats[12] = 9.0  # sequence 6: key a is very surprising
    stats[13] = 100.0  # key c was never seen in training: ignored
    probs = np.full((7, 2), 0.5)
    scorer = SurpriseScorer.fit(stats, data, probs + rng.normal(0, 0.01, size=(7, 1)) * [[-1, 1]], np.arange(6))
    surprise = scorer.sequence_surprise(stats, data)
    # by hand: a tail line per (key, statistic) on the fitting sequences, the larger key score
    # per statistic, that maximum scored by its own tail line on the fitting sequences, the
    # largest statistic
    a_fit, b_fit = stats[0:12:2], stats[1:12:2]  # [6, len(STATS)]: keys a and b in the fitting sequences

    def line(x, floor):  # [n, S] -> per column (centre, scale)
        return np.array([tail_fit(col, floor) for col in x.T]).T

    (ca, sa), (cb, sb) = line(a_fit, STAT_MIN_SCALE), line(b_fit, STAT_MIN_SCALE)
    key_max = np.maximum((a_fit - ca) / sa, (b_fit - cb) / sb)
    cm, sm = line(key_max, 0.05)
    assert surprise[6] == pytest.approx(((9.0 - ca) / sa - cm).__truediv__(sm).max())
    assert surprise[6] > 20 and surprise[:6].max() < 4
    np.testing.assert_allclose(key_maxima(stats, data, scorer.centre, scorer.scale)[:6], key_max)
    np.testing.assert_allclose(scorer.seq_centre, cm)
    np.testing.assert_allclose(scorer.seq_scale, sm)
    combined = scorer.combine(probs, stats, data)
    assert combined.shape == (7, 2) and np.allclose(combined.sum(1), 1)
    assert combined[6, 1] > 0.999 and combined[:6, 1].max() < combined[6, 1]
    sure = probs.copy()
    sure[0] = [1e-6, 1 - 1e-6]  # the KA alone is sure of sequence 0: the max keeps that
    assert scorer.combine(sure, stats, data)[0, 1] > 0.999
    again = SurpriseScorer.from_dict(json.loads(json.dumps(scorer.to_dict())))
    np.testing.assert_array_equal(again.combine(probs, stats, data), combined)
    old = {**scorer.to_dict(), "stats": ["lead", "token", "value"]}  # an older bundle's scorer
    old.pop("calibration")
    with pytest.raises(ValueError, match="retrain"):
        SurpriseScorer.from_dict(old)
    with pytest.raises(ValueError, match="retrain"):  # fitted before the squash: its threshold meant another P
        SurpriseScorer.from_dict({**scorer.to_dict(), "calibration": "tail"})
    with pytest.raises(ValueError, match="at least 2 normal"):
        SurpriseScorer.fit(stats, data, probs, np.arange(1))


def test_surprise_scoring_is_binary_only():
    with pytest.raises(ValueError, match="surprise_scoring"):
        TVMKAConfig(task="multiclass", n_classes=3, surprise_scoring=True)


def test_trained_model_and_batch_scoring_combine_the_same_way(prepared_task, tmp_path):
    """``seqenc train --config '{"model": {"surprise_scoring": true}}'``: the bundle carries the
    fitted scorer, and scoring the test sequences from their objects reproduces the trainer's
    test metrics with the bundle's threshold."""
    import shutil

    import polars as pl

    from parsers import storage
    from training.pipeline import stages as pipeline
    from training.serving.scoring import load_bundle, score_objects
    from training.tasks.metrics import split_metrics

    work = tmp_path / "w"
    shutil.copytree(prepared_task("anomaly"), work)
    steps = {"pretrain_steps": 2, "rounds": 1, "tvm_steps_per_round": 2, "checkpoint_every": 0}
    result = pipeline.run_train(str(work), resolve_task(None, "anomaly"), "tiny", config={"model": {"surprise_scoring": True},
                                                                      "train": steps}, progress=False)
    model, _, meta = load_bundle(result["model_dir"])
    assert model.config.surprise_scoring and set(meta["surprise"]["centre"]) >= {"size", "event"}
    splits = pl.read_parquet(work / "sequences" / "anomaly" / "splits.parquet")
    test = splits.filter(pl.col("split") == "test")
    objects = storage.read_objects(work / "data", load_catalog().task("anomaly").source)
    scored = score_objects(result["model_dir"], objects.join(test.select("sequence_id"), on="sequence_id"),
                           progress=False).join(test, on="sequence_id")
    classes = json.loads((work / "sequences" / "anomaly" / "classes.json").read_text())
    y = np.array([classes.index(label) for label in scored["label"]])
    probs = np.stack([1 - scored["score"].to_numpy(), scored["score"].to_numpy()], 1)
    again = split_metrics(y, probs, "binary", meta["threshold"])
    assert {k: again[k] for k in ("precision", "recall", "f1")} == \
        pytest.approx({k: result["metrics"]["test"][k] for k in ("precision", "recall", "f1")})


def test_end_to_end_modes_refuse_surprise_scoring(prepared_task, tmp_path):
    """The surprise is read from the TVM of interleaved / no_interleave training; an end-to-end
    mode asked for it fails loudly instead of training without it."""
    import shutil

    from training.pipeline import stages as pipeline

    work = tmp_path / "w"
    shutil.copytree(prepared_task("anomaly"), work)
    with pytest.raises(ValueError, match="surprise_scoring reads the TVM"):
        pipeline.run_train(str(work), resolve_task(None, "anomaly"), "tiny", mode="flattened",
                           config={"model": {"surprise_scoring": True}}, progress=False)


def test_large_scores_stay_apart_after_the_sigmoid():
    """Tail scores far past the knee (a long value's NLL extrapolated, or novel values) keep
    their order as probabilities: in float64 sigmoid(s) is 1.0 for every s above ~36.7, and such
    ties put a contamination cut at 1.0, where nothing is flagged (issue 50)."""
    from seqenc.surprise import SQUASH_KNEE, squash, unsquash
    from training.engine.unlabelled import policy_threshold

    scores = np.array([-3.0, 0.0, 5.0, SQUASH_KNEE, 12.0, 40.0, 64.0, 104.0, 1e4, 1e9])
    s = squash(scores)
    assert (np.diff(s) > 0).all()  # increasing
    np.testing.assert_array_equal(s[:4], scores[:4])  # unchanged up to the knee
    eps = 1e-6  # continuous with its slope at the knee
    assert abs((squash(np.array([SQUASH_KNEE + eps]))[0] - SQUASH_KNEE) / eps - 1.0) < 1e-3
    np.testing.assert_allclose(unsquash(s), scores, rtol=1e-9)  # the label-free rule reads the score back
    p = 1.0 / (1.0 + np.exp(-s))
    assert (np.diff(p) > 0).all() and p[-1] < 1.0
    # a reference whose top 10 % are far past the knee: a 5 % share flags 5 %, not none
    ref = np.concatenate([np.linspace(-2, 2, 90), np.linspace(40, 130, 10)])
    probs = 1.0 / (1.0 + np.exp(-squash(ref)))
    cut = policy_threshold(probs, {"policy": "contamination", "share": 0.05})
    assert 4 <= (probs >= cut).sum() <= 6
    # the label-free rule's median and MAD are taken on the score itself, not on its squashed form
    from training.engine.unlabelled import LABEL_FREE_Z, label_free_threshold

    wide = np.concatenate([np.linspace(0, 40, 60), np.linspace(60, 200, 40)])  # over a quarter past the knee
    median = np.median(wide)
    expected = median + LABEL_FREE_Z * np.median(np.abs(wide - median)) / 0.6745
    got = label_free_threshold(1.0 / (1.0 + np.exp(-squash(wide))))
    np.testing.assert_allclose(unsquash(np.log(got) - np.log1p(-got)), expected, rtol=1e-6)
