"""The count baselines: the simple peers every task kind's figures stand beside (training.tasks.kinds,
``baseline``), on a training.tasks.dataset.LabelledDataset. The product reports them (``seqenc demo``'s
summary, training.serving.evaluate.count_baseline_metrics); ``seqenc bench accuracy`` adds them as rows.

* :func:`count_baseline` -- logistic regression on event-count vectors (the count vector of a
  sequence: how often each ``event_key`` value seen in train occurs in it), trained on train,
  scored on test: the simplest supervised model. On :func:`value_count_dataset` of a dataset it
  counts every key=value pair of the keys S(k) reads instead (``count_lr_values`` in the bench,
  the demo's "counts LR"): the same input TVM-KA reads, as a bag;
* :func:`count_pca` -- loglizer's unsupervised PCA detector on the same counts (no label read;
  ``normal_only`` fits it on the normal train sequences, DeepLog's setting);
* :func:`always_positive` -- every sequence flagged: the floor a detector must beat.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import polars as pl

from training.tasks.dataset import SPLITS, LabelledDataset
from training.tasks.kinds import get_kind
from training.tasks.thresholds import DEFAULT_RULE, fit_threshold, rule_fields

# --------------------------------------------------------------------------- count baseline


COUNT_KEY = "count"  # the one key of value_count_dataset's objects


def value_count_dataset(ds: LabelledDataset) -> LabelledDataset:
    """``ds`` with every ``key=value`` pair of the keys S(k) reads (``exclude_keys`` left out) as
    one countable event under the key ``count``: the count baselines then read every value, as
    TVM-KA does, not only the event key's. A missing value counts as ``key=``."""
    objects = (ds.objects.filter(~pl.col("key").is_in(list(ds.exclude_keys)))
               .with_columns((pl.col("key") + "=" + pl.col("value").fill_null("")).alias("value"),
                             pl.lit(COUNT_KEY).alias("key")))
    return dataclasses.replace(ds, objects=objects, event_key=COUNT_KEY, exclude_keys=())


def count_vectors(ds: LabelledDataset):
    """Per sequence (sorted ids), counts of each ``event_key`` value seen in train, as a sparse
    matrix (values of every key can number in the hundreds of thousands); -> (ids, X, vocab)."""
    from sklearn.feature_extraction import DictVectorizer

    ids = ds.split.sort("sequence_id")["sequence_id"].to_list()
    events = ds.objects.filter(pl.col("key") == ds.event_key).select("sequence_id", "value")
    counts = {s: {} for s in ids}
    for s, v, n in events.group_by("sequence_id", "value").len().iter_rows():
        if s in counts:
            counts[s][v] = n
    train = set(ds.split.filter(pl.col("split") == "train")["sequence_id"].to_list())
    vectorizer = DictVectorizer(dtype=np.float64, sparse=True, sort=True)
    vectorizer.fit([counts[s] for s in ids if s in train])  # the vocabulary: values seen in train
    return ids, vectorizer.transform([counts[s] for s in ids]).tocsr(), list(vectorizer.feature_names_)


def count_baseline(ds: LabelledDataset, seed: int = 0, rule: str = DEFAULT_RULE) -> dict:
    """Logistic regression on event-count vectors, trained on train, scored on test.

    Binary: the threshold on P(Anomaly) that ``rule`` fits on dev (training.tasks.thresholds; the
    trainers' default, like for like), plus every rule's ``dev_cv_f1_<rule>`` / ``f1_<rule>``;
    precision / recall / f1 of the Anomaly class plus macro / micro F1. Multiclass: arg-max
    prediction; macro / micro F1 (precision, recall, f1 are None). Next item: items ranked by
    the predicted probability (a catalogue item never a train target scores 0); recall@k and
    MRR. ``dev_<headline>`` (dev_f1, dev_macro_f1 or dev_recall_at_10): the same metric on dev
    (binary: at the dev-fitted threshold, so the best F1 on dev; binary adds test
    ``average_precision`` and ``dev_average_precision`` / ``dev_log_loss``). ``seconds``: vectorising,
    fitting and predicting."""
    from sklearn.linear_model import LogisticRegression

    from training.tasks.metrics import (
        binary_ranking,
        headline,
        predict,
        ranking_metrics,
        split_metrics,
        task_metrics,
    )

    start = time.perf_counter()
    ids, X, vocab = count_vectors(ds)
    label_of = dict(ds.labels.iter_rows())
    split_of = dict(ds.split.iter_rows())
    y = np.array([ds.class_names.index(label_of[s]) for s in ids])
    part = {name: np.array([split_of[s] == name for s in ids]) for name in SPLITS}
    clf = LogisticRegression(class_weight="balanced", max_iter=5000, random_state=seed)
    clf.fit(X[part["train"]], y[part["train"]])

    def probs(mask: np.ndarray) -> np.ndarray:  # columns = every class, also one missing from train
        out = np.zeros((int(mask.sum()), len(ds.class_names)))
        out[:, clf.classes_] = clf.predict_proba(X[mask])
        return out

    test_probs, dev_probs = probs(part["test"]), probs(part["dev"])
    result: dict = {"precision": None, "recall": None, "f1": None, "threshold": None}
    threshold = fit_threshold(rule, y[part["dev"]], dev_probs[:, 1]) if ds.task == "binary" else 0.5
    key = headline(ds.task)
    dev = split_metrics(y[part["dev"]], dev_probs, ds.task, threshold)
    if ds.task == "binary":
        dev |= binary_ranking(y[part["dev"]], dev_probs[:, 1])
    result |= {f"dev_{k}": dev.get(k) for k in (key, "micro_f1", "average_precision", "log_loss") if k in dev}
    if ds.task == "binary":
        pred = predict(test_probs, "binary", threshold)
        result.update(task_metrics(y[part["test"]], pred, "binary"), threshold=threshold,
                      **binary_ranking(y[part["test"]], test_probs[:, 1]),
                      **rule_fields(y[part["dev"]], dev_probs[:, 1], y[part["test"]], test_probs[:, 1]))
    elif get_kind(ds.task).ranks_items:
        result.update(ranking_metrics(y[part["test"]], test_probs), micro_f1=None, macro_f1=None)
    else:
        pred = predict(test_probs, "multiclass")
    if not get_kind(ds.task).ranks_items:
        result.update(task_metrics(y[part["test"]], pred, "multiclass"))
    result.update(seconds=round(time.perf_counter() - start, 3), vocab=len(vocab),
                  n_train=int(part["train"].sum()), n_test=int(part["test"].sum()))
    return result


def always_positive(ds: LabelledDataset) -> dict:
    """The floor of a binary dataset: every sequence predicted positive (``class_names[1]``,
    Anomaly). Test precision = the test prevalence, recall 1, F1 = 2p / (1 + p); the negative
    class's F1 is 0, so macro F1 = F1 / 2; micro F1 = accuracy = p. ``dev_f1`` likewise on dev;
    ``average_precision`` (test and dev) of the constant score is the prevalence too."""
    from training.tasks.metrics import binary_ranking, split_floors

    if ds.task != "binary":
        raise ValueError(f"{ds.name}: always_positive needs a binary task, not {ds.task}")
    start = time.perf_counter()
    rows = ds.split.join(ds.labels, on="sequence_id")
    y = (rows["label"] == ds.class_names[1]).to_numpy().astype(np.int64)
    parts = rows["split"].to_numpy()
    floors = split_floors(y, {s: np.flatnonzero(parts == s) for s in ("train", "dev", "test")}, "binary")
    result = dict(floors["test"]) | {"dev_f1": floors["dev"]["f1"]}
    for prefix, part in (("", "test"), ("dev_", "dev")):
        labels = y[parts == part]
        result[f"{prefix}average_precision"] = binary_ranking(labels, np.ones(len(labels))).get("average_precision")
    return result | {"seconds": round(time.perf_counter() - start, 3)}


# --------------------------------------------------------------------------- unsupervised count baseline

PCA_VARIANCE = 0.95  # loglizer PCA(n_components=0.95): components explaining 95 % of the variance
PCA_C_ALPHA = 3.2905  # loglizer's c_alpha for alpha = 0.001 (the standard normal 1 - alpha quantile)


def pca_detector(X_fit: np.ndarray, variance: float = PCA_VARIANCE, c_alpha: float = PCA_C_ALPHA):
    """loglizer's PCA detector (Xu et al., SOSP 2009; logpai/loglizer FeatureExtractor + PCA),
    fitted on the count rows ``X_fit`` without labels -> ``(transform, spe, threshold)``:
    ``transform``: tf-idf (idf = log(n / (df + 1e-8))) then zero-mean, as fitted; ``spe``: the
    squared norm of a transformed row outside the normal subspace (the top components of
    X^T X / n explaining ``variance``); ``threshold``: Jackson and Mudholkar's (1979) Q limit on
    the left-out eigenvalues, phi_i = sum lambda_j^i, h0 = 1 - 2 phi_1 phi_3 / (3 phi_2^2),
    Q = phi_1 (c_alpha sqrt(2 phi_2 h0^2) / phi_1 + 1 + phi_2 h0 (h0 - 1) / phi_1^2)^(1 / h0);
    SPE > Q is anomalous. No left-out eigenvalue (phi_1 = 0): +inf, where loglizer divides by 0."""
    n = len(X_fit)
    idf = np.log(n / ((X_fit > 0).sum(0) + 1e-8))
    mean = (X_fit * idf).mean(0)

    def transform(X: np.ndarray) -> np.ndarray:
        return X * idf - mean

    Xt = transform(X_fit)
    U, sigma, _ = np.linalg.svd(Xt.T @ Xt / float(n))
    total, k = sigma.sum(), len(sigma)
    if total > 0:
        k = int(np.searchsorted(np.cumsum(sigma) / total, variance - 1e-12)) + 1
    P = U[:, :min(k, len(sigma))]
    proj = np.eye(len(sigma)) - P @ P.T
    phi = [float((sigma[k:] ** i).sum()) for i in (1, 2, 3)]
    threshold = float("inf")
    if phi[0] > 0 and phi[1] > 0:
        h0 = 1.0 - 2 * phi[0] * phi[2] / (3.0 * phi[1] ** 2)
        threshold = float(phi[0] * (c_alpha * np.sqrt(2 * phi[1] * h0 * h0) / phi[0] + 1.0
                                    + phi[1] * h0 * (h0 - 1) / phi[0] ** 2) ** (1.0 / h0))

    def spe(Xt: np.ndarray) -> np.ndarray:
        r = Xt @ proj.T
        return (r * r).sum(1)

    return transform, spe, threshold


def count_pca(ds: LabelledDataset, normal_only: bool = False) -> dict:
    """loglizer's PCA detector (:func:`pca_detector`) on event-count vectors (:func:`count_vectors`:
    events seen in train), fitted on the train sequences *without labels* (``normal_only``: on
    the train sequences labelled normal, as DeepLog's setting reads them), threshold from the
    Q-statistic (alpha = 0.001), nothing chosen on dev. Binary datasets. Precision / recall / f1
    of the Anomaly class, macro / micro F1 on test; ``dev_f1`` the same on dev; ``seconds``."""
    from training.tasks.metrics import task_metrics

    if ds.task != "binary":
        raise ValueError(f"{ds.name}: count_pca needs a binary task, not {ds.task}")
    start = time.perf_counter()
    ids, X, vocab = count_vectors(ds)
    X = X.toarray()  # PCA on dense rows (event counts: a small vocabulary)
    label_of, split_of = dict(ds.labels.iter_rows()), dict(ds.split.iter_rows())
    y = np.array([ds.class_names.index(label_of[s]) for s in ids])
    part = {name: np.array([split_of[s] == name for s in ids]) for name in SPLITS}
    fit = part["train"] & (y == 0) if normal_only else part["train"]
    transform, spe, threshold = pca_detector(X[fit])
    flagged = {name: (spe(transform(X[part[name]])) > threshold).astype(np.int64) for name in ("dev", "test")}
    result = task_metrics(y[part["test"]], flagged["test"], "binary")
    result["dev_f1"] = task_metrics(y[part["dev"]], flagged["dev"], "binary")["f1"]
    return result | {"seconds": round(time.perf_counter() - start, 3), "threshold": threshold, "vocab": len(vocab),
                     "n_fit": int(fit.sum())}
