"""No input crashes ingest (issue 24, item 1): property-based tests (hypothesis) over the events
ingest, the log ingest and the labels reader, plus the named bad inputs one by one.

For any file: ingest returns a report whose counts add up (read = parsed + rejected + blank;
labels: read = labels + rejected), every parsed line is an object of the partition and every
other line a reject with a reason -- or it stops with a clear ValueError naming the file. Never
another exception, never a partial partition. The budget is fixed (``derandomize``: the same
examples on every run, so CI is reproducible)."""

from __future__ import annotations

import json

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsers.events import MAX_DEPTH, MAX_KEYS, ingest_events
from parsers.log_ingest import ingest_logs
from parsers.logs import ingest_labels
from parsers.presets import LogFormat

BUDGET = settings(max_examples=40, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
good_events = st.builds(lambda s, t, p: json.dumps({"session_id": s, "ts": t, "payload": p}),
                        st.sampled_from(["a", "b", "c"]), st.integers(0, 2_000_000_000), json_values)
# what a broken producer writes: any JSON text, truncated JSON, any bytes decoded as UTF-8
any_json = json_values.map(json.dumps)
broken = st.builds(lambda s, n: s[:n], good_events, st.integers(0, 40))
raw_text = st.text(max_size=60)
event_lines = st.lists(good_events | any_json | broken | raw_text, min_size=0, max_size=25)


def _objects(path_str: str) -> pl.DataFrame:
    return pl.read_parquet(path_str)


def _check_events(tmp_path, data: bytes) -> dict:
    src = tmp_path / "in.jsonl"
    src.write_bytes(data)
    report = ingest_events(src, tmp_path / "root", source="ev", ingest_date="2025-01-01")
    assert report["read"] == report["parsed"] + report["rejected"] + report["blank"], report
    objects = _objects(report["objects_path"])
    assert objects.select("sequence_id", "step").unique().height <= report["parsed"]
    if report["rejected"]:
        rejects = pl.read_parquet(report["rejects_path"])
        assert rejects.height == report["rejected"] and rejects["reason"].str.len_chars().min() > 0
    return report


@BUDGET
@given(lines=event_lines)
def test_events_ingest_counts_add_up_for_any_lines(tmp_path_factory, lines):
    tmp = tmp_path_factory.mktemp("ev")
    _check_events(tmp, ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass"))


@BUDGET
@given(data=st.binary(max_size=400))
def test_events_ingest_counts_add_up_for_any_bytes(tmp_path_factory, data):
    _check_events(tmp_path_factory.mktemp("evb"), data)


def _event(payload_text: str, sid: str = "s1") -> str:
    return '{"session_id": "' + sid + '", "ts": 1700000000, "payload": ' + payload_text + "}"


NAMED = {  # bad input kind -> (line, expected reason fragment); None: the line is kept
    "deep nesting": (_event("[" * 5000 + "]" * 5000), "nested deeper than"),
    "deep objects": (_event('{"a": ' * (MAX_DEPTH + 5) + "1" + "}" * (MAX_DEPTH + 5)), "nested deeper than"),
    "huge number": (_event("1" * 5000), "number"),
    "duplicate keys": ('{"session_id": "s1", "ts": 1700000000, "k": 1, "k": 2}', "duplicate key 'k'"),
    "lone surrogate": (_event('"\\ud800x"'), "surrogate"),
    "giant array": (_event(json.dumps(list(range(MAX_KEYS + 1)))), "more than"),
    "not an object": ("[1, 2]", "not a JSON object"),
    "invalid json": ("{oops", "invalid JSON"),
    "bad timestamp": ('{"session_id": "s1", "ts": "yesterday"}', "bad timestamp"),
    "huge timestamp": ('{"session_id": "s1", "ts": 1e300}', "bad timestamp"),
    "BOM": ("\ufeff" + _event("1"), None),
    "NaN": (_event("NaN"), None),
}


@pytest.mark.parametrize("kind", sorted(NAMED))
def test_named_bad_event_lines_are_rejected_with_a_reason_and_the_rest_kept(tmp_path, kind):
    line, reason = NAMED[kind]
    good = _event('{"page": "/"}', "s2")
    report = _check_events(tmp_path, (good + "\n" + line + "\n" + good + "\n").encode("utf-8"))
    if reason is None:
        assert report["parsed"] == 3 and report["rejected"] == 0
        return
    assert (report["parsed"], report["rejected"]) == (2, 1)
    rejects = pl.read_parquet(report["rejects_path"])
    assert rejects["line_no"].to_list() == [2] and reason in rejects["reason"][0], rejects["reason"][0]


def test_nulls_and_empty_containers_are_dropped_and_counted(tmp_path):
    line = _event('{"a": null, "b": [], "c": {}, "d": [1, null], "e": "x"}')
    report = _check_events(tmp_path, (line + "\n").encode())
    assert report["null_values"] == 2 and report["empty_containers"] == 2
    keys = set(_objects(report["objects_path"])["key"])
    assert keys == {"payload.d.0", "payload.e"}


@BUDGET
@given(lines=st.lists(st.text(max_size=80), max_size=25))
def test_log_ingest_counts_add_up_for_any_lines(tmp_path_factory, lines):
    tmp = tmp_path_factory.mktemp("logs")
    src = tmp / "in.log"
    src.write_bytes(("\n".join(lines) + "\n").encode("utf-8", "surrogatepass"))
    fmt = LogFormat("t", header="<Level> <Component>: <Content>", id_pattern=r"id-\d+")
    report = ingest_logs(src, tmp / "root", source="lg", preset=fmt, ingest_date="2025-01-01")
    assert report["read"] == report["parsed"] + report["rejected"] + report["blank"], report


@BUDGET
@given(data=st.binary(max_size=300))
def test_labels_reader_never_crashes(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("lab")
    src = tmp / "labels.csv"
    src.write_bytes(data)
    try:
        report = ingest_labels(src, tmp / "root", source="lb", ingest_date="2025-01-01")
    except ValueError as err:  # an unusable file (no header, one column): a clear error naming it
        assert str(src) in str(err)
        return
    assert report["read"] == report["labels"] + report["rejected"]
    assert pl.read_parquet(report["labels_path"]).height == report["labels"]


def test_labels_bad_rows_are_rejected_with_a_reason(tmp_path):
    src = tmp_path / "labels.csv"
    src.write_bytes(b"id,label\nb1,Normal\nb2,Anom\x00aly\nb3,\xff\xfe\nb1,Normal\nb4,Anomaly\n")
    report = ingest_labels(src, tmp_path / "root", source="lb", ingest_date="2025-01-01")
    assert (report["labels"], report["rejected"]) == (2, 3)
    reasons = pl.read_parquet(report["rejects_path"]).sort("line_no")["reason"].to_list()
    assert "NUL" in reasons[0] and "undecodable" in reasons[1] and reasons[2] == "duplicate id"


UNSAFE = ["../x", "..", "/etc/passwd", "a/b", "a\x00b", ".hidden", "x" * 65, "", "a b", "C:\\x"]


@pytest.mark.parametrize("bad", UNSAFE)
def test_unsafe_names_are_refused_with_exit_code_2_and_nothing_is_written(tmp_path, capsys, bad):
    from training.cli.main import main

    events = tmp_path / "ev.jsonl"
    events.write_text(_event("1") + "\n")
    root = tmp_path / "root"
    commands = [["ingest", "events", str(events), "--root", str(root), "--source", bad],
                ["ingest", "logs", str(events), "--root", str(root), "--source", bad],
                ["profile", "--root", str(root), "--source", bad],
                ["train", "--workdir", str(tmp_path / "w"), "--task", bad],
                ["evaluate", "--workdir", str(tmp_path / "w"), "--task", bad],
                ["score", "--model", str(tmp_path / "m"), "--input", str(root), "--out", str(tmp_path / "o"),
                 "--source", bad]]
    for argv in commands:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "not a safe name" in err[0], err
    assert not any(tmp_path.glob("root")) and not (tmp_path / "w").exists() and not (tmp_path / "o").exists()
    from parsers.names import UnsafeName
    from parsers.storage import objects_dir

    with pytest.raises(UnsafeName):
        objects_dir(root, bad)
