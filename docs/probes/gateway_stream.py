"""Probe (2026-12-07, docs/training.md "A labelled stream whose attacks live in values"): a made-up
API gateway stream, as a new user would bring it, and the figures of its trial.

``make``: three days of sessions as JSON events (``d1.jsonl`` 900, ``d2.jsonl`` 500, ``d3.jsonl``
400 sessions; login, 2-6 page calls, sometimes an export, logout) with labels (``l1.csv`` ...):
``attack`` for credential stuffing (6-13 failed logins, status 401, 4 %) or exfiltration (an
export of 2-9 MB where normal exports are 20-90 kB, 4 %: only the ``bytes`` value tells), else
``ok``. ``measure ROOT=PREDICTIONS ...``: per later day, each run's ranking (ROC AUC, average
precision), its own flags (F1, share, and which attacks), beside a logistic regression on the
route and status counts fitted on day 1 and flagging every session. Labels only measure.

    python docs/probes/gateway_stream.py make DIR
    python docs/probes/gateway_stream.py measure DIR "binary, defaults=work/predictions/attacks" ...
"""
import collections
import csv
import functools
import json
import random
import sys
from datetime import datetime, timedelta
from pathlib import Path

DAYS = [(900, "2026-05-01"), (500, "2026-05-02"), (400, "2026-05-03")]
PAGES = ["/items", "/items/{id}", "/cart", "/search"]


def make_day(n: int, seed: int, date: str, events: Path, labels: Path) -> None:
    rnd = random.Random(seed)
    start = datetime.fromisoformat(date + "T00:00:00")
    with events.open("w") as f, labels.open("w") as g:
        g.write("session_ref,verdict\n")
        for s in range(n):
            sid = f"{date}-s{s:05d}"
            kind = rnd.choices(["ok", "stuffing", "exfil"], [0.92, 0.04, 0.04])[0]
            t = start + timedelta(seconds=rnd.randint(0, 86000))
            calls = [("/login", 401 if kind == "stuffing" else 200)]
            if kind == "stuffing":
                calls += [("/login", 401)] * rnd.randint(5, 12) + [("/login", 200)]
            calls += [(rnd.choice(PAGES), rnd.choice([200] * 9 + [404])) for _ in range(rnd.randint(2, 6))]
            if kind == "exfil" or rnd.random() < 0.2:
                calls.append(("/export", 200))
            calls.append(("/logout", 200))
            for route, status in calls:
                t += timedelta(milliseconds=rnd.randint(50, 3000))
                size = rnd.randint(300, 4000)
                if route == "/export":
                    size = rnd.randint(2_000_000, 9_000_000) if kind == "exfil" else rnd.randint(20_000, 90_000)
                f.write(json.dumps({"sess": {"id": sid}, "ts": t.isoformat(), "route": route, "status": status,
                                    "latency_ms": rnd.randint(5, 400), "bytes": size}) + "\n")
            g.write(f"{sid},{'ok' if kind == 'ok' else 'attack'}\n")


@functools.cache  # each day's file is read once, however many runs are measured
def _labels(folder: Path, d: int) -> dict[str, bool]:
    return {r["session_ref"]: r["verdict"] == "attack" for r in csv.DictReader((folder / f"l{d}.csv").open())}


@functools.cache
def _counts(folder: Path, d: int) -> dict[str, collections.Counter]:
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in (folder / f"d{d}.jsonl").open():
        e = json.loads(line)
        c = out[e["sess"]["id"]]
        c[f"route={e['route']}"] += 1
        c[f"status={e['status']}"] += 1
        c["huge_export"] += e["route"] == "/export" and e["bytes"] > 1_000_000
    return out


def measure(folder: Path, runs: dict[str, str]) -> None:
    import numpy as np
    import polars as pl
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import average_precision_score, f1_score, roc_auc_score

    for name, path in runs.items():
        for d in (2, 3):
            p = pl.read_parquet(folder / path / f"date={DAYS[d - 1][1]}" / "part-0.parquet")
            truth, counts = _labels(folder, d), _counts(folder, d)
            y = np.array([truth[s] for s in p["sequence_id"]])
            flagged = np.array([label in ("attack", "anomaly") for label in p["label"]])
            exfil = np.array([counts[s]["huge_export"] > 0 for s in p["sequence_id"]])
            stuffing = np.array([counts[s]["status=401"] > 0 for s in p["sequence_id"]])
            print(f"| {name} | {d} | {roc_auc_score(y, p['score']):.3f} | {average_precision_score(y, p['score']):.3f} | "
                  f"{f1_score(y, flagged):.3f} | {flagged.mean():.1%} | {flagged[stuffing].sum()} of {stuffing.sum()} | "
                  f"{flagged[exfil].sum()} of {exfil.sum()} |")
    keys = sorted({k for d in (1, 2, 3) for c in _counts(folder, d).values() for k in c if k != "huge_export"})

    def table(d: int):
        counts, truth = _counts(folder, d), _labels(folder, d)
        return np.array([[counts[s][k] for k in keys] for s in sorted(counts)]), np.array([truth[s] for s in sorted(counts)])

    lr = LogisticRegression(max_iter=2000).fit(*table(1))
    for d in (2, 3):
        X, y = table(d)
        p = lr.predict_proba(X)[:, 1]
        print(f"| counts LR (route and status counts, fitted on day 1) | {d} | {roc_auc_score(y, p):.3f} | "
              f"{average_precision_score(y, p):.3f} | {f1_score(y, p > 0.5):.3f} (at 0.5) | {(p > 0.5).mean():.1%} | | |")
        print(f"| flag all | {d} | | | {f1_score(y, np.ones_like(y)):.3f} | 100% | | |")


if __name__ == "__main__":
    command, where = sys.argv[1], Path(sys.argv[2])
    if command == "make":
        where.mkdir(parents=True, exist_ok=True)
        for i, (n, date) in enumerate(DAYS):
            make_day(n, 100 + i, date, where / f"d{i + 1}.jsonl", where / f"l{i + 1}.csv")
    else:
        measure(where, dict(arg.split("=", 1) for arg in sys.argv[3:]))
