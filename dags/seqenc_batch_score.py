"""seqenc_batch_score: each day, score the day's sequences with each task's champion model.

Graph: ``tasks -> score[task]``, one mapped ``score`` per task of the catalogue (seqenc.catalog;
the param ``catalog``, else the Airflow Variable ``seqenc_catalog``, else ``$SEQENC_CATALOG``,
else the built-in one), so a task added to the catalogue is scored once it has a champion.

Each loads ``models:/seqenc-<task>@champion`` from the Model Registry (only the bundle's
safetensors + JSON, training.registry), scores every sequence of the day's ingest partition of
the task's source, and writes ``<workdir>/predictions/<task>/date=<YYYY-MM-DD>/part-0.parquet``
(sequence_id, score, label, prob_<class>..., model_name, model_version), replacing that day's
earlier output; the counts per label and the score distribution (with a histogram) go to the
MLflow experiment ``seqenc-scoring`` (training.batch_score). A task whose model has no champion
yet is skipped with that reason.

Params: ``workdir`` (data root ``<workdir>/data``, predictions, and the MLflow store unless
``$MLFLOW_TRACKING_URI`` is set), ``catalog``, ``tasks`` (default: all), ``alias`` (default ``champion``), ``date`` (a day
to score instead of the data interval's).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import CronDataIntervalTimetable, Param, Variable, dag, get_current_context, task

DEFAULT_WORKDIR = os.environ.get("SEQENC_WORKDIR", "~/seqenc-work")


def _day() -> str:
    """The param ``date``, else the data interval's (first) day, else the logical date."""
    ctx = get_current_context()
    if ctx["params"].get("date"):
        return ctx["params"]["date"]
    when = ctx.get("data_interval_start") or ctx.get("logical_date") or ctx["dag_run"].run_after
    return when.strftime("%Y-%m-%d")


def _catalog() -> str | None:
    from training.workroot import confine

    given = get_current_context()["params"].get("catalog")
    return confine(given, "catalog") if given else Variable.get("seqenc_catalog", default=None)


@task
def tasks() -> list[str]:
    from training.tasks import scheduled_tasks

    return scheduled_tasks(_catalog(), get_current_context()["params"].get("tasks"))


@task(map_index_template="{{ seqenc_task }}")
def score(task_name: str) -> dict:
    from airflow.sdk.exceptions import AirflowSkipException

    from training.batch_score import score_partitions
    from training.pipeline import registered_model_name
    from training.registry import NoChampionError, model_uri

    ctx = get_current_context()
    ctx["seqenc_task"] = task_name
    params = ctx["params"]
    from training.workroot import confine

    workdir = confine(params["workdir"], "workdir")
    uri = model_uri(registered_model_name(task_name), params["alias"])
    try:
        return score_partitions(uri, os.path.join(workdir, "data"), os.path.join(workdir, "predictions", task_name),
                                dates=[_day()], tracking_dir=workdir, progress=False)
    except NoChampionError as exc:
        raise AirflowSkipException(str(exc)) from exc


@dag(
    dag_id="seqenc_batch_score",
    description="score each day's sequences with the registry's champion models",
    # 03:00 UTC, after ingest (00:00) and nightly training (02:00); scores the day before
    schedule=CronDataIntervalTimetable("0 3 * * *", timezone="UTC"),
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=2)},
    params={
        "workdir": Param(DEFAULT_WORKDIR, type="string", description="work directory"),
        "catalog": Param("", type="string", description="catalogue TOML (default: the Variable seqenc_catalog, "
                                                      "else $SEQENC_CATALOG, else the built-in one)"),
        "tasks": Param([], type="array", description="tasks to score (default: every catalogue task)"),
        "alias": Param("champion", type="string", description="registry alias of the model to use"),
        "date": Param("", type="string", description="YYYY-MM-DD to score instead of the data interval's day"),
    },
    tags=["seqenc"],
    doc_md=__doc__,
)
def seqenc_batch_score():
    score.expand(task_name=tasks())


seqenc_batch_score()
