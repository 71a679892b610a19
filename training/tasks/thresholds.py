"""Binary decision thresholds fitted on dev: the rules, and a dev-only way to compare them.

A binary model outputs P(positive); the threshold that turns it into a decision is fitted on the
dev split. With few dev positives the threshold that maximises dev F1 sits on a cliff: it is the
score of the lowest-scored flagged positive, and the next stream's positives need not clear it.
A checkout stream tried as a new user would (issue 50) had 32 dev positives; the dev-best
threshold was 0.9993 and gave test F1 0.596, where 0.5 gave 0.89.

``THRESHOLD_RULES`` (one registry; TrainConfig.threshold_rule names one, the CLI and the bench
list them from here):

* ``best_f1``: the highest-F1 threshold on dev (ties: the highest), the earlier default;
* ``one_se``: Breiman's one-standard-error rule on the F1 curve -- every threshold whose dev F1
  is within one standard error of the best, and of those the one nearest 0.5 (in logit; 0.5
  itself when its F1 is in the band). The error treats F1 as a proportion over the n_pos dev
  positives, with Agresti and Coull's adjustment so that a perfect dev F1 still has one:
  f = (F1 n_pos + 2) / (n_pos + 4), SE = sqrt(f (1 - f) / (n_pos + 4)).
  Few positives: a wide band, and the model's own decision (a cross-entropy model's 0.5) stands;
  many positives: the band narrows to the best. A score without a decision of its own (``pivot``
  None: the KA combined with the masked-LM surprise, seqenc.surprise, is 0.5 or more for nearly
  every sequence, so "nearest 0.5" was the band's lowest threshold) takes the band's median
  threshold instead (in rank, so the score's scale plays no part): a step back from the best's
  cliff without sliding to the band's low end, where most normal sequences sit;
* ``half``: 0.5, the model's own decision, nothing fitted.

A dev without positives gives no F1 curve: ``best_f1`` and ``one_se`` keep the pivot there, and a
score without one flags only what scores above every (negative) dev sequence.

:func:`cv_f1` compares rules on dev alone: dev is cut in two halves (stratified), a rule is
fitted on one and scored on the other, both ways, over ``CV_REPEATS`` cuts. The default rule is
the one with the best mean of that figure on the bench's dev splits (docs/training.md,
"Binary thresholds"); test splits play no part.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from sklearn.metrics import f1_score, precision_recall_curve

from training.tasks.kinds import KINDS


def _f1_curve(y: np.ndarray, p_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(thresholds, F1 at each): every distinct score as a threshold, ascending."""
    precision, recall, thresholds = precision_recall_curve(y, p_pos)
    f1 = 2 * precision * recall / np.maximum(precision + recall, 1e-12)
    return thresholds, f1[:-1]  # the curve's last point has no threshold


def _without_positives(p_pos: np.ndarray, pivot: float | None) -> float:
    """The threshold when dev holds no positive, so no F1 can be read: the score's own decision
    (``pivot``); a score without one (``pivot`` None, a combined surprise score at 0.5 or more
    for nearly every sequence) flags only what scores above every dev sequence, all of them
    negatives -- 0.5 there would flag nearly everything."""
    if pivot is not None:
        return pivot
    if len(p_pos) == 0:
        return 0.5
    return float(np.nextafter(np.max(p_pos), np.inf))


def best_f1(y: np.ndarray, p_pos: np.ndarray, pivot: float | None = 0.5) -> float:
    """The threshold on P(positive) with the highest F1 (ties: the highest threshold)."""
    if y.sum() == 0:
        return _without_positives(np.asarray(p_pos, dtype=np.float64), pivot)
    thresholds, f1 = _f1_curve(y, p_pos)
    return float(thresholds[np.flatnonzero(f1 == f1.max())[-1]])


def _logit(p: np.ndarray | float) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-12, 1 - 1e-12)
    return np.log(p) - np.log1p(-p)


def one_se(y: np.ndarray, p_pos: np.ndarray, pivot: float | None = 0.5) -> float:
    """Breiman's one-standard-error rule on the dev F1 curve (module docstring): of the
    thresholds in the band, ``pivot`` itself or the one nearest it in logit; ``pivot`` None, the
    band's median threshold."""
    y, p_pos = np.asarray(y), np.asarray(p_pos, dtype=np.float64)
    n_pos = int(y.sum())
    if n_pos == 0:
        return _without_positives(p_pos, pivot)
    thresholds, f1 = _f1_curve(y, p_pos)
    best = float(f1.max())
    adjusted = (best * n_pos + 2.0) / (n_pos + 4.0)  # Agresti-Coull: a perfect F1 keeps an error
    band = best - math.sqrt(adjusted * (1.0 - adjusted) / (n_pos + 4.0))
    inside = thresholds[f1 >= band]  # ascending
    if pivot is None:
        return float(inside[(len(inside) - 1) // 2])
    if f1_score(y, p_pos >= pivot, zero_division=0) >= band:
        return pivot
    return float(inside[np.argmin(np.abs(_logit(inside) - _logit(pivot)))])


def half(y: np.ndarray, p_pos: np.ndarray, pivot: float | None = 0.5) -> float:
    """0.5: the model's own decision; dev is not read."""
    return 0.5


# the binary kind names the rules a user may give and its default (training.tasks.kinds); each
# name maps to its function here
_FUNCTIONS = {"best_f1": best_f1, "one_se": one_se, "half": half}
THRESHOLD_RULES: dict[str, Callable[..., float]] = {
    name: _FUNCTIONS[name] for name in KINDS["binary"].threshold_policies}
DEFAULT_RULE = KINDS["binary"].default_threshold["policy"]
CV_REPEATS = 10


def check_rule(name: str) -> str:
    if name not in THRESHOLD_RULES:
        raise ValueError(f"unknown threshold rule {name!r}: one of {', '.join(THRESHOLD_RULES)}")
    return name


def fit_threshold(rule: str, y: np.ndarray, p_pos: np.ndarray, pivot: float | None = 0.5) -> float:
    """The threshold ``rule`` fits on (dev) labels ``y`` and P(positive) ``p_pos``. ``pivot``:
    the score's own decision (0.5 for a model's probability), None for a score without one (a
    combined surprise score): read by ``one_se`` only (module docstring)."""
    return THRESHOLD_RULES[check_rule(rule)](np.asarray(y), np.asarray(p_pos, dtype=np.float64), pivot)


def cv_f1(rule: str, y: np.ndarray, p_pos: np.ndarray, repeats: int = CV_REPEATS, seed: int = 0,
          pivot: float | None = 0.5) -> float | None:
    """Mean F1 of ``rule`` fitted on one stratified half of dev and scored on the other (both
    ways, ``repeats`` cuts, a fixed seed): a figure to compare rules on dev alone. None when dev
    has fewer than 2 positives or 2 negatives (no half would hold one)."""
    y, p_pos = np.asarray(y), np.asarray(p_pos, dtype=np.float64)
    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    if len(pos) < 2 or len(neg) < 2:
        return None
    rng = np.random.default_rng(seed)
    scores = []
    for _ in range(repeats):
        a = np.concatenate([rng.permutation(pos)[: len(pos) // 2], rng.permutation(neg)[: len(neg) // 2]])
        b = np.setdiff1d(np.arange(len(y)), a)
        for fit, held in ((a, b), (b, a)):
            cut = fit_threshold(rule, y[fit], p_pos[fit], pivot)
            scores.append(f1_score(y[held], p_pos[held] >= cut, zero_division=0))
    return float(np.mean(scores))


def rule_fields(y_dev: np.ndarray, p_dev: np.ndarray, y_test: np.ndarray, p_test: np.ndarray,
                pivot: float | None = 0.5) -> dict:
    """Per rule of THRESHOLD_RULES: ``dev_cv_f1_<rule>`` (:func:`cv_f1`, dev alone: the figure a
    rule is chosen by) and ``f1_<rule>`` (test F1 at the threshold the rule fits on all of dev):
    a binary bench row's threshold comparison."""
    out = {}
    for rule in THRESHOLD_RULES:
        out[f"dev_cv_f1_{rule}"] = cv_f1(rule, y_dev, p_dev, pivot=pivot)
        cut = fit_threshold(rule, y_dev, p_dev, pivot)
        out[f"f1_{rule}"] = float(f1_score(y_test, np.asarray(p_test) >= cut, zero_division=0))
    return out
