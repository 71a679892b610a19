"""The ``seqenc_demo`` Airflow DAG: it has the expected graph and runs end to end (that every DAG
file parses cheaply is in test_ops_dags.py).

Airflow reads its configuration (AIRFLOW_HOME, metadata DB, DAGs folder) when it is first imported,
so everything that imports airflow runs in a subprocess with its own temporary AIRFLOW_HOME and
SQLite metadata DB: nothing leaks into other tests or into ~/airflow.
"""

from __future__ import annotations

import pytest
from airflow_run import DAGS, MARK, airflow_env, migrate, run_python

DAG_FILE = DAGS / "seqenc_demo.py"
DAG_ID = "seqenc_demo"

# mapped over the catalogue's sources (ingest) and tasks (sequences, train, score)
EDGES = {
    ("generate", "ingest"),
    ("ingest", "tasks"),
    ("tasks", "sequences"),
    ("sequences", "train"),
    ("train", "score"),
}
TASK_IDS = {t for edge in EDGES for t in edge}
@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory):
    return tmp_path_factory.mktemp("airflow_home")


def test_dagbag_loads_with_expected_graph(airflow_home):
    result = run_python(f"""
        import json
        from airflow.dag_processing.dagbag import DagBag
        bag = DagBag(dag_folder={str(DAGS)!r})
        dag = bag.dags.get({DAG_ID!r})
        info = {{"errors": {{str(k): str(v) for k, v in bag.import_errors.items()}},
                 "dag_ids": sorted(bag.dags)}}
        if dag is not None:
            info.update(
                task_ids=sorted(dag.task_ids),
                edges=sorted([t.task_id, d] for t in dag.tasks for d in t.downstream_task_ids),
                upstream={{t.task_id: sorted(t.upstream_task_ids) for t in dag.tasks}},
                retries=sorted({{t.retries for t in dag.tasks}}),
                schedule=repr(dag.schedule), catchup=dag.catchup,
                params={{k: dag.params[k] for k in dag.params}},
            )
        print({MARK!r} + json.dumps(info))
    """, airflow_env(airflow_home), timeout=120)
    assert result["errors"] == {}
    assert DAG_ID in result["dag_ids"]
    assert set(result["task_ids"]) == TASK_IDS
    assert {tuple(e) for e in result["edges"]} == EDGES
    expected_upstream = {t: sorted(u for u, d in EDGES if d == t) for t in TASK_IDS}
    assert result["upstream"] == expected_upstream
    assert result["retries"] == [1]
    assert result["schedule"] == "None" and result["catchup"] is False
    assert result["params"]["size"] == "demo" and result["params"]["seed"] == 0 and result["params"]["catalog"] == ""
    assert result["params"]["workdir"]


def test_dag_runs_end_to_end(airflow_home, tmp_path):
    env = airflow_env(airflow_home, {"SEQENC_WORK_ROOT": str(tmp_path)})  # params' paths must lie inside it
    migrate(env)

    workdir = tmp_path / "work"
    result = run_python(f"""
        import json
        from datetime import datetime, timezone
        from airflow.dag_processing.dagbag import DagBag
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session

        dag = DagBag(dag_folder={str(DAGS)!r}).dags[{DAG_ID!r}]
        for t in dag.tasks:  # fail fast here instead of waiting out retry_delay
            t.retries = 0
        dr = dag.test(logical_date=datetime(2025, 3, 1, tzinfo=timezone.utc),
                      run_conf={{"workdir": {str(workdir)!r}, "size": "tiny", "seed": 0}})
        with create_session() as session:
            tis = session.query(TaskInstance).filter(TaskInstance.dag_id == dag.dag_id,
                                                     TaskInstance.run_id == dr.run_id).all()
            states = {{f"{{ti.task_id}}[{{ti.map_index}}]": str(ti.state) for ti in tis}}
        print({MARK!r} + json.dumps({{"run_state": str(dr.state), "states": states}}))
    """, env, timeout=240)
    failed = {t: s for t, s in result["states"].items() if s != "success"}
    mapped = {f"{t}[{i}]" for t in ("ingest", "sequences", "train", "score") for i in range(3)}
    assert set(result["states"]) == {"generate[-1]", "tasks[-1]"} | mapped and not failed, (
        f"task states: {result['states']}\n{result['_output'][-8000:]}")
    assert result["run_state"] == "success"

    import mlflow
    import polars as pl

    for task_name in ("anomaly", "milestone", "next_item"):
        pred = pl.read_parquet(workdir / "predictions" / task_name / "test.parquet")
        assert pred.height > 0
        assert {"sequence_id", "score", "prediction", "label"} <= set(pred.columns)
    # ingest_date is the run's logical date, so re-running the same interval overwrites one partition
    assert list((workdir / "data" / "objects").glob("source=*/ingest_date=2025-03-01"))

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    experiments = client.search_experiments()
    runs = client.search_runs([e.experiment_id for e in experiments], "tags.mlflow.parentRunId IS NULL")
    assert len(runs) == 3  # one job run per task (its phases are nested child runs)
    assert {r.data.tags.get("task") for r in runs} == {"anomaly", "milestone", "next_item"}
