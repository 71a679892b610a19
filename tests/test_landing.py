"""parsers.landing: which files an interval has, one file's ingest, and the partition clean-up
that makes re-running an interval replace its partitions (real Drain3 and Parquet; the DAG that
drives these is tested in test_ops_dags.py)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from parsers import storage
from parsers.landing import file_kind, finalize_interval, find_interval_files, ingest_file, interval_days
from parsers.synthetic import generate_hdfs_logs
from training.tasks.catalog import load_catalog


def test_interval_days_and_file_kinds():
    assert interval_days("2025-03-01", "2025-03-03") == ["2025-03-01", "2025-03-02"]
    assert interval_days("2025-03-01", "2025-03-01") == ["2025-03-01"]  # a point: that day
    assert interval_days("2025-03-01") == ["2025-03-01"]
    assert [file_kind(n) for n in ("a.log", "a.log.gz", "e.jsonl.gz", "hdfs_labels.csv", "x.csv", ".a.log",
                                   "_SUCCESS")] == ["logs", "logs", "events", "labels", None, None, None]


def test_the_catalogue_sets_a_landing_sources_options(tmp_path):
    """A source's fields, label columns and reject share come from the catalogue (path or text)."""
    folder = tmp_path / "landing" / "shop" / "2025-03-01"
    folder.mkdir(parents=True)
    events = [{"order": {"id": f"o{i % 3}"}, "at": f"2025-03-01T00:00:0{i}Z", "amount": i} for i in range(6)]
    (folder / "orders.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (folder / "labels.csv").write_text("note,order_ref,outcome\nx,o0,ok\ny,o1,fraud\n")
    catalog = tmp_path / "c.toml"
    catalog.write_text('[sources.shop]\nkind = "events"\nsession_field = "order.id"\nts_field = "at"\n'
                       'label_id_column = "order_ref"\nlabel_column = "outcome"\n')
    root = tmp_path / "data"
    for item in find_interval_files(tmp_path / "landing", ["2025-03-01"]):
        ingest_file(item, root, load_catalog(catalog))
    objects = storage.read_objects(root, "shop")
    assert sorted(objects["sequence_id"].unique().to_list()) == ["o0", "o1", "o2"]
    assert dict(storage.read_labels(root, "shop").iter_rows()) == {"o0": "ok", "o1": "fraud"}
    # undeclared: the defaults (session_id / ts) reject every event of this shape, with reasons
    from parsers.storage import RejectShareExceeded

    with pytest.raises(RejectShareExceeded):
        ingest_file({"path": str(folder / "orders.jsonl"), "source": "shop", "date": "2025-03-01",
                     "kind": "events"}, tmp_path / "other", load_catalog('[sources.x]\nkind = "events"\n'))


def test_labels_of_every_day_are_kept_and_stale_parts_go(tmp_path):
    landing, root = tmp_path / "landing", tmp_path / "data"
    for day, seed in (("2025-03-01", 0), ("2025-03-02", 1)):
        folder = landing / "hdfs" / day
        folder.mkdir(parents=True)
        generate_hdfs_logs(folder / "hdfs.log", folder / "labels.csv", n_blocks=20, anomaly_rate=0.1, seed=seed)
    days = interval_days("2025-03-01", "2025-03-03")
    files = find_interval_files(landing, days)
    assert [(f["date"], f["kind"]) for f in files] == [("2025-03-01", "logs"), ("2025-03-01", "labels"),
                                                       ("2025-03-02", "logs"), ("2025-03-02", "labels")]
    reports = [ingest_file(f, root) for f in files]
    assert {r["part"] for r in reports if r["kind"] == "labels"} == {"part-2025-03-01_labels.csv.parquet",
                                                                     "part-2025-03-02_labels.csv.parquet"}
    assert storage.read_labels(root, "hdfs")["sequence_id"].n_unique() == 40  # both days' labels
    finalize_interval(root, days, files)
    assert storage.ingest_dates(root, "hdfs") == days

    # a manual ingest into the same partition: not the landing's, never removed by it
    manual = tmp_path / "manual.log"
    generate_hdfs_logs(manual, tmp_path / "manual.csv", n_blocks=5, anomaly_rate=0.0, seed=7)
    from parsers.log_ingest import ingest_logs

    ingest_logs(manual, root, source="hdfs", ingest_date="2025-03-02")
    manual_part = storage.objects_path(root, "hdfs", "2025-03-02", manual)

    # the second day's log is withdrawn from the landing: re-running the interval removes its part
    (landing / "hdfs" / "2025-03-02" / "hdfs.log").unlink()
    files = find_interval_files(landing, days)
    result = finalize_interval(root, days, files)
    assert any("ingest_date=2025-03-02" in p and "part-hdfs" in p for p in result["removed"])
    assert str(manual_part) not in result["removed"] and manual_part.exists()
    assert set(storage.read_objects(root, "hdfs", "2025-03-02")["sequence_id"]) == \
        set(pl.read_parquet(manual_part)["sequence_id"])  # only the manual part is left
    assert storage.read_objects(root, "hdfs", "2025-03-01").height > 0


def test_a_log_source_needs_a_format(tmp_path):
    folder = tmp_path / "landing" / "mystery" / "2025-03-01"
    folder.mkdir(parents=True)
    (folder / "app.log").write_text("hello\n")
    [item] = find_interval_files(tmp_path / "landing", ["2025-03-01"])
    with pytest.raises(ValueError, match="no log format"):
        ingest_file(item, tmp_path / "data")
    with pytest.raises(FileNotFoundError, match="landing directory"):
        find_interval_files(tmp_path / "nowhere", ["2025-03-01"])
