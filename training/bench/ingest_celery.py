"""``seqenc bench ingest --executor celery``: the ``parallel`` rows with the files ingested by the
seqenc_ingest DAG on a real CeleryExecutor cluster (training.airflow.local_cluster: PostgreSQL,
Redis, the API server, scheduler, DAG processor and W Celery workers of concurrency 1).

For each worker count W a fresh cluster is started, the same files as the process rows (the N
lines cut into consecutive files) are put in its landing directory as one day of the catalogue's
``hdfs`` source (preset ``hdfs``), and the DAG is triggered once; the cluster is stopped after.

* ``seconds``: the DAG run's own start to end in the metadata database (scheduling, every task's
  process start-up, mine -> merge -> write -> finalize), not the cluster's start-up;
  ``lines_per_s`` = lines / seconds; ``speedup`` against the serial ingest of the same files
  (the process rows' reference, measured in the same bench run);
* ``peak_rss_mb_per_worker``: each worker's peak resident memory, its whole process tree (the
  Celery worker, its pool process and the task processes it runs) sampled every 0.5 s during the
  run; ``peak_rss_mb`` the largest of them (as the process rows: the largest worker's peak);
* ``same_templates`` / ``same_grouping``: as the process rows, against the serial ingest (the
  Drain3 clusters; a digest of each part's ``(sequence_id, step, template_id)``);
* ``hosts``: the workers the mapped tasks ran on (task instances' hostnames).
"""

from __future__ import annotations

import os
import shutil
import time
from datetime import datetime
from pathlib import Path

import psutil

DAY = "2000-01-01"  # the landing day (the param ``date``)
# the run's logical date: after the DAGs' start_date (Airflow creates no task instance before it)
LOGICAL = "2025-01-02T00:00:00+00:00"
SOURCE = "hdfs"  # the built-in catalogue's log source with the hdfs preset, as the serial reference


def _tree_rss_mb(pid: int) -> float:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def _run_and_sample(cluster, env: dict, conf: dict) -> tuple[dict, dict[str, float]]:
    """Trigger the ingest and wait for it (cluster_client runs the query in a child interpreter,
    from a thread here) while sampling each worker's memory."""
    from concurrent.futures import ThreadPoolExecutor

    from training.airflow import cluster_client

    cluster_client.trigger(env, "seqenc_ingest", "bench", LOGICAL, conf)
    peaks = {name: 0.0 for name in cluster.state["workers"]}
    with ThreadPoolExecutor(max_workers=1) as pool:
        waiting = pool.submit(cluster_client.wait_run, env, "seqenc_ingest", "bench", 3600)
        while not waiting.done():
            for name in peaks:
                peaks[name] = max(peaks[name], _tree_rss_mb(cluster.state["pids"][name]))
            time.sleep(0.5)
        return waiting.result(), peaks


def celery_rows(folder: Path, workers: list[int], tmp: Path, serial: dict, n_lines: int, outcome) -> list[dict]:
    """One ``parallel`` row per worker count (module docstring); ``serial`` is the reference's
    ``{"seconds", "templates", "parts"}``, ``outcome(root, source)`` reads a data root back."""
    from training.airflow import cluster_client
    from training.airflow.local_cluster import ClusterError, LocalCluster

    rows = []
    for w in workers:
        work = tmp / f"celery-{w}"
        day = work / "landing" / SOURCE / DAY
        day.mkdir(parents=True)
        for path in sorted(folder.glob("bench-*.log")):
            os.link(path, day / path.name)
        cluster = LocalCluster(tmp / f"cluster-{w}")
        try:
            cluster.up(workers=w, workdir=str(work), no_schedules=True, extra_env={"OMP_NUM_THREADS": "1"})
        except ClusterError as e:  # a user can fix it (install redis-server / postgresql): one line
            raise ValueError(f"the Celery cluster did not start: {str(e).splitlines()[0]}") from e
        try:
            env = cluster.client_env()
            cluster_client.wait_for_dags(env, ["seqenc_ingest"])
            run, peaks = _run_and_sample(cluster, env, {"workdir": str(work), "date": DAY})
        finally:
            cluster.down()
        if run["run_state"] != "success" or not any(t.startswith("ingest_file[") for t in run["tis"]):
            bad = {t: ti["state"] for t, ti in run["tis"].items() if ti["state"] != "success"}
            raise ValueError(f"the seqenc_ingest run on {w} Celery workers failed: {bad}; run the same files with "
                             "docker/celery-cluster to keep the task logs")
        seconds = (datetime.fromisoformat(run["end"]) - datetime.fromisoformat(run["start"])).total_seconds()
        got = outcome(work / "data", SOURCE)
        rows.append({
            "executor": "celery",
            "workers": w,
            "lines_per_s": round(n_lines / seconds, 1),
            "peak_rss_mb": round(max(peaks.values()), 1),
            "peak_rss_mb_per_worker": {k: round(v, 1) for k, v in peaks.items()},
            "same_templates": got["templates"] == serial["templates"],
            "same_grouping": got["parts"] == serial["parts"],
            "speedup": round(serial["seconds"] / seconds, 3),
            "seconds": round(seconds, 2),
            "tasks": len(run["tis"]),
            "hosts": sorted({ti["hostname"] for t, ti in run["tis"].items() if t.startswith(("mine_file[", "ingest_file["))}),
            "read": sum(ti["xcom"]["read"] for t, ti in run["tis"].items()
                        if t.startswith("ingest_file[") and isinstance(ti.get("xcom"), dict) and "read" in ti["xcom"]),
        })
        shutil.rmtree(work, ignore_errors=True)
    return rows
