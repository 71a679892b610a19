"""Drive DAG runs on a running Airflow cluster the way an operator does, from outside it.

``airflow dags unpause / trigger`` and ``airflow tasks clear`` on the command line; waiting for a
run and reading back its task instances (state, hostname -- the worker's name on a
training.airflow.local_cluster -- pid, try number, return value) from the metadata database.

Airflow reads its configuration (metadata database, secrets) when it is first imported, so every
call runs in a fresh interpreter with the cluster's environment (``LocalCluster.client_env()``):
the caller's own process never imports airflow. Used by ``seqenc bench ingest --executor celery``
and by tests/test_celery_cluster.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARK = "RESULT-JSON:"


def airflow(env: dict, *args: str, timeout: float = 180) -> str:
    """``airflow ARGS`` against the cluster; its stdout, or a RuntimeError with its output."""
    proc = subprocess.run([sys.executable, "-m", "airflow", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"airflow {' '.join(args)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout


def run_python(code: str, env: dict, timeout: float) -> dict:
    """Run ``code`` in a fresh interpreter with ``env``; returns the JSON it printed after
    ``MARK`` (its last such line), with the whole output under ``_output``; a RuntimeError with
    the output's tail when it failed or printed none."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode or not lines:
        raise RuntimeError(f"the Airflow client code failed (rc={proc.returncode}):\n{out[-6000:]}")
    return {**json.loads(lines[-1][len(MARK):]), "_output": out}


def wait_for_dags(env: dict, dag_ids: list[str], timeout: float = 300) -> list[str]:
    """Until the DAG processor has stored ``dag_ids`` in the metadata database; a RuntimeError on
    an import error or at ``timeout``. Returns every DAG id found."""
    return run_python(f"""
        import json, time
        from airflow.models.dag import DagModel
        from airflow.models.errors import ParseImportError
        from airflow.utils.session import create_session
        deadline = time.monotonic() + {timeout}
        while True:
            with create_session() as s:
                errors = [e.stacktrace for e in s.query(ParseImportError).all()]
                found = {{d.dag_id for d in s.query(DagModel).all()}}
            if errors:
                raise SystemExit("DAG import errors: " + "\\n".join(errors))
            if set({dag_ids!r}) <= found:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"DAGs not parsed within {timeout} s: found {{sorted(found)}}")
            time.sleep(2)
        print({MARK!r} + json.dumps({{"dags": sorted(found)}}))
    """, env, timeout + 60)["dags"]


def trigger(env: dict, dag_id: str, run_id: str, logical_date: str, conf: dict) -> None:
    """Unpause ``dag_id`` and trigger run ``run_id`` with ``conf``."""
    airflow(env, "dags", "unpause", dag_id)
    airflow(env, "dags", "trigger", dag_id, "--run-id", run_id, "--logical-date", logical_date,
            "--conf", json.dumps(conf))


def wait_run(env: dict, dag_id: str, run_id: str, timeout: float = 900) -> dict:
    """Wait until the run ends (or ``timeout``); returns ``run_state``, the run's ``start`` and
    ``end`` (ISO) and ``tis``: per task instance (mapped ones as ``task[i]``) ``state``,
    ``hostname``, ``pid``, ``try_number``, ``start``, ``end`` and its return value ``xcom``."""
    return run_python(f"""
        import json, time
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session
        deadline = time.monotonic() + {timeout}
        while True:
            with create_session() as s:
                run = s.query(DagRun).filter(DagRun.dag_id == {dag_id!r}, DagRun.run_id == {run_id!r}).one()
                state, start, end = str(run.state), run.start_date, run.end_date
            if state in ("success", "failed") or time.monotonic() > deadline:
                break
            time.sleep(1)
        with create_session() as s:
            tis = {{}}
            for ti in s.query(TaskInstance).filter(TaskInstance.dag_id == {dag_id!r}, TaskInstance.run_id == {run_id!r}):
                name = ti.task_id + (f"[{{ti.map_index}}]" if ti.map_index >= 0 else "")
                tis[name] = {{"state": str(ti.state), "hostname": ti.hostname, "pid": ti.pid,
                              "try_number": ti.try_number, "start": ti.start_date, "end": ti.end_date}}
            for x in s.query(XComModel).filter(XComModel.dag_id == {dag_id!r}, XComModel.run_id == {run_id!r},
                                               XComModel.key == "return_value"):
                name = x.task_id + (f"[{{x.map_index}}]" if x.map_index >= 0 else "")
                tis[name]["xcom"] = x.value if not isinstance(x.value, (bytes, str)) else json.loads(x.value)
        print({MARK!r} + json.dumps({{"run_state": state, "start": start, "end": end, "tis": tis}}, default=str))
    """, env, timeout + 120)
