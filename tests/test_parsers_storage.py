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
