"""Probe (2026-12-07, docs/training.md "Tail bins"): a second made-up stream, written before any
figure of the tail bins was seen, to check a binary default on anomalies nothing was chosen on.

``make``: three days of shop checkouts as JSON events (``d1.jsonl`` 900, ``d2.jsonl`` 500,
``d3.jsonl`` 400 sessions; open, 1-5 items with ``price`` 2.00-80.00 and ``qty`` 1-3, a payment of
their ``amount``, close) with labels (``l1.csv`` ...): ``fraud`` for three kinds, each about 3 %,
else ``legit``:

- **card testing**: 5-12 declined payments of 0.50-1.99 before the real one (counts see it);
- **price tampering**: one item's ``price`` is 0.01-0.09 (a magnitude below every normal price;
  the payment's amount follows it, so it is ordinary);
- **resale bulk**: one item's ``qty`` is 40-90 (normal 1-3) and the amount follows.

``measure ROOT=PREDICTIONS ...``: per later day, each run's ranking (ROC AUC, average precision),
its own flags (F1, share, and which kind, from ``k1.csv`` ...), beside a logistic regression on the event and status
counts fitted on day 1, and flagging every session. Labels only measure.

    python docs/probes/checkout_stream.py make DIR
    python docs/probes/checkout_stream.py measure DIR "binary, defaults=work/predictions/fraud" ...
"""
import collections
import csv
import functools
import json
import random
import sys
from datetime import datetime, timedelta
from pathlib import Path

DAYS = [(900, "2026-06-01"), (500, "2026-06-02"), (400, "2026-06-03")]
KINDS = ["legit", "testing", "tamper", "bulk"]


def write_day(n: int, seed: int, date: str, events: Path, labels: Path, *, id_field: str, label_field: str,
              kinds: list[str], positive: str, prefix: str, day_seconds: int, step, session) -> None:
    """``n`` sequences of one day as JSON events (``session(rnd, kind)``: the event rows, each
    ``step(rnd)`` after the last), their labels in ``labels`` (``id_field``,``label_field``: what
    seqenc reads; ``kinds[0]`` or ``positive``) and their kinds beside it in ``k*.csv`` (measure
    only); each kind but the first about 3 %. Also serves docs/probes/sensor_stream.py."""
    rnd = random.Random(seed)
    start = datetime.fromisoformat(date + "T00:00:00")
    with events.open("w") as f, labels.open("w") as g, labels.with_name("k" + labels.name[1:]).open("w") as h:
        g.write(f"{id_field},{label_field}\n")
        h.write(f"{id_field},kind\n")
        for s in range(n):
            sid = f"{date}-{prefix}{s:05d}"
            kind = rnd.choices(kinds, [0.91, 0.03, 0.03, 0.03])[0]
            t = start + timedelta(seconds=rnd.randint(0, day_seconds))
            for row in session(rnd, kind):
                t += step(rnd)
                f.write(json.dumps({id_field: sid, "at": t.isoformat(), **row}) + "\n")
            g.write(f"{sid},{kinds[0] if kind == kinds[0] else positive}\n")
            h.write(f"{sid},{kind}\n")


def make(where: Path, days, seed: int, **stream) -> None:
    """Every day of ``days`` into ``where`` (``d1.jsonl``, ``l1.csv``, ``k1.csv``, ...), seeds ``seed``, ``seed + 1``, ..."""
    where.mkdir(parents=True, exist_ok=True)
    for i, (n, date) in enumerate(days):
        write_day(n, seed + i, date, where / f"d{i + 1}.jsonl", where / f"l{i + 1}.csv", **stream)


def checkout(rnd: random.Random, kind: str) -> list[dict]:
    """One checkout's events: open, 1-5 items, (card testing: 5-12 declined micro-payments), pay, close."""
    items = [(round(rnd.uniform(2.0, 80.0), 2), rnd.randint(1, 3)) for _ in range(rnd.randint(1, 5))]
    odd = rnd.randrange(len(items))
    if kind == "tamper":
        items[odd] = (round(rnd.uniform(0.01, 0.09), 2), items[odd][1])
    if kind == "bulk":
        items[odd] = (items[odd][0], rnd.randint(40, 90))
    rows = [{"event": "open", "device": rnd.choice(["web", "ios", "android"])}]
    rows += [{"event": "item", "sku": f"SKU-{rnd.randint(100, 999)}", "price": f"{p:.2f}", "qty": q}
             for p, q in items]
    if kind == "testing":
        rows += [{"event": "pay", "amount": f"{rnd.uniform(0.5, 1.99):.2f}", "status": "declined"}
                 for _ in range(rnd.randint(5, 12))]
    amount = sum(p * q for p, q in items)
    return rows + [{"event": "pay", "amount": f"{amount:.2f}", "status": rnd.choice(["ok"] * 19 + ["declined"])},
                   {"event": "close"}]


STREAM = {"id_field": "order", "label_field": "outcome", "kinds": KINDS, "positive": "fraud", "prefix": "c",
          "day_seconds": 86000, "step": lambda rnd: timedelta(milliseconds=rnd.randint(200, 20000)),
          "session": checkout}


@functools.cache  # each day's kinds are read once, however many runs are measured
def _kinds(folder: Path, d: int, id_field: str) -> dict[str, str]:
    return {r[id_field]: r["kind"] for r in csv.DictReader((folder / f"k{d}.csv").open())}


@functools.cache
def _counts(folder: Path, d: int, id_field: str) -> dict[str, collections.Counter]:
    """Per sequence, the counts of each ``event`` and each ``status`` (where events have one)."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in (folder / f"d{d}.jsonl").open():
        e = json.loads(line)
        c = out[e[id_field]]
        c[f"event={e['event']}"] += 1
        if "status" in e:
            c[f"status={e['status']}"] += 1
    return out


def measure(folder: Path, runs: dict[str, str], days=DAYS, kinds=KINDS, id_field: str = "order",
            positive: str = "fraud") -> None:
    """Each run's figures on days 2 and 3 (``kinds[0]`` is the normal kind; a sequence is flagged
    when its predicted label is ``positive``, or ``anomaly`` for an anomaly task), then counts LR
    and flag-all; also serves docs/probes/sensor_stream.py, whose events have the same shape."""
    import numpy as np
    import polars as pl
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import average_precision_score, f1_score, roc_auc_score

    for name, path in runs.items():
        for d in (2, 3):
            p = pl.read_parquet(folder / path / f"date={days[d - 1][1]}" / "part-0.parquet")
            kind = np.array([_kinds(folder, d, id_field)[s] for s in p["sequence_id"]])
            y = kind != kinds[0]
            flagged = np.array([label in (positive, "anomaly") for label in p["label"]])
            by_kind = " | ".join(f"{flagged[kind == k].sum()} of {(kind == k).sum()}" for k in kinds[1:])
            print(f"| {name} | {d} | {roc_auc_score(y, p['score']):.3f} | {average_precision_score(y, p['score']):.3f} | "
                  f"{f1_score(y, flagged):.3f} | {flagged.mean():.1%} | {by_kind} |")
    keys = sorted({k for d in (1, 2, 3) for c in _counts(folder, d, id_field).values() for k in c})

    def table(d: int):
        counts, kind = _counts(folder, d, id_field), _kinds(folder, d, id_field)
        return (np.array([[counts[s][k] for k in keys] for s in sorted(counts)]),
                np.array([kind[s] != kinds[0] for s in sorted(counts)]))

    lr = LogisticRegression(max_iter=2000).fit(*table(1))
    blanks = " |" * len(kinds[1:])
    for d in (2, 3):
        X, y = table(d)
        p = lr.predict_proba(X)[:, 1]
        print(f"| counts LR (event and status counts, fitted on day 1) | {d} | {roc_auc_score(y, p):.3f} | "
              f"{average_precision_score(y, p):.3f} | {f1_score(y, p > 0.5):.3f} (at 0.5) | {(p > 0.5).mean():.1%} |{blanks}")
        print(f"| flag all | {d} | | | {f1_score(y, np.ones_like(y)):.3f} | 100% |{blanks}")


if __name__ == "__main__":
    command, where = sys.argv[1], Path(sys.argv[2])
    if command == "make":
        make(where, DAYS, 200, **STREAM)
    else:
        measure(where, dict(arg.split("=", 1) for arg in sys.argv[3:]))
