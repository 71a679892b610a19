"""Unsupervised peers of ``unlabelled``: scikit-learn's Isolation Forest, LOF and one-class SVM.

Users compare a detector without labels against loglizer's and LogLead's: PCA (``count_pca``,
training.tasks.baselines), Isolation Forest, Local Outlier Factor and one-class SVM. Here each
reads exactly what ``count_pca`` reads -- the event-count vector of a sequence over the events
seen in train (``count_vectors``), tf-idf weighted and centred as loglizer's FeatureExtractor does
for PCA (``pca_detector``'s transform) -- and is fitted on the train sequences without labels
(``<name>``), or on the normal ones (``<name>+normal``, DeepLog's setting, whenever the bench runs
``unlabelled+normal``). Library defaults throughout (``random_state`` = the bench seed).

Two figures per row, so a detector is judged like ours:

* ``f1_default``: the library's own decision (``predict == -1``);
* ``f1`` (the row's headline, with precision / recall / macro / micro F1): the threshold rule of
  the matching unlabelled mode on this dataset (training.bench.accuracy's
  ``UNLABELLED_THRESHOLDS``: a contamination share of the dev scores, or a quantile of the normal
  dev sequences' scores), applied to the detector's score (``-score_samples``: higher is more
  anomalous). ``dev_f1`` the same on dev; ``roc_auc`` / ``average_precision`` of the scores.

Invariants Mining (loglizer) is not here: it mines linear invariants among event counts by
enumerating column subsets (exponential in the number of events, capped at 3 columns in loglizer)
and needs its own support/epsilon settings; it is not "small to write" as a faithful port, and a
partial one would be a weaker peer than the library detectors above.
"""

from __future__ import annotations

import time

import numpy as np

from training.tasks.baselines import count_vectors, pca_detector
from training.tasks.dataset import SPLITS, LabelledDataset

DETECTORS = ("iforest", "lof", "ocsvm")


def make_detector(name: str, seed: int):
    from sklearn.ensemble import IsolationForest
    from sklearn.neighbors import LocalOutlierFactor
    from sklearn.svm import OneClassSVM

    if name == "iforest":
        return IsolationForest(random_state=seed)
    if name == "lof":
        return LocalOutlierFactor(novelty=True)  # novelty: scores sequences it was not fitted on
    if name == "ocsvm":
        return OneClassSVM()
    raise ValueError(f"unknown detector {name!r}: one of {', '.join(DETECTORS)}")


def detector_scores(X: np.ndarray, fit: np.ndarray, name: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(score, flags) of every row of the counts ``X`` by detector ``name`` fitted on the rows
    ``fit`` (a mask or indexes): loglizer's tf-idf and zero mean fitted on them too, as
    ``count_pca``; score higher = more anomalous, flags the library's own threshold (1 = outlier)."""
    transform, _, _ = pca_detector(X[fit])  # loglizer's tf-idf + zero mean, as count_pca
    Xt = transform(X)
    model = make_detector(name, seed).fit(Xt[fit])
    return -model.score_samples(Xt), (model.predict(Xt) == -1).astype(np.int64)


def count_detector(ds: LabelledDataset, name: str, threshold: dict, normal_only: bool = False, seed: int = 0) -> dict:
    """One detector row (module docstring). ``threshold``: the unlabelled mode's policy on this
    dataset (training.engine.unlabelled.check_threshold's form)."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    from training.engine.unlabelled import policy_threshold
    from training.tasks.metrics import task_metrics

    if ds.task != "binary":
        raise ValueError(f"{ds.name}: {name} needs a binary task, not {ds.task}")
    start = time.perf_counter()
    ids, X, vocab = count_vectors(ds)
    X = X.toarray()
    label_of, split_of = dict(ds.labels.iter_rows()), dict(ds.split.iter_rows())
    y = np.array([ds.class_names.index(label_of[s]) for s in ids])
    part = {p: np.array([split_of[s] == p for s in ids]) for p in SPLITS}
    fit = part["train"] & (y == 0) if normal_only else part["train"]
    score, default = detector_scores(X, fit, name, seed)
    reference = part["dev"] & (y == 0) if normal_only else part["dev"]  # as the unlabelled mode's
    cut = policy_threshold(score[reference], threshold)
    flagged = (score >= cut).astype(np.int64)
    test, dev = part["test"], part["dev"]
    result = task_metrics(y[test], flagged[test], "binary")
    result["dev_f1"] = task_metrics(y[dev], flagged[dev], "binary")["f1"]
    result["f1_default"] = task_metrics(y[test], default[test], "binary")["f1"]
    result["dev_f1_default"] = task_metrics(y[dev], default[dev], "binary")["f1"]
    if len(set(y[test])) == 2:  # threshold-free: how the scores rank the test sequences
        result |= {"roc_auc": float(roc_auc_score(y[test], score[test])),
                   "average_precision": float(average_precision_score(y[test], score[test]))}
    return result | {"seconds": round(time.perf_counter() - start, 3), "threshold": cut, "policy": threshold,
                     "vocab": len(vocab), "n_fit": int(fit.sum())}
