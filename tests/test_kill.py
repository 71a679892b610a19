"""Kill tests (issue 24, item 3): the real command as a child process, SIGKILLed at several points
of its work. Afterwards the data root holds the old partition or the new one, never a torn one,
and a re-run gives exactly the rows of an uninterrupted run. (Training under SIGKILL:
tests/test_resume.py.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from parsers import storage

N_EVENTS = 60_000
KILL_AT = (0.15, 0.4, 0.65, 0.9)  # shares of an uninterrupted run's wall time (imports, parse, write)


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kill") / "events.jsonl"
    with path.open("w") as fh:
        for i in range(N_EVENTS):
            fh.write(json.dumps({"session_id": f"s{i % 900}", "ts": 1_700_000_000 + i,
                                 "payload": {"page": f"/p/{i % 37}", "n": i % 11, "tags": ["a", "b"][: i % 3]}}) + "\n")
    return path


def _ingest_cmd(path: Path, root: Path) -> list[str]:
    return [sys.executable, "-m", "training.cli.main", "ingest", "events", str(path), "--root", str(root),
            "--source", "web", "--date", "2025-01-01"]


def _rows(root: Path) -> pl.DataFrame:
    return storage.read_objects(root, "web").sort("sequence_id", "step", "key")


def test_ingest_killed_at_any_point_leaves_no_torn_part_and_reruns_the_same(events, tmp_path):
    straight = tmp_path / "straight"
    t0 = time.perf_counter()
    subprocess.run(_ingest_cmd(events, straight), check=True, capture_output=True, timeout=600)
    seconds = time.perf_counter() - t0
    want = _rows(straight)
    assert want.height > N_EVENTS
    for delay in (share * seconds for share in KILL_AT):
        root = tmp_path / f"killed-{delay}"
        # an earlier ingest of the same file is there: a kill must leave it or the new one
        subprocess.run(_ingest_cmd(events, root), check=True, capture_output=True, timeout=600)
        child = subprocess.Popen(_ingest_cmd(events, root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        parts = list(root.rglob("part-*.parquet"))
        assert [p.name for p in parts if p.relative_to(root).parts[0] == "objects"] == ["part-events.jsonl.parquet"], delay
        assert _rows(root).equals(want), delay  # the old part, whole (the new one is the same)
        subprocess.run(_ingest_cmd(events, root), check=True, capture_output=True, timeout=600)
        assert _rows(root).equals(want), delay
        assert not [p for p in root.rglob(".*") if p.is_file() and p.suffix == ".parquet"]  # no temp taken as data


def test_first_ingest_killed_leaves_nothing_or_everything(events, tmp_path):
    want = None
    for delay in (0.3, 1.0):
        root = tmp_path / f"first-{delay}"
        child = subprocess.Popen(_ingest_cmd(events, root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        parts = list((root / "objects").rglob("part-*.parquet")) if (root / "objects").exists() else []
        if parts:  # it finished before the kill: the whole part
            assert pl.read_parquet(parts[0]).height > N_EVENTS
        subprocess.run(_ingest_cmd(events, root), check=True, capture_output=True, timeout=600)
        got = _rows(root)
        want = got if want is None else want
        assert got.equals(want)


def test_sequences_stage_killed_leaves_the_old_outputs_or_the_new(prepared_task, tmp_path):
    """stage_sequences in a child, killed at several points: the task's folder is always a
    whole set of files (the old run's or the new one's), and a re-run cleans what the kill left."""
    import shutil

    from training.pipeline import stages as pipeline
    from training.tasks.spec import resolve_task

    work = tmp_path / "w"
    shutil.copytree(prepared_task("milestone"), work)
    seq_dir = pipeline.sequences_dir(work, "milestone")
    files = sorted(p.name for p in seq_dir.iterdir())
    code = ("import sys; from training.pipeline.stages import stage_sequences; "
            "from training.tasks.spec import resolve_task; "
            "stage_sequences(sys.argv[1], resolve_task(None, 'milestone'), 'tiny', seed=1)")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, str(work)], check=True, capture_output=True, timeout=600)
    seconds = time.perf_counter() - t0
    for share in KILL_AT:
        child = subprocess.Popen([sys.executable, "-c", code, str(work)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        time.sleep(share * seconds)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        assert sorted(p.name for p in seq_dir.iterdir()) == files, share
        json.loads((seq_dir / "stats.json").read_text())  # whole, readable
    pipeline.stage_sequences(str(work), resolve_task(None, "milestone"), "tiny", seed=1)
    assert not [p for p in seq_dir.parent.iterdir() if p.name.startswith(".")]


def test_two_log_ingests_of_one_source_run_one_after_the_other(tmp_path):
    """Log ingests of a source share its Drain3 state: while one holds the source's lock, a second
    waits (and says so in one warning), then runs on the state the first saved."""
    from parsers.synthetic import generate_hdfs_logs

    log = tmp_path / "hdfs.log"
    generate_hdfs_logs(log, tmp_path / "labels.csv", n_blocks=30, anomaly_rate=0.1, seed=0)
    root = tmp_path / "root"
    err = tmp_path / "child.err"
    with storage.source_lock(root, "hdfs"):  # another ingest of the source is running
        with err.open("w") as fh:
            child = subprocess.Popen([sys.executable, "-m", "training.cli.main", "ingest", "logs", str(log), "--root",
                                      str(root), "--source", "hdfs"], stdout=subprocess.DEVNULL, stderr=fh)
        deadline = time.time() + 60
        while "waiting for it to finish" not in err.read_text() and time.time() < deadline:
            time.sleep(0.05)
        assert "waiting for it to finish" in err.read_text()
        time.sleep(0.5)
        assert child.poll() is None and not (root / "objects").exists()  # it waits: nothing written
    assert child.wait(timeout=120) == 0
    assert storage.read_objects(root, "hdfs").height > 0 and storage.drain_state_path(root, "hdfs").exists()


@pytest.fixture(scope="module")
def scoring(tmp_path_factory) -> dict:
    """A random-init tiny bundle and 400 ingested HDFS blocks to score (training.bench.score.prepare)."""
    import training.bench.score as bench_score

    settings = bench_score.ScoreBenchSettings(sequences=400, d_model=32, n_layers=1, n_heads=2, n_shared_heads=1,
                                              d_ff=64, max_positions=64, vocab_size=512)
    root, bundle, _ = bench_score.prepare(settings, tmp_path_factory.mktemp("score"))
    return {"root": root, "bundle": bundle}


def _score_cmd(scoring: dict, out: Path) -> list[str]:
    return [sys.executable, "-m", "training.cli.main", "score", "--model", str(scoring["bundle"]), "--input",
            str(scoring["root"]), "--out", str(out), "--no-progress", "--chunk-sequences", "50"]


def test_batch_scoring_killed_leaves_the_old_predictions_or_the_new(scoring, tmp_path):
    straight = tmp_path / "straight"
    t0 = time.perf_counter()
    subprocess.run(_score_cmd(scoring, straight), check=True, capture_output=True, timeout=600)
    seconds = time.perf_counter() - t0
    (want_path,) = straight.rglob("part-*.parquet")
    want = pl.read_parquet(want_path)
    assert want.height == 400
    for delay in (share * seconds for share in KILL_AT):
        out = tmp_path / f"killed-{delay}"
        shutil.copytree(straight, out)  # an earlier run's output is there
        child = subprocess.Popen(_score_cmd(scoring, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        parts = list(out.rglob("*.parquet"))
        assert [p.name for p in parts] == ["part-0.parquet"], (delay, parts)  # no temp file left as data
        assert pl.read_parquet(parts[0]).equals(want), delay  # whole: the old one (the new is the same)
        subprocess.run(_score_cmd(scoring, out), check=True, capture_output=True, timeout=600)
        assert pl.read_parquet(parts[0]).equals(want), delay


def test_a_reader_sees_whole_partitions_while_an_ingest_rewrites_them(events, tmp_path):
    """A nightly training reads while the day's ingest runs again (a retry, a late file): the
    ingest swaps each part in with one rename, so every read sees the old part or the new one,
    whole -- no lock needed, and none is taken (issue 24, item 4)."""
    root = tmp_path / "root"
    subprocess.run(_ingest_cmd(events, root), check=True, capture_output=True, timeout=600)
    want = _rows(root)
    script = "; ".join(f"{' '.join(map(str, _ingest_cmd(events, root)))}" for _ in range(3))
    writer = subprocess.Popen(["bash", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    reads = 0
    try:
        while writer.poll() is None:
            assert _rows(root).equals(want)
            reads += 1
    finally:
        writer.wait(timeout=600)
    assert writer.returncode == 0 and reads >= 3
    assert _rows(root).equals(want)
