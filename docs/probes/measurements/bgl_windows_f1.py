"""Probe (2026-12-07, docs/training.md "The label-free rule on made-up streams"): BGL_2k's own line
labels read against the windows the README's unlabelled block scored (loghub_share.sh's folder
share-BGL): a 600 s window is anomalous when it holds an alert line (first field not "-"); its id
is the one ingest gives the line (parsers.sessions.SessionSpec, the header's local time). Prints ROC AUC,
flag-all F1 and the F1 and share of the label-free rule at two spread floors. Usage:

    python bgl_windows_f1.py share-BGL ../shared/data/loghub/BGL/BGL_2k.log
"""

import datetime as dt
import glob
import sys
from pathlib import Path

import numpy as np
import polars as pl
from sklearn.metrics import f1_score, roc_auc_score

from parsers.sessions import SessionSpec
from seqenc.surprise import probability_score

sys.path.insert(0, str(Path(__file__).parent.parent))
from label_free_rules import clamped  # noqa: E402

folder, log = sys.argv[1], sys.argv[2]
windows = SessionSpec(window_s=600)  # the README block's window
alerts = set()
for line in open(log):
    fields = line.split()
    if fields[0] != "-":
        alerts.update(windows.sequence_ids({}, "", dt.datetime.strptime(fields[4][:19], "%Y-%m-%d-%H.%M.%S")))
p = pl.read_parquet(glob.glob(f"{folder}/pred/*/part-0.parquet"))
y, score = np.array([s in alerts for s in p["sequence_id"]]), probability_score(p["score"].to_numpy())
print(f"{len(y)} windows, {y.sum()} with an alert; ROC AUC {roc_auc_score(y, score):.3f}; "
      f"flag-all F1 {f1_score(y, np.ones_like(y)):.3f}")
for floor in (0.713, 1.5):
    flagged = score > clamped(floor)(score)
    print(f"floor {floor}: flagged {flagged.mean():.3f}, F1 {f1_score(y, flagged):.3f}")
