"""The operations DAGs on a real CeleryExecutor cluster (training.airflow.local_cluster): PostgreSQL
metadata, a Redis broker, the API server, scheduler, DAG processor and two Celery workers, each in
its own process and working directory. seqenc_ingest -> seqenc_nightly_training ->
seqenc_batch_score are triggered with the Airflow CLI and run by the workers; then the same three
DAGs run in one process (``dag.test``, SQLite) on a copy of the landing directory, and everything
they wrote must be the same: the Parquet objects and labels, the Drain3 templates, the predictions.

Needs Debian's ``redis-server`` and ``postgresql`` (``make test`` installs what is missing; CI too).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import psutil
import pytest
from airflow_run import airflow_env, migrate, plant_stale_part, run_dag
from shared_data import in_ci

from parsers import storage
from parsers.logs import make_miner
from parsers.presets import PRESETS
from parsers.synthetic import generate_hdfs_logs, generate_session_events
from training.airflow.cluster_client import airflow, trigger, wait_for_dags, wait_run
from training.airflow.local_cluster import LocalCluster, postgres_tool

DAY = "2025-03-01"
LOGICAL = "2025-03-02T00:00:00+00:00"
SOURCES = ("hdfs", "sessions")
WORKERS = {"worker-1", "worker-2"}

missing = [t for t in ("redis-server",) if not shutil.which(t)] + [t for t in ("initdb", "pg_ctl") if not postgres_tool(t)]
pytestmark = pytest.mark.skipif(bool(missing) and not in_ci(),
                                reason=f"not installed: {missing} (make test installs them)")


def _landing(folder: Path) -> None:
    """Several files of one day: a rotated HDFS log (two files, each with its labels) and sessions."""
    hdfs, sessions = folder / "hdfs" / DAY, folder / "sessions" / DAY
    hdfs.mkdir(parents=True)
    sessions.mkdir(parents=True)
    for i in range(2):
        generate_hdfs_logs(hdfs / f"hdfs-{i}.log", hdfs / f"hdfs-{i}_labels.csv", n_blocks=100, anomaly_rate=0.1,
                           seed=i)
    generate_session_events(sessions / "sessions.jsonl", sessions / "sessions_labels.csv", n_sessions=120, seed=0)


def _confs(workdir: Path) -> dict:
    w = str(workdir)
    return {"seqenc_ingest": {"workdir": w, "date": DAY},
            "seqenc_nightly_training": {"workdir": w, "tasks": ["anomaly"], "size": "tiny", "window_days": 3,
                                        "date": DAY},
            "seqenc_batch_score": {"workdir": w, "date": DAY}}


def _outputs(workdir: Path) -> dict:
    root = workdir / "data"
    out = {"objects": {s: storage.read_objects(root, s, DAY).sort("sequence_id", "step", "key") for s in SOURCES},
           "labels": {s: storage.read_labels(root, s).sort("sequence_id") for s in SOURCES}}
    miner = make_miner(PRESETS["hdfs"], storage.drain_state_path(root, "hdfs"))
    out["templates"] = {c.cluster_id: c.get_template() for c in miner.drain.clusters}
    out["predictions"] = pl.read_parquet(workdir / "predictions" / "anomaly" / f"date={DAY}" / "part-0.parquet")
    return out


def _ok(run: dict, skipped: set = frozenset()) -> None:
    bad = {t: ti["state"] for t, ti in run["tis"].items() if ti["state"] != ("skipped" if t in skipped else "success")}
    assert run["run_state"] == "success" and not bad, bad


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("celery")
    work, alone = base / "cluster-work", base / "one-process-work"
    _landing(work / "landing")
    shutil.copytree(work / "landing", alone / "landing")
    threads = {"OMP_NUM_THREADS": "1"}  # the same arithmetic in both runs: the same model, the same scores
    cluster = LocalCluster(base / "cluster")
    cluster.up(workers=2, workdir=str(work), no_schedules=True, extra_env=threads)
    out: dict = {"work": work, "cluster": cluster}
    try:
        env = cluster.client_env()
        wait_for_dags(env, list(_confs(work)))
        ingest = _confs(work)["seqenc_ingest"]
        trigger(env, "seqenc_ingest", "ingest-1", LOGICAL, ingest)
        out["ingest"] = wait_run(env, "seqenc_ingest", "ingest-1")
        _ok(out["ingest"])
        out["first"] = {s: storage.read_objects(work / "data", s, DAY) for s in SOURCES}
        out["stale"] = plant_stale_part(work / "data", "hdfs", DAY, "hdfs-0.log")  # re-running must drop it
        airflow(env, "tasks", "clear", "seqenc_ingest", "--start-date", DAY, "--end-date", "2025-03-03", "--yes")
        out["rerun"] = wait_run(env, "seqenc_ingest", "ingest-1")
        for dag_id, run_id in (("seqenc_nightly_training", "nightly-1"), ("seqenc_batch_score", "score-1")):
            trigger(env, dag_id, run_id, LOGICAL, _confs(work)[dag_id])
            out[dag_id] = wait_run(env, dag_id, run_id)
    finally:
        pids = dict(cluster.state.get("pids", {}))
        cluster.down()
    out["processes_left"] = [n for n, pid in pids.items()
                             if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]

    home = base / "one-process-airflow"
    env = airflow_env(home, {"SEQENC_WORKDIR": str(alone), **threads})
    migrate(env)
    for dag_id, conf in _confs(alone).items():
        run = run_dag(dag_id, conf, env, LOGICAL.removesuffix("+00:00"))
        assert run["run_state"] == "success", run["_output"][-5000:]
    out["cluster_outputs"], out["one_process_outputs"] = _outputs(work), _outputs(alone)
    return out


def test_mapped_ingest_tasks_ran_on_both_workers(runs):
    tis = runs["ingest"]["tis"]
    mapped = {t: ti for t, ti in tis.items() if t.startswith(("mine_file[", "ingest_file["))}
    assert len(mapped) == 2 * 6  # six landing files, each mined and ingested by its own task
    assert {ti["hostname"] for ti in mapped.values()} == WORKERS  # every mapped task on a worker; both took some
    assert len({ti["pid"] for ti in mapped.values()}) == len(mapped)  # each task in its own process
    assert {ti["hostname"] for ti in tis.values()} <= WORKERS  # nothing ran anywhere else (the scheduler, say)


def test_nightly_training_and_batch_scoring_ran_on_the_workers(runs):
    nightly, score = runs["seqenc_nightly_training"], runs["seqenc_batch_score"]
    _ok(nightly)
    assert nightly["tis"]["promote[0]"]["xcom"]["promoted"] is True
    _ok(score, {"score[1]", "score[2]"})  # milestone, next_item: no champion, skipped with that reason
    assert {ti["hostname"] for ti in [*nightly["tis"].values(), *score["tis"].values()]
            if ti["state"] == "success"} <= WORKERS
    assert runs["processes_left"] == []  # down stopped every process it started


def test_the_cluster_writes_what_one_process_writes(runs):
    ours, alone = runs["cluster_outputs"], runs["one_process_outputs"]
    for source in SOURCES:
        assert ours["objects"][source].height > 0
        assert ours["objects"][source].equals(alone["objects"][source]), source
        assert ours["labels"][source].equals(alone["labels"][source]), source
    assert ours["templates"] and ours["templates"] == alone["templates"]
    assert ours["predictions"].height == 200
    assert ours["predictions"].equals(alone["predictions"])


def test_rerunning_the_interval_replaces_its_partitions_exactly(runs):
    _ok(runs["rerun"])
    assert {ti["try_number"] for t, ti in runs["rerun"]["tis"].items() if t.startswith("ingest_file[")} == {2}
    assert not runs["stale"].exists()  # the part no file produces any more is gone
    work = runs["work"]
    for source, before in runs["first"].items():
        after = storage.read_objects(work / "data", source, DAY)
        assert after.sort("sequence_id", "step", "key").equals(before.sort("sequence_id", "step", "key")), source
    assert storage.read_labels(work / "data", "hdfs").height == 200  # both files' labels once, not twice
    manifest = json.loads((storage.objects_dir(work / "data", "hdfs") / f"ingest_date={DAY}" / "_manifest.json")
                          .read_text())
    assert manifest["parts"] == ["part-hdfs-0.log.parquet", "part-hdfs-1.log.parquet"]


def test_bench_ingest_adds_celery_rows(tmp_path):
    """``seqenc bench ingest --executor celery``: the same files through seqenc_ingest on a cluster
    of two workers, next to the process row of the same run; the same templates and grouping as the
    serial ingest, every line read, the mapped tasks on both workers, a peak RSS per worker."""
    from training.cli.main import main

    out = tmp_path / "ingest.json"
    assert main(["bench", "ingest", "--lines", "3000", "--workers", "2", "--files", "4", "--no-loops",
                 "--executor", "celery", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["parallel"]
    assert [(r["executor"], r["workers"]) for r in rows] == [("process", 2), ("celery", 2)]
    celery = rows[1]
    assert celery["same_templates"] is True and celery["same_grouping"] is True and celery["read"] == 3000
    assert celery["hosts"] == sorted(WORKERS) and set(celery["peak_rss_mb_per_worker"]) == WORKERS
    assert all(50 < mb < 4096 for mb in celery["peak_rss_mb_per_worker"].values())
    assert celery["seconds"] > 0 and celery["lines_per_s"] == pytest.approx(3000 / celery["seconds"], rel=0.01)
    assert "| celery | 2 |" in out.with_suffix(".md").read_text()


def _netns_pair() -> tuple[str, str, str] | None:
    """A network namespace joined to this one by a veth pair: (namespace, our address, its
    address), or None where namespaces cannot be made here (not root, no iproute2)."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        return None
    tag = f"{os.getpid() % 100000}"
    ns, a, b, net = f"sqhost{tag}", f"sqa{tag}", f"sqb{tag}", f"10.{77 + os.getpid() % 100}.{os.getpid() % 250}"
    cmds = [["ip", "netns", "add", ns], ["ip", "link", "add", a, "type", "veth", "peer", "name", b],
            ["ip", "link", "set", b, "netns", ns], ["ip", "addr", "add", f"{net}.1/24", "dev", a],
            ["ip", "link", "set", a, "up"], ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{net}.2/24", "dev", b],
            ["ip", "netns", "exec", ns, "ip", "link", "set", b, "up"],
            ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]]
    for cmd in cmds:
        if subprocess.run(cmd, capture_output=True).returncode:
            _netns_remove(ns, a)
            return None
    return ns, f"{net}.1", a


def _netns_remove(ns: str, link: str) -> None:
    subprocess.run(["ip", "link", "del", link], capture_output=True)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_a_worker_on_another_host_takes_tasks(tmp_path):
    """Two hosts as far as the network goes: this one runs PostgreSQL, Redis, the API server, the
    scheduler and one worker on an address of a veth pair; a second network namespace (its own
    loopback, its own interfaces) runs the other worker, which reaches them only over that link.
    The files are shared, as an NFS mount would share them. Mapped ingest tasks run on both."""
    pair = _netns_pair()
    if pair is None:
        if in_ci():
            pytest.fail("CI runs as root with iproute2: network namespaces must work there")
        pytest.skip("network namespaces need root and iproute2 (ip netns)")
    ns, address, link = pair
    work = tmp_path / "work"
    day = work / "landing" / "hdfs" / DAY
    day.mkdir(parents=True)
    for i in range(3):
        generate_hdfs_logs(day / f"hdfs-{i}.log", day / f"hdfs-{i}_labels.csv", n_blocks=60, anomaly_rate=0.1, seed=i)
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        cluster.up(workers=1, workdir=str(work), no_schedules=True, host=address)
        started = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "training.airflow.local_cluster",
                                  "worker", "--dir", str(cluster.dir), "--name", "other-host"],
                                 capture_output=True, text=True, timeout=400)
        assert started.returncode == 0, started.stderr[-3000:]
        cluster = LocalCluster(cluster.dir)  # the worker command added itself to cluster.json
        remote = cluster.state["pids"]["other-host"]
        assert os.readlink(f"/proc/{remote}/ns/net") != os.readlink("/proc/self/ns/net")  # another network
        env = cluster.client_env()
        wait_for_dags(env, ["seqenc_ingest"])
        trigger(env, "seqenc_ingest", "two-hosts", LOGICAL, {"workdir": str(work), "date": DAY})
        run = wait_run(env, "seqenc_ingest", "two-hosts")
    finally:
        cluster.down()
        _netns_remove(ns, link)
    _ok(run)
    hosts = {ti["hostname"] for t, ti in run["tis"].items() if t.startswith(("mine_file[", "ingest_file["))}
    assert hosts == {"worker-1", "other-host"}
    assert storage.read_objects(work / "data", "hdfs", DAY)["sequence_id"].n_unique() == 180
