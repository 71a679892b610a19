"""Parquet layout helpers: paths, typed empty tables, atomic replacing writes."""

import datetime as dt

import polars as pl
import pytest

from parsers import storage


def test_paths_follow_the_layout(tmp_path):
    assert storage.objects_path(tmp_path, "hdfs", "2026-01-02", "/in/HDFS.log") == (
        tmp_path / "objects" / "source=hdfs" / "ingest_date=2026-01-02" / "part-HDFS.parquet"
    )
    assert storage.rejects_path(tmp_path, "hdfs", dt.date(2026, 1, 2), "x/ev.jsonl.gz") == (
        tmp_path / "rejects" / "source=hdfs" / "ingest_date=2026-01-02" / "part-ev.parquet"
    )
    assert storage.labels_path(tmp_path, "sessions", "labels.csv") == (
        tmp_path / "labels" / "source=sessions" / "part-labels.parquet"
    )
    assert storage.drain_state_path(tmp_path, "hdfs") == tmp_path / "state" / "drain3-hdfs.json"
    assert storage.ingest_date_str(None) == dt.datetime.now(dt.UTC).date().isoformat()
    with pytest.raises(ValueError):
        storage.ingest_date_str("02/01/2026")
    with pytest.raises(ValueError):
        storage.objects_dir(tmp_path, "../evil")


def test_empty_sources_read_as_typed_empty_frames(tmp_path):
    objects = storage.read_objects(tmp_path, "nothing")
    assert objects.height == 0
    assert objects.schema == pl.Schema(
        {
            "sequence_id": pl.String,
            "step": pl.Int64,
            "ts": pl.Datetime("us"),
            "key": pl.String,
            "value": pl.String,
            "template_id": pl.Int64,
        }
    )
    assert storage.read_labels(tmp_path, "nothing").columns == ["sequence_id", "label"]
    assert storage.read_rejects(tmp_path, "nothing").columns == ["file", "line_no", "reason", "raw"]


def test_atomic_write_casts_to_schema_and_replaces(tmp_path):
    path = storage.labels_path(tmp_path, "s", "labels.csv")
    storage.write_parquet_atomic(pl.DataFrame({"label": ["a"], "sequence_id": ["1"]}), path, storage.LABELS_SCHEMA)
    storage.write_parquet_atomic(
        pl.DataFrame({"sequence_id": ["2", "3"], "label": ["b", "c"]}), path, storage.LABELS_SCHEMA
    )
    assert storage.read_labels(tmp_path, "s").rows() == [("2", "b"), ("3", "c")]
    assert [p.name for p in path.parent.iterdir()] == ["part-labels.parquet"]  # no temp file left


def test_rejects_raw_text_is_cut_to_one_kib(tmp_path):
    storage.write_rejects(tmp_path, "s", "2026-01-02", "in.log", [(3, "too long", "x" * 5000)])
    rejects = storage.read_rejects(tmp_path, "s")
    assert rejects.rows() == [("in.log", 3, "too long", "x" * 1024)]
    storage.write_rejects(tmp_path, "s", "2026-01-02", "in.log", [])  # a clean re-run removes it
    assert storage.read_rejects(tmp_path, "s").height == 0


def test_line_reader_rejects_over_long_lines_and_keeps_going(tmp_path):
    from parsers.storage import LineReader

    path = tmp_path / "in.log"
    path.write_bytes(b"first\n" + b"x" * (70 * 1024) + b"\nthird\n" + b"y" * 200 + b"\n")
    rejects: list = []
    reader = LineReader(path, rejects, max_line_bytes=64 * 1024)
    assert [(n, t[:5]) for n, t in reader] == [(1, "first"), (3, "third"), (4, "yyyyy")]
    assert reader.read == 4
    assert rejects[0][:2] == (2, "line longer than 65536 bytes") and len(rejects[0][2]) == 1024


def test_line_reader_rejects_empty_and_truncated_gzip(tmp_path):
    import gzip

    from parsers.storage import LineReader

    empty, nothing, cut = tmp_path / "empty.log.gz", tmp_path / "nothing.log.gz", tmp_path / "cut.log.gz"
    empty.write_bytes(b"")
    nothing.write_bytes(gzip.compress(b""))
    whole = gzip.compress(b"".join(b"line %d\n" % i for i in range(5000)))
    cut.write_bytes(whole[: len(whole) // 2])
    for path in (empty, nothing):
        rejects: list = []
        assert list(LineReader(path, rejects)) == [] and rejects == [(0, "empty gzip file", "")]
    rejects = []
    lines = list(LineReader(cut, rejects))
    assert 0 < len(lines) < 5000 and rejects[0][1].startswith("truncated or corrupt gzip")
