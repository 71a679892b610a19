"""Probe (docs/training.md, "Measurements are not ids"): day 2 of the runs of run.sh (folders
STREAM-TAG): ROC AUC, average precision, what the label-free rule flagged, its F1. Usage:

    python f1.py checkout-new jobs-new ...
"""

import sys

import polars as pl
from sklearn.metrics import average_precision_score, roc_auc_score

for run in sys.argv[1:]:
    stream = run.split("-")[0]
    p = pl.read_parquet(f"{run}/pred/date=2026-05-02/part-0.parquet").join(
        pl.read_csv(f"{stream}-2026-05-02.csv").rename({"session": "sequence_id"}), on="sequence_id")
    y, flagged = (p["verdict"] == "bad").to_numpy(), (p["label"] == "bad").to_numpy()
    tp = int((y & flagged).sum())
    precision, recall = tp / max(int(flagged.sum()), 1), tp / int(y.sum())
    f1 = 2 * precision * recall / max(precision + recall, 1e-9)
    print(f"{run:16s} AUC {roc_auc_score(y, p['score']):.3f} AP {average_precision_score(y, p['score']):.3f} "
          f"flagged {flagged.sum()} ({100 * flagged.mean():.1f}%) of {y.sum()} bad: tp {tp} F1 {f1:.3f}")
