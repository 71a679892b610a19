"""seqenc main job as an Airflow 3 DAG: generate -> ingest -> value sequences -> train -> score.

Each task calls one stage function of ``training.pipeline``; tasks hand each other only the small
dicts those stages return (paths, counts, run ids) through XCom, never data. The heavy imports
(torch, polars, mlflow, ...) happen inside the task functions, so parsing this file stays cheap.

Graph::

    generate -> ingest_logs      -> sequences_anomaly   -> train_anomaly   -> score_anomaly
             -> ingest_events    -> sequences_milestone -> train_milestone -> score_milestone
             -> ingest_purchases -> sequences_next_item -> train_next_item -> score_next_item
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import Param, dag, get_current_context, task

TASK_NAMES = ("anomaly", "milestone", "next_item")
DEFAULT_WORKDIR = os.environ.get("SEQENC_WORKDIR", "~/seqenc-work")


def _params() -> tuple[str, str, int]:
    """(workdir, size, seed) of the current run, the work directory made absolute."""
    params = get_current_context()["params"]
    workdir = os.path.abspath(os.path.expanduser(params["workdir"]))
    return workdir, params["size"], int(params["seed"])


def _ingest_date() -> str:
    """The run's logical date (``ds``), else its data interval start / run_after, as YYYY-MM-DD."""
    ctx = get_current_context()
    if ctx.get("ds"):
        return ctx["ds"]
    dag_run = ctx["dag_run"]
    when = ctx.get("data_interval_start") or dag_run.run_after
    return when.strftime("%Y-%m-%d")


@task
def generate() -> dict:
    from training.pipeline import stage_generate

    workdir, size, seed = _params()
    return stage_generate(workdir, size, seed)


@task
def ingest_logs(raw: dict) -> dict:
    from training.pipeline import stage_ingest_logs

    workdir, _, _ = _params()
    return stage_ingest_logs(workdir, raw["hdfs_log"], raw["hdfs_labels"], ingest_date=_ingest_date())


@task
def ingest_events(raw: dict) -> dict:
    from training.pipeline import stage_ingest_events

    workdir, _, _ = _params()
    return stage_ingest_events(workdir, raw["events"], raw["events_labels"], ingest_date=_ingest_date())


@task
def ingest_purchases(raw: dict) -> dict:
    from training.pipeline import stage_ingest_events

    workdir, _, _ = _params()
    return stage_ingest_events(workdir, raw["purchases"], raw["purchases_labels"], ingest_date=_ingest_date(),
                               source="purchases")


@task
def sequences(ingested: dict, task_name: str) -> dict:
    from training.pipeline import stage_sequences

    workdir, size, seed = _params()
    return {**stage_sequences(workdir, task_name, size, seed, ingest_date=ingested["ingest_date"]),
            "ingest_date": ingested["ingest_date"]}


@task
def train(seqs: dict, task_name: str) -> dict:
    from training.pipeline import stage_train

    workdir, size, seed = _params()
    return {**stage_train(workdir, task_name, size, seed, progress=False), "ingest_date": seqs["ingest_date"]}


@task
def score(trained: dict, task_name: str) -> dict:
    from training.pipeline import stage_score

    workdir, _, _ = _params()
    return stage_score(workdir, task_name, progress=False, ingest_date=trained["ingest_date"])


@dag(
    dag_id="seqenc_demo",
    description="seqenc main job: synthetic logs/events -> ingest -> TVM-KA train -> score",
    schedule=None,  # manual trigger for now; nightly scheduling comes later
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,  # runs share one work directory
    default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
    params={
        "workdir": Param(DEFAULT_WORKDIR, type="string", description="work directory of the job"),
        "size": Param("demo", type="string", enum=["demo", "tiny"], description="built-in data/model size"),
        "seed": Param(0, type="integer", description="random seed"),
    },
    tags=["seqenc"],
    doc_md=__doc__,
)
def seqenc_demo():
    raw = generate()
    ingested = {"anomaly": ingest_logs(raw), "milestone": ingest_events(raw), "next_item": ingest_purchases(raw)}
    for name in TASK_NAMES:
        seqs = sequences.override(task_id=f"sequences_{name}")(ingested[name], name)
        trained = train.override(task_id=f"train_{name}")(seqs, name)
        score.override(task_id=f"score_{name}")(trained, name)


seqenc_demo()
