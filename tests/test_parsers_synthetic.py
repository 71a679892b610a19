"""The built-in demo generators: realistic formats, controlled anomalies, learnable signal."""

import csv
import json
import re
from collections import Counter, defaultdict

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import cross_val_score

from parsers import synthetic
from parsers.synthetic import SESSION_LABELS, generate_hdfs_logs, generate_session_events

# LogHub's HDFS_1 line format, written out independently of parsers.logs.
HDFS_LINE = re.compile(r"^(\d{6}) (\d{6}) (\d+) (INFO|WARN|ERROR) ([\w.$]+): (.+)$")
BLK = re.compile(r"blk_-?\d+")


@pytest.fixture(scope="module")
def hdfs(tmp_path_factory):
    d = tmp_path_factory.mktemp("hdfs")
    info = generate_hdfs_logs(d / "HDFS.log", d / "anomaly_label.csv", n_blocks=600, anomaly_rate=0.05, seed=7)
    lines = (d / "HDFS.log").read_text().splitlines()
    with open(d / "anomaly_label.csv", newline="") as fh:
        labels = list(csv.reader(fh))
    return info, lines, labels


def test_hdfs_lines_have_the_real_format_and_time_order(hdfs):
    info, lines, _ = hdfs
    assert len(lines) == info["lines"] > 600 * 8
    parsed = [HDFS_LINE.match(line) for line in lines]
    assert all(parsed), [line for line, m in zip(lines, parsed) if not m][:3]
    stamps = [m.group(1) + m.group(2) for m in parsed]
    assert stamps == sorted(stamps)
    no_block = [line for line in lines if not BLK.search(line)]
    assert len(no_block) == info["no_block_lines"] > 0


def test_hdfs_labels_cover_every_block_with_the_requested_share(hdfs):
    info, lines, labels = hdfs
    assert labels[0] == ["BlockId", "Label"]
    rows = dict(labels[1:])
    assert set(rows.values()) == {"Normal", "Anomaly"}
    assert {b for line in lines for b in BLK.findall(line)} == set(rows)
    share = sum(v == "Anomaly" for v in rows.values()) / len(rows)
    assert share == pytest.approx(0.05, abs=0.01)
    assert sum(info["anomaly_kinds"].values()) == info["anomalies"]
    assert all(n > 0 for n in info["anomaly_kinds"].values())


def _operator_flags(block_lines: list[str]) -> bool:
    """Rules an operator would apply: is this block's history abnormal?"""
    stored = [int(re.search(r"size (\d+)$", x).group(1)) for x in block_lines if "addStoredBlock" in x]
    received = [int(re.search(r"of size (\d+)", x).group(1)) for x in block_lines if "Received block" in x]
    failures = [x for x in block_lines if re.search(r"Interrupted|received exception|Exception (in|writing)", x)]
    first_delete = next((i for i, x in enumerate(block_lines) if "invalidSet" in x), None)
    last_store = max((i for i, x in enumerate(block_lines) if "addStoredBlock" in x), default=None)
    return (
        len(stored) < 3
        or len(received) < 3
        or set(received) != set(stored)
        or bool(failures)
        or (first_delete is not None and (last_store is None or first_delete < last_store))
    )


def test_hdfs_anomalies_are_exactly_what_an_operator_would_flag(hdfs):
    _, lines, labels = hdfs
    per_block = defaultdict(list)
    for line in lines:
        for blk in set(BLK.findall(line)):
            per_block[blk].append(line)
    truth = {blk: lab == "Anomaly" for blk, lab in labels[1:]}
    flagged = {blk: _operator_flags(per_block[blk]) for blk in truth}
    assert flagged == truth


def test_hdfs_generator_is_deterministic(tmp_path):
    a = generate_hdfs_logs(tmp_path / "a.log", tmp_path / "a.csv", n_blocks=50, seed=3)
    b = generate_hdfs_logs(tmp_path / "b.log", tmp_path / "b.csv", n_blocks=50, seed=3)
    c = generate_hdfs_logs(tmp_path / "c.log", tmp_path / "c.csv", n_blocks=50, seed=4)
    assert (tmp_path / "a.log").read_bytes() == (tmp_path / "b.log").read_bytes()
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert (tmp_path / "a.log").read_bytes() != (tmp_path / "c.log").read_bytes()
    assert a["lines"] == b["lines"] and c["blocks"] == 50


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    d = tmp_path_factory.mktemp("sessions")
    info = generate_session_events(d / "events.jsonl", d / "labels.csv", n_sessions=600, seed=1)
    events = defaultdict(list)
    for line in (d / "events.jsonl").read_text().splitlines():
        ev = json.loads(line)
        events[ev["session_id"]].append(ev)
    with open(d / "labels.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    return info, events, rows


def test_session_events_are_valid_prefixes_with_imbalanced_labels(sessions):
    info, events, rows = sessions
    assert rows[0] == ["session_id", "label"]
    labels = dict(rows[1:])
    assert set(labels) == set(events) and len(events) == info["sessions"] == 600
    assert sum(len(v) for v in events.values()) == info["events"]
    counts = Counter(labels.values())
    assert set(counts) == set(SESSION_LABELS)
    assert 0.5 < counts["none"] / 600 < 0.7
    for evs in events.values():
        assert 20 <= len(evs) <= 80
        assert [e["ts"] for e in evs] == sorted(e["ts"] for e in evs)
        assert all({"session_id", "ts", "event_type", "user", "payload"} <= set(e) for e in evs)
    types = Counter(e["event_type"] for evs in events.values() for e in evs)
    assert len(types) >= 8


def _features(evs, with_values):
    types = list(synthetic._EVENT_TYPES)
    c = Counter(e["event_type"] for e in evs)
    x = [c[t] / len(evs) for t in types]
    if with_values:
        p = [e["payload"] for e in evs]
        x += [
            sum(q.get("error_code") == "QUOTA_EXCEEDED" for q in p),
            sum(q.get("error_code") == "INTERNAL" for q in p),
            sum(q.get("page") == "/pricing" for q in p),
            sum(str(q.get("http_status", "")).startswith("5") for q in p),
            sum(q.get("status") == "failed" for q in p),
            sum(str(q.get("query", "")).startswith("how to") for q in p),
            max((q.get("usage_pct", 0) for q in p), default=0) / 100,
        ]
    return x


def test_session_signal_is_carried_partly_by_payload_values(sessions):
    _, events, rows = sessions
    labels = dict(rows[1:])
    ids = sorted(events)
    y = np.array([labels[i] for i in ids])
    scores = {}
    for with_values in (False, True):
        x = np.array([_features(events[i], with_values) for i in ids])
        model = LogisticRegression(max_iter=2000, class_weight="balanced")
        scores[with_values] = cross_val_score(model, x, y, cv=3, scoring="balanced_accuracy").mean()
    assert scores[False] < 0.65  # event-type counts alone: far from perfect
    assert scores[True] > scores[False] + 0.1  # payload values carry real signal
    assert scores[True] < 0.95  # still noisy, not trivial


def test_session_generator_is_deterministic(tmp_path):
    generate_session_events(tmp_path / "a.jsonl", tmp_path / "a.csv", n_sessions=30, seed=5)
    generate_session_events(tmp_path / "b.jsonl", tmp_path / "b.csv", n_sessions=30, seed=5)
    generate_session_events(tmp_path / "c.jsonl", tmp_path / "c.csv", n_sessions=30, seed=6)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert (tmp_path / "a.jsonl").read_bytes() != (tmp_path / "c.jsonl").read_bytes()
