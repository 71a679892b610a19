"""Parallel log ingest (parsers.parallel_ingest): files mined in parallel, their contents merged
into the Drain3 state in one serial step, then written in parallel. The Drain3 state and every
object's template must be those of a serial ingest of the same files in the same order."""

import json
import threading
from pathlib import Path

import polars as pl
import pytest
from shared_data import DATA, require
from test_parsers_presets import LOGHUB_PRESETS

from parsers import storage
from parsers.landing import (
    finalize_interval,
    find_interval_files,
    ingest_file,
    merge_landing,
    mine_landing_file,
    prepare_formats,
)
from parsers.log_ingest import ingest_logs
from parsers.logs import make_miner
from parsers.parallel_ingest import ingest_parallel, merge_mined, mine_file, write_file
from parsers.presets import PRESETS
from parsers.synthetic import generate_hdfs_logs
from training.cli.main import main

DAY = "2025-01-01"


def _split(lines: list[str], n: int, folder: Path, name: str = "part") -> list[Path]:
    """``lines`` cut into ``n`` files of consecutive lines (a rotated log)."""
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-len(lines) // n)
    paths = []
    for i in range(n):
        path = folder / f"{name}-{i}.log"
        path.write_text("".join(line + "\n" for line in lines[i * per:(i + 1) * per]), encoding="utf-8")
        paths.append(path)
    return paths


def _outcome(root: Path, preset: str, source: str = "s") -> dict:
    """What must not depend on serial or parallel: the Drain3 clusters, and per part the
    (sequence_id, step, template_id) of every object in order, the rejects and the labels.
    (Not the slots: the parallel write extracts them against the templates after the whole
    batch's merge, which may be more general than a serial run's at an earlier file.)"""
    miner = make_miner(PRESETS[preset], storage.drain_state_path(root, source))
    parts = {}
    for table in ("objects", "rejects", "labels"):
        for part in sorted((root / table).rglob("part-*.parquet")):
            frame = pl.read_parquet(part)
            if table == "objects":
                frame = frame.select("sequence_id", "step", "template_id").unique(maintain_order=True)
            elif table == "rejects":
                frame = frame.select("line_no", "reason")
            parts[f"{table}/{part.parent.name}/{part.name}"] = frame.rows()
    return {"clusters": {c.cluster_id: c.get_template() for c in miner.drain.clusters}, "parts": parts}


def _serial(paths, root, preset):
    return [ingest_logs(p, root, source="s", preset=preset, ingest_date=DAY) for p in paths]


def _mine_and_merge(paths, root, preset="hdfs"):
    """Steps 1 and 2 in this process: mine every file, then merge them in order."""
    for p in paths:
        mine_file(p, root, "s", preset, DAY)
    merge_mined([(p, DAY) for p in paths], root, "s", preset)


def _three_steps(paths, root, preset):
    """The parallel algorithm in this process: mine every file, merge, write every file."""
    _mine_and_merge(paths, root, preset)
    return [write_file(p, root, "s", preset, DAY) for p in paths]


@pytest.mark.parametrize("name", sorted(LOGHUB_PRESETS))
def test_same_templates_and_grouping_as_serial_on_loghub(tmp_path, name):
    log = require(DATA / "loghub") / name / f"{name}_2k.log"
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    paths = _split(lines, 3, tmp_path / "in")
    preset = LOGHUB_PRESETS[name]
    serial = _serial(paths, tmp_path / "serial", preset)
    parallel = _three_steps(paths, tmp_path / "parallel", preset)
    expected = _outcome(tmp_path / "serial", preset)
    assert expected["parts"] and len(expected["clusters"]) > 5
    assert _outcome(tmp_path / "parallel", preset) == expected
    for a, b in zip(serial, parallel):
        assert {k: a[k] for k in ("read", "parsed", "rejected", "objects", "sequences")} == \
            {k: b[k] for k in ("read", "parsed", "rejected", "objects", "sequences")}


def _hdfs_lines(tmp_path, n_blocks=120) -> list[str]:
    generate_hdfs_logs(tmp_path / "gen.log", tmp_path / "gen.csv", n_blocks=n_blocks, anomaly_rate=0.1, seed=3)
    lines = (tmp_path / "gen.log").read_text().splitlines()
    return lines[:700] + ["not an hdfs line", "081109 99 148 INFO x: bad timestamp blk_1"] + lines[700:]


def test_cli_workers_match_serial_with_a_process_pool(tmp_path, capsys):
    paths = _split(_hdfs_lines(tmp_path), 3, tmp_path / "in")
    _serial(paths, tmp_path / "serial", "hdfs")
    args = ["ingest", "logs", *map(str, paths), "--root", str(tmp_path / "par"), "--source", "s", "--preset", "hdfs",
            "--date", DAY, "--workers", "2"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["workers"] == 2 and len(report["files"]) == 3 and report["merge"]["files"] == 3
    assert report["read"] == sum(1 for p in paths for _ in p.open()) and report["rejected"] == 2
    assert 0 < report["workers_peak_rss_mb"] < 4096
    assert _outcome(tmp_path / "par", "hdfs") == _outcome(tmp_path / "serial", "hdfs")
    assert not list(storage.mined_dir(tmp_path / "par", "s").rglob("*.parquet"))  # cleared at the end
    # a re-run replaces its output: same rows, and the Drain3 state keeps its clusters
    assert main(args) == 0
    capsys.readouterr()
    assert _outcome(tmp_path / "par", "hdfs") == _outcome(tmp_path / "serial", "hdfs")


def test_write_step_reads_no_state_and_takes_no_lock(tmp_path):
    paths = _split(_hdfs_lines(tmp_path, 40), 2, tmp_path / "in")
    root = tmp_path / "root"
    _mine_and_merge(paths, root)
    state = storage.drain_state_path(root, "s")
    saved = state.read_bytes()
    state.unlink()  # the write step must not need it ...
    done = []
    with storage.source_lock(root, "s", "a test holding the lock"):  # ... nor wait for the source's lock
        worker = threading.Thread(target=lambda: done.append(write_file(paths[0], root, "s", "hdfs", DAY)))
        worker.start()
        worker.join(timeout=120)
    assert done and done[0]["rows"] > 0
    assert not state.exists()  # and does not write it
    state.write_bytes(saved)


def test_a_file_changed_after_mining_is_refused(tmp_path):
    paths = _split(_hdfs_lines(tmp_path, 40), 2, tmp_path / "in")
    root = tmp_path / "root"
    _mine_and_merge(paths, root)
    with paths[1].open("a") as fh:
        fh.write("081109 203615 148 INFO dfs.Something: a line nobody mined blk_9\n")
    with pytest.raises(ValueError, match="not mined.*changed after the mine step"):
        write_file(paths[1], root, "s", "hdfs", DAY)
    assert not list(storage.objects_dir(root, "s").rglob("part-part-1.log.parquet"))
    with pytest.raises(FileNotFoundError, match="run the mine and merge steps first"):
        write_file(tmp_path / "never-mined.log", root, "s", "hdfs", DAY)


def test_a_file_over_the_reject_share_leaves_no_part_and_the_others_are_written(tmp_path):
    good = _split(_hdfs_lines(tmp_path, 40), 2, tmp_path / "in")
    bad = tmp_path / "in" / "broken.log"
    bad.write_text("garbage\n" * 30 + good[0].read_text().splitlines()[0] + "\n")
    root = tmp_path / "root"
    with pytest.raises(storage.RejectShareExceeded):
        ingest_parallel([*good, bad], root, source="s", preset="hdfs", ingest_date=DAY, workers=1,
                        max_reject_share=0.1)
    parts = sorted(p.name for p in storage.objects_dir(root, "s").rglob("part-*.parquet"))
    assert parts == ["part-part-0.log.parquet", "part-part-1.log.parquet"]
    assert storage.read_rejects(root, "s").filter(pl.col("file").str.ends_with("broken.log")).height == 30


def test_landing_steps_in_parallel_match_the_serial_landing(tmp_path):
    landing = tmp_path / "landing"
    for day, seed in (("2025-03-01", 0), ("2025-03-02", 1)):
        folder = landing / "hdfs" / day
        folder.mkdir(parents=True)
        generate_hdfs_logs(folder / "gen.log", folder / "labels.csv", n_blocks=30, anomaly_rate=0.1, seed=seed)
        lines = (folder / "gen.log").read_text().splitlines()
        (folder / "gen.log").unlink()
        _split(lines, 2, folder, "dn")
    days = ["2025-03-01", "2025-03-02"]
    files = find_interval_files(landing, days)
    serial_root, parallel_root = tmp_path / "serial", tmp_path / "parallel"
    for item in files:
        ingest_file(item, serial_root)
    finalize_interval(serial_root, days, files)
    prepare_formats(files, parallel_root)
    mined = [mine_landing_file(item, parallel_root) for item in files]
    assert [m.get("mined", False) for m in mined] == [f["kind"] == "logs" for f in files]
    reports = [ingest_file(item, parallel_root) for item in merge_landing(mined, parallel_root)]
    assert all(r["rows"] > 0 for r in reports if r["kind"] == "logs")
    finalize_interval(parallel_root, days, files)
    assert _outcome(parallel_root, "hdfs", "hdfs") == _outcome(serial_root, "hdfs", "hdfs")
    assert not list(storage.mined_dir(parallel_root, "hdfs").rglob("*.parquet"))


def test_bench_ingest_parallel_rows(tmp_path):
    out = tmp_path / "ingest.json"
    assert main(["bench", "ingest", "--lines", "3000", "--workers", "1,2", "--files", "4", "--no-loops",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [row["workers"] for row in result["parallel"]] == [1, 2]
    for row in result["parallel"]:
        assert {"workers", "lines_per_s", "peak_rss_mb", "same_templates"} <= set(row)
        assert row["same_templates"] is True and row["same_grouping"] is True and row["read"] == 3000
        assert row["lines_per_s"] > 0 and 0 < row["peak_rss_mb"] < 4096
    assert result["files"] == 4 and result["serial"]["read"] == 3000
    assert "drain3_loop_lines_per_s" not in result  # --no-loops
    assert {row["executor"] for row in result["parallel"]} == {"process"}
    assert "| executor | workers | lines/s |" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").stat().st_size > 0
    with pytest.raises(SystemExit, match="--workers takes whole numbers separated by commas"):
        main(["bench", "ingest", "--lines", "10", "--workers", "1,x", "--json", str(out)])


def test_one_unusable_log_file_does_not_hold_up_the_interval(tmp_path):
    """A landing log file that cannot be mined (here: a source with no log format) fails its own
    ingest task with the clear error; the interval's other files are mined, merged and written."""
    landing, root = tmp_path / "landing", tmp_path / "root"
    good = landing / "hdfs" / "2025-03-01"
    good.mkdir(parents=True)
    _split(_hdfs_lines(tmp_path, 20), 2, good, "dn")
    odd = landing / "mystery" / "2025-03-01"
    odd.mkdir(parents=True)
    (odd / "app.log").write_text("something happened\n")
    files = find_interval_files(landing, ["2025-03-01"])
    mined = merge_landing([mine_landing_file(item, root) for item in files], root)
    assert [(m["source"], m["mined"]) for m in mined] == [("hdfs", True), ("hdfs", True), ("mystery", False)]
    assert "has no log format" in mined[2]["mine_error"]
    assert all(ingest_file(item, root)["rows"] > 0 for item in mined[:2])
    with pytest.raises(ValueError, match="has no log format"):
        ingest_file(mined[2], root)
