"""JSON Lines ingestion: flattening, ordering, rejects, real Parquet on disk."""

import gzip
import json
from pathlib import Path

import polars as pl

from parsers import storage
from parsers.events import flatten, ingest_events, parse_ts
from parsers.synthetic import generate_session_events

DAY = "2026-01-02"


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def objects_of(root, seq: str, source: str = "sessions") -> dict[int, list[tuple[str, str]]]:
    """``{step: [(key, value), ...]}`` of one sequence, keys in stored order."""
    df = storage.read_objects(root, source).filter(pl.col("sequence_id") == seq)
    out: dict[int, list[tuple[str, str]]] = {}
    for row in df.iter_rows(named=True):
        out.setdefault(row["step"], []).append((row["key"], row["value"]))
    return out


GOLDEN_EVENT = {
    "session_id": "s000123",
    "ts": "2026-11-01T10:00:03.120Z",
    "event_type": "page_view",
    "user": {"plan": "free", "region": "eu-west", "tenure_days": 12, "beta": True},
    "payload": {
        "page": "/pricing",
        "referrer": None,
        "items": ["a", {"sku": "b", "qty": 2}],
        "usage_pct": 91.5,
        "tags": [],
        "meta": {},
    },
}
GOLDEN_KEYS = [
    ("event_type", "page_view"),
    ("user.plan", "free"),
    ("user.region", "eu-west"),
    ("user.tenure_days", "12"),
    ("user.beta", "true"),
    ("payload.page", "/pricing"),
    ("payload.items.0", "a"),
    ("payload.items.1.sku", "b"),
    ("payload.items.1.qty", "2"),
    ("payload.usage_pct", "91.5"),
]


def test_flatten_golden_example():
    flat = flatten(GOLDEN_EVENT)
    assert flat[:2] == [("session_id", "s000123"), ("ts", "2026-11-01T10:00:03.120Z")]
    assert flat[2:] == GOLDEN_KEYS  # null, empty list and empty object are skipped


def test_golden_event_on_disk(tmp_path):
    report = ingest_events(write_jsonl(tmp_path / "ev.jsonl", [GOLDEN_EVENT]), tmp_path / "data", ingest_date=DAY)
    assert (report["parsed"], report["rejected"], report["sequences"]) == (1, 0, 1)
    assert objects_of(tmp_path / "data", "s000123") == {0: GOLDEN_KEYS}
    df = storage.read_objects(tmp_path / "data", "sessions")
    assert df["template_id"].null_count() == df.height
    assert df.schema["ts"] == pl.Datetime("us")
    assert str(df["ts"][0]) == "2026-11-01 10:00:03.120000"
    assert report["objects_path"].endswith(f"objects/source=sessions/ingest_date={DAY}/part-ev.jsonl.parquet")


def test_steps_follow_timestamp_then_arrival(tmp_path):
    rows = [
        {"session_id": "a", "ts": "2026-11-01T10:00:05Z", "event_type": "third"},
        {"session_id": "b", "ts": "2026-11-01T09:00:00Z", "event_type": "only"},
        {"session_id": "a", "ts": "2026-11-01T10:00:01Z", "event_type": "first"},
        {"session_id": "a", "ts": "2026-11-01T12:00:02+02:00", "event_type": "second-tie-1"},  # 10:00:02 UTC
        {"session_id": "a", "ts": "2026-11-01T10:00:02Z", "event_type": "second-tie-2"},
    ]
    ingest_events(write_jsonl(tmp_path / "ev.jsonl", rows), tmp_path / "data", ingest_date=DAY)
    a = objects_of(tmp_path / "data", "a")
    assert [a[i][0][1] for i in sorted(a)] == ["first", "second-tie-1", "second-tie-2", "third"]
    assert objects_of(tmp_path / "data", "b") == {0: [("event_type", "only")]}


def test_bad_lines_are_rejected_with_reasons(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"session_id": "s1", "ts": "2026-11-01T10:00:00Z", "x": 1})
    lines = [
        good,
        '{"session_id": "s1", "ts": ',  # truncated
        "[1, 2, 3]",
        json.dumps({"ts": "2026-11-01T10:00:00Z", "x": 1}),
        json.dumps({"session_id": "", "ts": "2026-11-01T10:00:00Z"}),
        json.dumps({"session_id": "s1", "x": 1}),
        json.dumps({"session_id": "s1", "ts": "yesterday"}),
        "",
    ]
    path.write_bytes(("\n".join(lines) + "\n").encode() + b'{"session_id": "s\xff"}\n')
    report = ingest_events(path, tmp_path / "data", ingest_date=DAY)
    assert (report["read"], report["parsed"], report["rejected"], report["blank"]) == (9, 1, 7, 1)
    rejects = storage.read_rejects(tmp_path / "data", "sessions").sort("line_no")
    assert rejects["line_no"].to_list() == [2, 3, 4, 5, 6, 7, 9]
    reasons = rejects["reason"].to_list()
    assert reasons[0].startswith("invalid JSON")
    assert reasons[1] == "not a JSON object (list)"
    assert reasons[2] == reasons[3] == "missing session id (field 'session_id')"
    assert reasons[4] == "missing timestamp (field 'ts')"
    assert reasons[5] == "bad timestamp: 'yesterday'"
    assert reasons[6].startswith("undecodable")

    # fixing the file and re-ingesting clears its old rejects and replaces its objects
    write_jsonl(path, [good])
    again = ingest_events(path, tmp_path / "data", ingest_date=DAY)
    assert again["rejected"] == 0 and storage.read_rejects(tmp_path / "data", "sessions").height == 0
    assert storage.read_objects(tmp_path / "data", "sessions").height == 1


def test_custom_fields_epoch_times_and_gzip(tmp_path):
    rows = [
        {"ctx": {"sid": "u1", "device": "ios"}, "time": 1_700_000_000_500, "kind": "open"},  # epoch ms
        {"ctx": {"sid": "u1", "device": "ios"}, "time": 1_700_000_000, "kind": "start"},  # epoch s
    ]
    gz = tmp_path / "app.jsonl.gz"
    gz.write_bytes(gzip.compress(("\n".join(json.dumps(r) for r in rows) + "\n").encode()))
    report = ingest_events(
        gz, tmp_path / "data", source="app", session_field="ctx.sid", ts_field="time", ingest_date=DAY
    )
    assert report["parsed"] == 2 and report["rejected"] == 0
    objs = objects_of(tmp_path / "data", "u1", source="app")
    assert objs == {0: [("ctx.device", "ios"), ("kind", "start")], 1: [("ctx.device", "ios"), ("kind", "open")]}
    assert str(parse_ts(1_700_000_000_500)) == "2023-11-14 22:13:20.500000"


def test_synthetic_sessions_end_to_end_and_reingest(tmp_path):
    info = generate_session_events(tmp_path / "events.jsonl", tmp_path / "labels.csv", n_sessions=80, seed=3)
    root = tmp_path / "data"
    first = ingest_events(tmp_path / "events.jsonl", root, ingest_date=DAY)
    assert first["rejected"] == 0 and first["parsed"] == info["events"] and first["sequences"] == 80
    second = ingest_events(tmp_path / "events.jsonl", root, ingest_date=DAY)
    df = storage.read_objects(root, "sessions")
    assert df.height == first["rows"] == second["rows"]
    steps = df.group_by("sequence_id").agg(pl.col("step").max() + 1)["step"]
    assert steps.min() >= 20 and steps.max() <= 80
    keys = set(df["key"])
    assert {"event_type", "user.plan", "payload.page", "payload.error_code", "payload.http_status"} <= keys
    assert not keys & {"session_id", "ts"}


def test_small_batches_give_the_same_objects(tmp_path):
    """Streaming: batch size changes nothing, an event with no keys left still takes its step,
    and the spill folder is gone afterwards."""
    generate_session_events(tmp_path / "events.jsonl", tmp_path / "labels.csv", n_sessions=30, seed=5)
    path = tmp_path / "events.jsonl"
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"session_id": "s-empty", "ts": 10}) + "\n")
        fh.write(json.dumps({"session_id": "s-empty", "ts": 20, "a": 1}) + "\n")
    small = ingest_events(path, tmp_path / "a", ingest_date=DAY, batch_lines=7)
    whole = ingest_events(path, tmp_path / "b", ingest_date=DAY)
    assert {k: v for k, v in small.items() if "path" not in k and k != "seconds"} == \
        {k: v for k, v in whole.items() if "path" not in k and k != "seconds"}
    a, b = storage.read_objects(tmp_path / "a", "sessions"), storage.read_objects(tmp_path / "b", "sessions")
    assert a.equals(b) and a.height == small["rows"]
    assert a.filter(pl.col("sequence_id") == "s-empty").select("step", "key", "value").rows() == [(1, "a", "1")]
    assert not list(Path(small["objects_path"]).parent.glob(".ingest-*"))
