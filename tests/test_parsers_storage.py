"""Parquet layout helpers: paths, typed empty tables, atomic replacing writes."""

import datetime as dt
import os
from pathlib import Path

import polars as pl
import pytest

from parsers import atomic, storage


def test_paths_follow_the_layout(tmp_path):
    assert storage.objects_path(tmp_path, "hdfs", "2026-01-02", "/in/HDFS.log") == (
        tmp_path / "objects" / "source=hdfs" / "ingest_date=2026-01-02" / "part-HDFS.log.parquet"
    )
    assert storage.rejects_path(tmp_path, "hdfs", dt.date(2026, 1, 2), "x/ev.jsonl.gz") == (
        tmp_path / "rejects" / "source=hdfs" / "ingest_date=2026-01-02" / "part-ev.jsonl.parquet"
    )
    assert storage.labels_path(tmp_path, "sessions", "labels.csv") == (
        tmp_path / "labels" / "source=sessions" / "part-labels.csv.parquet"
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
    assert [p.name for p in path.parent.iterdir()] == ["part-labels.csv.parquet"]  # no temp file left


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


def _reference_lines(data: bytes, limit: int):
    """The reader's rules, one line at a time: what the block reader must agree with."""
    good, rejects, blank = [], [], 0
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    for n, raw in enumerate(lines, 1):
        if len(raw) > limit:
            rejects.append((n, f"line longer than {limit} bytes"))
            continue
        try:
            text = raw.rstrip(b"\r").decode("utf-8")
        except UnicodeDecodeError:
            rejects.append((n, "undecodable"))
            continue
        if not text.strip():
            blank += 1
        else:
            good.append((n, text))
    return good, rejects, blank, len(lines)


@pytest.mark.parametrize("block_bytes", [1, 300, 1 << 20])
def test_block_reader_agrees_with_the_line_rules(tmp_path, block_bytes):
    """CRLF, blank and whitespace-only lines, bad bytes, over-long lines (also longer than a
    block), no newline at the end: every line is counted once, in order, at any block size."""
    from parsers.storage import LineReader

    limit = 100
    parts = [b"first", b"crlf line\r", b"", b"   \t", b"bad \xff\xfe bytes", b"x" * 150,
             "caf\u00e9 \u2603".encode(), b"y" * 5000, b"z" * 100, b"last, no newline"]
    data = b"\n".join(parts * 3)
    path = tmp_path / "in.log"
    path.write_bytes(data)
    rejects: list = []
    reader = LineReader(path, rejects, max_line_bytes=limit, block_bytes=block_bytes)
    got = [(n, t) for frame in reader.frames(4) for n, t in frame.rows()]
    good, expected_rejects, blank, read = _reference_lines(data, limit)
    assert got == good
    assert [(n, r.split(":")[0]) for n, r, _ in sorted(rejects)] == expected_rejects
    assert (reader.read, reader.blank) == (read, blank)
    assert all(len(text) <= 1024 for _, _, text in rejects)
    assert list(LineReader(path, [], max_line_bytes=limit)) == good  # iteration gives the same lines


def test_truncated_gzip_keeps_whole_lines_and_rejects_the_cut_one(tmp_path):
    import gzip

    from parsers.storage import LineReader

    whole = gzip.compress(b"".join(b"line %06d\n" % i for i in range(200_000)))
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    rejects: list = []
    reader = LineReader(cut, rejects)
    lines = list(reader)
    assert lines == [(i + 1, f"line {i:06d}") for i in range(len(lines))]  # no gap, no partial line
    assert len(rejects) == 1 and rejects[0][0] == len(lines) + 1 == reader.read + 1
    assert rejects[0][1].startswith("truncated or corrupt gzip")


def test_atomic_writes_fsync_the_file_and_its_folder(tmp_path, monkeypatch):
    """The temp file is flushed to disk before the rename, and the folder after it."""
    import os

    synced, replaced = [], []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    monkeypatch.setattr(os, "replace", lambda a, b: (replaced.append(len(synced)), real_replace(a, b)))
    target = tmp_path / "sub" / "state.json"
    storage.write_bytes_atomic(b"{}", target)
    assert target.read_bytes() == b"{}"
    assert len(synced) == 2 and synced[0].startswith(str(target.parent / ".state.json."))  # the temp file
    assert synced[1] == str(target.parent) and replaced == [1]  # the folder, after the one rename


def test_rejects_hold_at_most_1_kib_of_raw_text_each():
    rejects = storage.Rejects()
    rejects.append((1, "bad", "x" * 60_000))
    rejects.extend([(2, "bad", "y" * 5000)])
    rejects += [(3, "bad", "z" * 2000)]
    assert [len(r[2]) for r in rejects] == [storage.RAW_LIMIT] * 3 and [r[0] for r in rejects] == [1, 2, 3]


def test_replacing_dir_swaps_a_whole_folder_and_cleans_what_a_killed_writer_left(tmp_path):
    target = tmp_path / "bundle"
    target.mkdir()
    (target / "a.json").write_text("old")
    (tmp_path / ".bundle.building-x").mkdir()  # left by a killed writer
    with atomic.replacing_dir(target) as built:
        assert not (tmp_path / ".bundle.building-x").exists() and built.parent == tmp_path
        (built / "b.json").write_text("new")
        assert (target / "a.json").read_text() == "old"  # the old folder stays until the block ends
    assert sorted(p.name for p in target.iterdir()) == ["b.json"]  # the new set, no file of the old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]
    with pytest.raises(RuntimeError), atomic.replacing_dir(target) as built:  # a failed writer
        (built / "c.json").write_text("half")
        raise RuntimeError("killed halfway")
    assert sorted(p.name for p in target.iterdir()) == ["b.json"]  # left as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


def test_files_that_share_a_stem_get_their_own_parts_and_old_names_are_replaced(tmp_path):
    from parsers.events import ingest_events

    line = '{"session_id": "s1", "ts": 1700000000, "page": "/a"}\n'
    (tmp_path / "x.jsonl").write_text(line)
    (tmp_path / "x.json").write_text(line.replace("s1", "s2"))
    root = tmp_path / "root"
    for name in ("x.jsonl", "x.json"):
        ingest_events(tmp_path / name, root, source="web", ingest_date="2025-01-01")
    folder = storage.objects_dir(root, "web") / "ingest_date=2025-01-01"
    assert sorted(p.name for p in folder.glob("part-*")) == ["part-x.json.parquet", "part-x.jsonl.parquet"]
    assert sorted(storage.read_objects(root, "web")["sequence_id"].unique()) == ["s1", "s2"]  # both kept

    # a data root written before the new names: re-ingesting the file replaces its old part
    legacy = folder / "part-x.parquet"
    (folder / "part-x.jsonl.parquet").rename(legacy)
    assert storage.read_objects(root, "web").filter(pl.col("sequence_id") == "s1").height > 0
    ingest_events(tmp_path / "x.jsonl", root, source="web", ingest_date="2025-01-01")
    assert not legacy.exists()
    rows = storage.read_objects(root, "web")
    assert rows.filter(pl.col("sequence_id") == "s1").height == rows.filter(pl.col("sequence_id") == "s2").height


def test_write_version_keeps_each_version_whole_and_points_at_the_newest(tmp_path):
    path = tmp_path / "bundle"
    path.mkdir()  # the unversioned layout of older releases: kept as version 1
    (path / "a.json").write_text("v1")
    first = atomic.write_version(path, lambda d: (d / "a.json").write_text("v2"))
    assert first.name == "2" and path.is_symlink() and (path / "a.json").read_text() == "v2"
    assert (atomic.versions_dir(path) / "1" / "a.json").read_text() == "v1"
    held = Path(os.path.realpath(path))  # a reader resolved the link once
    with pytest.raises(RuntimeError):  # a failed writer: nothing changes
        atomic.write_version(path, lambda d: (_ for _ in ()).throw(RuntimeError("killed halfway")))
    assert Path(os.path.realpath(path)) == held and not list(atomic.versions_dir(path).glob(".building-*"))
    atomic.write_version(path, lambda d: (d / "a.json").write_text("v3"))
    assert (held / "a.json").read_text() == "v2" and (path / "a.json").read_text() == "v3"  # never rewritten
    for n in range(4, 10):
        atomic.write_version(path, lambda d, n=n: (d / "a.json").write_text(f"v{n}"), keep=3)
    assert sorted(int(p.name) for p in atomic.versions_dir(path).iterdir()) == [7, 8, 9]
    assert (path / "a.json").read_text() == "v9" and os.readlink(path) == "bundle.versions/9"
