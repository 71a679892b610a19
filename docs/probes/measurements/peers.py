"""Probe (2026-12-07, docs/training.md "The label-free rule on made-up streams"): the unsupervised
peers on gen.py's streams, judged as the label-free rule is -- fitted on day 1 without labels,
day 2 flagged by each library's own threshold -- beside flagging every sequence. Usage, in the
folder of gen.py's files:

    python peers.py checkout jobs logins api pumps

What they read: per session, the counts of each (field, value) pair of the fields with at most 50
distinct values on day 1 (the stream's event types -- ``action``, ``step``, ``endpoint`` -- and
its other categorical fields: ``queue``, ``country``, ``status``, ...), tf-idf weighted and centred
as loglizer's FeatureExtractor does (training.bench.detectors, the bench's own peers, which read the
event counts alone). Fields of many distinct values (amounts, durations, latencies, ids) are
not counts a count model can read; that is the point of these streams.
"""

import json
import sys
from collections import Counter

import numpy as np
from sklearn.metrics import f1_score, roc_auc_score

from training.bench.detectors import DETECTORS, detector_scores, pca_detector

SKIP = {"session", "at"}


def sessions(path: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for line in open(path):
        event = json.loads(line)
        out.setdefault(event["session"], []).append(event)
    return out


def main(stream: str) -> None:
    days = [sessions(f"{stream}-2026-05-0{d}.jsonl") for d in (1, 2)]
    distinct: dict[str, set] = {}
    for events in days[0].values():
        for e in events:
            for k, v in e.items():
                if k not in SKIP:
                    distinct.setdefault(k, set()).add(str(v))
    fields = sorted(k for k, v in distinct.items() if len(v) <= 50)
    vocab = sorted({(k, v) for k in fields for v in distinct[k]})
    col = {pair: i for i, pair in enumerate(vocab)}
    rows = []
    for day in days:
        for events in day.values():
            c = Counter((k, str(e[k])) for e in events for k in fields if k in e)
            row = np.zeros(len(vocab))
            for pair, n in c.items():
                if pair in col:
                    row[col[pair]] = n
            rows.append(row)
    X, n1 = np.array(rows), len(days[0])
    labels = dict(line.strip().split(",") for line in open(f"{stream}-2026-05-02.csv").readlines()[1:])
    y = np.array([labels[s] == "bad" for s in days[1]])
    fit = np.arange(n1)
    print(f"{stream}: {len(vocab)} count columns from {fields}; day 2 {len(y)} sessions, {y.sum()} bad; "
          f"flag-all F1 {f1_score(y, np.ones_like(y)):.3f}")
    for name in DETECTORS:
        score, flags = detector_scores(X, fit, name, seed=0)
        s, f = score[n1:], flags[n1:].astype(bool)
        print(f"  {name:7s} ROC AUC {roc_auc_score(y, s):.3f}  flagged {f.mean():.3f}  F1 (library threshold) "
              f"{f1_score(y, f):.3f}")
    transform, spe, q = pca_detector(X[fit])
    s = spe(transform(X))[n1:]
    print(f"  {'pca':7s} ROC AUC {roc_auc_score(y, s):.3f}  flagged {(s > q).mean():.3f}  F1 (Q limit) "
          f"{f1_score(y, s > q):.3f}")


if __name__ == "__main__":
    for stream in sys.argv[1:]:
        main(stream)
