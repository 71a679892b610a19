"""Session grouping (ids, field x time windows), labels from a label field, the reject-share rule."""

import datetime as dt
import json

import pytest
from test_parsers_presets import loghub

from parsers import storage
from parsers.log_ingest import ingest_logs
from parsers.sessions import SessionSpec
from training.cli.main import main

T0 = dt.datetime(2005, 6, 3, 15, 0, 0)


def test_ids_a_line_naming_two_blocks_belongs_to_both():
    spec = SessionSpec(id_pattern=r"blk_-?\d+")
    assert spec.sequence_ids({}, "copy blk_1 to blk_-2 then blk_1", None) == ["blk_1", "blk_-2"]
    assert spec.sequence_ids({}, "no block here", None) == []


def test_fixed_and_sliding_windows():
    fixed = SessionSpec(field="Node", window_s=3600)
    at = T0 + dt.timedelta(minutes=59, seconds=59)
    assert fixed.sequence_ids({"Node": "R02"}, "", at) == ["R02@2005-06-03T15:00:00Z"]
    assert fixed.sequence_ids({"Node": "R02"}, "", T0 + dt.timedelta(hours=1)) == ["R02@2005-06-03T16:00:00Z"]
    sliding = SessionSpec(field="Node", window_s=3600, step_s=1200)  # 1 h windows every 20 min
    ids = sliding.sequence_ids({"Node": "R02"}, "", T0 + dt.timedelta(minutes=30))
    # 15:30 lies in the windows starting 14:40, 15:00 and 15:20
    assert ids == ["R02@2005-06-03T14:40:00Z", "R02@2005-06-03T15:00:00Z", "R02@2005-06-03T15:20:00Z"]
    assert SessionSpec(window_s=60).sequence_ids({}, "", T0) == ["all@2005-06-03T15:00:00Z"]
    assert "no timestamp" in fixed.sequence_ids({"Node": "x"}, "", None)
    for bad in (dict(), dict(id_pattern="x", window_s=1), dict(window_s=10, step_s=20), dict(window_s=-1)):
        with pytest.raises(ValueError):
            SessionSpec(**bad)


def test_real_bgl_groups_by_node_and_hour_and_writes_labels(tmp_path):
    log = loghub() / "BGL" / "BGL_2k.log"
    report = ingest_logs(log, tmp_path, source="bgl", preset="bgl", ingest_date="2024-01-01")
    assert report["rejected"] == 0 and report["parsed"] == 2000 and report["no_sequence_id"] == 0
    assert report["session"] == "Node x 3600 s windows (fixed)"
    objects = storage.read_objects(tmp_path, "bgl")
    assert "label" not in set(objects["key"])  # the ground truth never becomes a key
    first = objects.filter(objects["sequence_id"] == objects["sequence_id"][0])
    assert first["sequence_id"][0].startswith("R02-M1-N0-C:J12-U11@2005-06-03T15:00:00Z")
    labels = storage.read_labels(tmp_path, "bgl")
    assert labels.height == report["sequences"]
    n_anomalous_lines = sum(1 for ln in log.read_text().splitlines() if not ln.startswith("-"))
    assert n_anomalous_lines == 143
    assert 0 < (labels["label"] == "Anomaly").sum() <= 143
    # sliding windows: every line is in window/step windows, so more objects than lines
    slid = ingest_logs(log, tmp_path / "s", source="bgl", preset="bgl", ingest_date="2024-01-01",
                       session=SessionSpec(field="Node", window_s=3600, step_s=1800))
    assert slid["objects"] == 2 * 2000


def test_reject_share_threshold_fails_the_command_but_keeps_the_outputs(tmp_path, capsys):
    log = tmp_path / "mixed.log"
    good = "081109 203615 148 INFO dfs.DataNode$PacketResponder: PacketResponder 1 for block blk_1 terminating"
    log.write_text("\n".join([good] * 8 + ["garbage line"] * 2) + "\n")
    args = ["ingest", "logs", str(log), "--root", str(tmp_path / "d"), "--date", "2024-01-01", "--source", "hdfs"]
    assert main([*args, "--max-reject-share", "0.1"]) == 3
    report = json.loads(capsys.readouterr().out)
    assert report["reject_share"] == pytest.approx(0.2) and report["rejected"] == 2
    assert storage.read_rejects(tmp_path / "d", "hdfs").height == 2  # the reasons are written
    # a failed file leaves no objects part and no Drain3 state behind
    assert not list(storage.objects_dir(tmp_path / "d", "hdfs").rglob("part-*.parquet"))
    assert not storage.drain_state_path(tmp_path / "d", "hdfs").exists()
    assert main([*args, "--max-reject-share", "0.25"]) == 0


def test_windows_shorter_than_a_second_never_share_an_id():
    """Ids were written to the second, so every window of a 0.5 s cut within one second got the
    same id and their lines merged into one sequence without a word (Spark_2k spans 31 s)."""
    half = SessionSpec(window_s=0.5)
    first = half.sequence_ids({}, "", T0 + dt.timedelta(milliseconds=100))
    second = half.sequence_ids({}, "", T0 + dt.timedelta(milliseconds=700))
    assert first == ["all@2005-06-03T15:00:00.000000Z"] and second == ["all@2005-06-03T15:00:00.500000Z"]
    ids = {i for ms in range(0, 10_000, 37) for i in half.sequence_ids({}, "", T0 + dt.timedelta(milliseconds=ms))}
    assert len(ids) == 20  # ten seconds, two windows each
    sliding = SessionSpec(window_s=1.5, step_s=0.75).sequence_ids({}, "", T0 + dt.timedelta(seconds=1, milliseconds=100))
    assert sliding == ["all@2005-06-03T15:00:00.000000Z", "all@2005-06-03T15:00:00.750000Z"]
    assert SessionSpec(window_s=2).sequence_ids({}, "", T0) == ["all@2005-06-03T15:00:00Z"]  # whole seconds: as before
    with pytest.raises(ValueError, match="under 0.001 s"):
        SessionSpec(window_s=0.0005)


def test_a_step_that_puts_a_line_in_too_many_windows_is_refused_not_capped():
    from parsers.sessions import MAX_WINDOWS_PER_LINE, SessionSpec

    ok = SessionSpec(window_s=3600, step_s=3600 / MAX_WINDOWS_PER_LINE)
    ts = dt.datetime(2025, 1, 1, 12, 0, 0)
    assert len(ok.sequence_ids({}, "", ts)) == MAX_WINDOWS_PER_LINE
    with pytest.raises(ValueError, match="windows; at most 1000: use a larger step"):
        SessionSpec(window_s=3600, step_s=1)
