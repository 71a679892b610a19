"""Run Airflow in a subprocess with its own AIRFLOW_HOME and SQLite metadata DB.

Airflow reads its configuration (AIRFLOW_HOME, metadata DB, DAGs folder) when it is first
imported, so everything that imports airflow runs in a fresh interpreter: nothing leaks into
other tests or into ~/airflow. The code run there prints one ``MARK <json>`` line, its result.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from training.airflow import cluster_client

REPO = Path(__file__).resolve().parents[1]
DAGS = REPO / "dags"
MARK = cluster_client.MARK


def airflow_env(home: Path, extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "MLFLOW_"))}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        **(extra or {}),
    })
    return env


def run_python(code: str, env: dict, timeout: float) -> dict:
    """Run ``code`` in a fresh interpreter; returns the JSON it printed after MARK (plus ``_output``)."""
    return cluster_client.run_python(code, env, timeout)


def migrate(env: dict) -> None:
    proc = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def run_dag(dag_id: str, conf: dict, env: dict, logical_date: str = "2025-03-01T00:00:00", timeout: float = 600) -> dict:
    """``dag.test`` once (retries off, so a failure shows at once); returns the run state, each
    task instance's state (mapped ones as ``task[i]``), the data interval and the tasks' return
    values (XCom ``return_value``)."""
    return run_python(f"""
        import json
        from datetime import datetime, timezone
        from airflow.dag_processing.dagbag import DagBag
        from airflow.models.taskinstance import TaskInstance
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session

        dag = DagBag(dag_folder={str(DAGS)!r}).dags[{dag_id!r}]
        for t in dag.tasks:
            t.retries = 0
        when = datetime.fromisoformat({logical_date!r}).replace(tzinfo=timezone.utc)
        dr = dag.test(logical_date=when, run_conf={conf!r})
        with create_session() as session:
            tis = session.query(TaskInstance).filter(TaskInstance.dag_id == dag.dag_id,
                                                     TaskInstance.run_id == dr.run_id).all()
            states = {{ti.task_id + (f"[{{ti.map_index}}]" if ti.map_index >= 0 else ""): str(ti.state)
                       for ti in tis}}
            xcoms = {{}}
            for x in session.query(XComModel).filter(XComModel.dag_id == dag.dag_id, XComModel.run_id == dr.run_id,
                                                     XComModel.key == "return_value"):
                name = x.task_id + (f"[{{x.map_index}}]" if x.map_index >= 0 else "")
                xcoms[name] = x.value if not isinstance(x.value, (bytes, str)) else json.loads(x.value)
        interval = [str(dr.data_interval_start), str(dr.data_interval_end)]
        print({MARK!r} + json.dumps({{"run_state": str(dr.state), "states": states, "xcoms": xcoms,
                                      "interval": interval}}, default=str))
    """, env, timeout=timeout)


def plant_stale_part(root: Path, source: str, day: str, copy_of: str) -> Path:
    """A part of ``day``'s partition that no landing file produces any more (a file removed
    since), listed in the partition's manifest as an earlier landing run would have written it:
    re-running the interval must drop it. Returns its path."""
    import json
    import shutil

    from parsers import storage

    stale = storage.objects_path(root, source, day, "removed-since.log")
    shutil.copy(storage.objects_path(root, source, day, copy_of), stale)
    manifest = stale.parent / "_manifest.json"
    listed = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**listed, "parts": listed["parts"] + [stale.name]}))
    return stale
