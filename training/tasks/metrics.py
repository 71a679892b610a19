"""Task metrics and the plots that go with them.

* binary (anomaly): precision, recall and F1 of the positive class (index 1). The decision
  threshold on P(positive) is the one that maximises F1 on the dev split; the test split is
  then scored with that threshold.
* multiclass (milestone): micro and macro F1 of the arg-max prediction.
* next_item (retrieval over a catalogue, TVM-KA paper's Instacart task): recall@k for k in
  RANK_KS -- the share of sequences whose true next item is among the k best-scored items (one
  target per sequence, so recall@k is the hit rate at k) -- and the mean reciprocal rank. Metric
  names are ``recall_at_<k>`` and ``mrr`` (MLflow refuses "@" in metric names); the headline is
  recall_at_10, the paper's Table 2 column. Ties are ranked pessimistically (an item scored
  equal to the target counts as ahead of it), so a constant model scores no better than chance.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # headless: plots are written to files and logged to MLflow

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.metrics import (  # noqa: E402
    ConfusionMatrixDisplay,
    average_precision_score,
    f1_score,
    log_loss,
    precision_recall_curve,
    precision_recall_fscore_support,
)

from training.tasks.kinds import get_kind  # noqa: E402


def predict(probs: np.ndarray, task: str, threshold: float = 0.5) -> np.ndarray:
    if task == "binary":
        return (probs[:, 1] >= threshold).astype(np.int64)
    return probs.argmax(axis=1)


def task_metrics(y: np.ndarray, pred: np.ndarray, task: str) -> dict[str, float]:
    """Binary: precision/recall/F1 of the positive class (index 1), plus micro/macro F1 over
    both classes; C-way: micro and macro F1."""
    out = {
        "micro_f1": float(f1_score(y, pred, average="micro")),
        "macro_f1": float(f1_score(y, pred, average="macro", zero_division=0)),
    }
    if task == "binary":
        p, r, f, _ = precision_recall_fscore_support(y, pred, average="binary", zero_division=0)
        out = {"precision": float(p), "recall": float(r), "f1": float(f), **out}
    return out


def constant_class(y_train: np.ndarray, task: str) -> int:
    """The one prediction of a task's floor: class 1 for a binary task (flag-all: every sequence
    positive), the most frequent class of ``y_train`` (labelled train rows) for a C-way one
    (majority; ties to the lower index). The one rule behind :func:`split_floors`, the benches'
    ``always_positive`` row (training.tasks.baselines) and the depth study's floor rows."""
    if task == "binary":
        return 1
    if not len(y_train):
        raise ValueError("a majority floor needs labelled train rows")
    return int(np.bincount(y_train).argmax())


def split_floors(y: np.ndarray, splits: dict[str, np.ndarray], task: str,
                 unlabelled: int = -1) -> dict[str, dict[str, float]]:
    """The floor beside each split's figures ({"dev": ..., "test": ...}): :func:`task_metrics` of a
    constant prediction (:func:`constant_class`) -- every sequence positive for a binary task
    (flag-all: its F1 is what a model must beat; on a balanced task 0.67), the train split's most
    frequent class for a C-way one (majority). Only labelled rows count; {} for a ranking task,
    and for a C-way task without train labels."""
    if get_kind(task).ranks_items:
        return {}
    train = y[splits["train"]] if "train" in splits else y[:0]
    train = train[train != unlabelled]
    if task != "binary" and not len(train):
        return {}
    constant = constant_class(train, task)
    out = {}
    for split in ("dev", "test"):
        labels = y[splits[split]]
        labels = labels[labels != unlabelled]
        if len(labels):
            out[split] = task_metrics(labels, np.full(len(labels), constant), task)
    return out


def below_floor(metrics: dict, floors: dict, task: str, split: str = "dev", what: str | None = None,
                declared: str | None = None) -> str | None:
    """A warning when ``split``'s headline does not beat its floor (:func:`split_floors`), else None;
    ``what`` names the constant prediction when it is not the default one of :func:`constant_class`;
    ``declared``: the catalogue's kind when it differs from the head's ``task`` (an ``anomaly`` task's
    head is binary, and the advice to declare ``multiclass`` is for a declared ``binary`` task only).
    Why (2026-12-07): a balanced table task declared ``binary`` got a dev-fitted threshold for the
    positive class's F1 that called 83 % of the test statements true -- F1 0.660 against 0.674 for
    calling all of them true, accuracy 0.543 (docs/tables.md, "Table tasks")."""
    key = headline(task)
    if split not in floors or key not in metrics.get(split, {}):
        return None
    got, floor = metrics[split][key], floors[split][key]
    if got > floor:
        return None
    what = what or ("flagging every sequence" if task == "binary" else "predicting the train split's most frequent class")
    hint = (" For two balanced classes judged by accuracy declare kind = \"multiclass\" (the more probable"
            " class) instead of binary (a threshold fitted for the positive class's F1)."
            if (declared or task) == "binary" else "")
    return (f"{split} {key} {got:.3f} does not beat {what} ({floor:.3f}): the model adds nothing measurable "
            f"over the class shares.{hint}")


RANK_KS = (1, 5, 10)


def target_ranks(y: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Rank of each true item among all items (1 = best; ties count against the target)."""
    target = scores[np.arange(len(y)), y][:, None]
    return (scores >= target).sum(axis=1)


def ranking_metrics(y: np.ndarray, scores: np.ndarray, ks: tuple[int, ...] = RANK_KS) -> dict[str, float]:
    """Next-item retrieval: y [N] true item ids, scores [N, n_items] -> recall_at_<k> and mrr."""
    if len(y) == 0:
        return {**{f"recall_at_{k}": 0.0 for k in ks}, "mrr": 0.0}
    rank = target_ranks(y, scores)
    out = {f"recall_at_{k}": float((rank <= k).mean()) for k in ks}
    out["mrr"] = float((1.0 / rank).mean())
    return out


def ranking_metrics_of_lists(targets: list[str], top_items: list[list[str]],
                             ks: tuple[int, ...] = RANK_KS) -> dict[str, float]:
    """recall_at_<k> from each sequence's ranked item list (a scored predictions file), and
    ``mrr_at_<K>``: the mean reciprocal rank counting a target beyond the list's K items as 0.
    Each list must hold at least max(ks) items (or the whole catalogue)."""
    n = len(targets)
    rank = np.array([items.index(t) + 1 if t in items else 0 for t, items in zip(targets, top_items)])
    depth = min((len(items) for items in top_items), default=0)
    out = {f"recall_at_{k}": float(((rank >= 1) & (rank <= k)).mean()) if n else 0.0 for k in ks}
    out[f"mrr_at_{depth}"] = float(np.where(rank > 0, 1.0 / np.maximum(rank, 1), 0.0).mean()) if n else 0.0
    return out


def split_metrics(y: np.ndarray, probs: np.ndarray, task: str, threshold: float = 0.5) -> dict[str, float]:
    """The metrics of one split from the model's probabilities [N, n_outputs], for any task."""
    if get_kind(task).ranks_items:
        return ranking_metrics(y, probs)
    return task_metrics(y, predict(probs, task, threshold), task)


def binary_ranking(y: np.ndarray, p_pos: np.ndarray) -> dict[str, float]:
    """Threshold-free figures of P(positive): ``average_precision`` (the area under the PR curve,
    how well positives rank above negatives) and ``log_loss`` (mean cross-entropy, probabilities
    clipped to [1e-7, 1 - 1e-7]). Finer than F1 where F1 sits at the ceiling: they still see a
    confident mistake and how close each block came to the threshold. {} when y lacks a class."""
    if len(y) == 0 or y.min() == y.max():
        return {}
    p = np.clip(p_pos.astype(np.float64), 1e-7, 1 - 1e-7)
    return {"average_precision": float(average_precision_score(y, p)),
            "log_loss": float(log_loss(y, p, labels=[0, 1]))}


def headline(task: str) -> str:
    """The dev metric that picks thresholds, rounds and champions."""
    return get_kind(task).headline  # training.tasks.kinds


def plot_confusion(y: np.ndarray, pred: np.ndarray, class_names: list[str], path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ConfusionMatrixDisplay.from_predictions(
        y, pred, labels=list(range(len(class_names))), display_labels=class_names, ax=ax, colorbar=False
    )
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_pr_curve(y: np.ndarray, p_pos: np.ndarray, threshold: float, path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(4.5, 4))
    if y.sum() > 0:
        precision, recall, thresholds = precision_recall_curve(y, p_pos)
        ax.plot(recall, precision, label="PR curve")
        i = int(np.argmin(np.abs(thresholds - threshold))) if len(thresholds) else 0
        ax.scatter([recall[i]], [precision[i]], color="red", zorder=3, label=f"threshold {threshold:.3f}")
        ax.legend(loc="lower left")
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_losses(history: dict[str, list[tuple[int, float]]], path, title: str) -> None:
    """One panel per loss series: (global step, value) pairs."""
    names = [n for n, pts in history.items() if pts]
    fig, axes = plt.subplots(1, max(len(names), 1), figsize=(4.5 * max(len(names), 1), 3.5), squeeze=False)
    for ax, name in zip(axes[0], names):
        steps, values = zip(*history[name])
        ax.plot(steps, values)
        ax.set_title(name)
        ax.set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_recall_at_k(y: np.ndarray, scores: np.ndarray, path, title: str, max_k: int = 20) -> None:
    """Next item: recall@k for k = 1..max_k (the share of targets among the k best items)."""
    ks = np.arange(1, min(max_k, scores.shape[1]) + 1)
    if len(y):
        rank = target_ranks(y, scores)
        recall = [(rank <= k).mean() for k in ks]
    else:
        recall = [0.0] * len(ks)
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.plot(ks, recall, marker="o")
    ax.set_xlabel("k")
    ax.set_ylabel("recall@k")
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_score_histogram(scores: np.ndarray, labels: list[str], path, title: str) -> None:
    """Scores of a batch-scored day, one stacked colour per predicted label."""
    fig, ax = plt.subplots(figsize=(5, 3.5))
    names = sorted(set(labels))
    if names:
        groups = [scores[np.array(labels) == n] for n in names]
        ax.hist(groups, bins=np.linspace(0, 1, 41), stacked=True, label=names)
        ax.legend(loc="upper center")
    ax.set_xlabel("score")
    ax.set_ylabel("sequences")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
