"""seqenc_nightly_training: each night, train every catalogue task on the last W days and promote on merit.

Graph: one mapped ``train`` and ``promote`` per task of the catalogue (seqenc.catalog), so that
adding a task to the catalogue schedules it, with no change here::

    tasks -> train[task] -> promote[task]

* ``tasks``: the catalogue's task names (param ``tasks`` narrows them);
* ``train[task]``: value sequences from the ingest partitions of the ``window_days`` days up to
  the run's date (skipped, with the reason, when the task's source was never ingested; an
  error when it was but the window holds none of it), a split fixed by sequence id, one
  training job (``mode``, interleaved by default; any mode's model is served the same way),
  logged to MLflow and registered as a new version of ``seqenc-<task>``
  (training.nightly.nightly_train);
* ``promote_<task>``: the new version and the current ``champion`` (of whatever modes) are
  scored on the same dev sequences; the alias ``champion`` moves only when the new version is
  better by more than ``min_delta``, otherwise the reason is recorded on the version and its run
  (training.nightly.promote_if_better).

The catalogue: the param ``catalog`` (a TOML file) when given, else the Airflow Variable
``seqenc_catalog`` (a path or the TOML text), else ``$SEQENC_CATALOG``, else the built-in one.
Training config (``{"model": {...}, "train": {...}}`` overrides on top of each task's): the param
``config_path`` (a JSON file) when given, else the Airflow Variable ``seqenc_training_config``
(JSON), else none.
The MLflow store is ``$MLFLOW_TRACKING_URI``, else ``<workdir>/mlflow.db``.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import CronDataIntervalTimetable, Param, Variable, dag, get_current_context, task

DEFAULT_WORKDIR = os.environ.get("SEQENC_WORKDIR", "~/seqenc-work")


def _workdir() -> str:
    from training.workroot import confine

    return confine(get_current_context()["params"]["workdir"], "workdir")


def _night() -> str:
    """The night's date: the param ``date``, else the last day of the data interval (a run
    without an interval: its logical date)."""
    ctx = get_current_context()
    if ctx["params"].get("date"):
        return ctx["params"]["date"]
    end, start = ctx.get("data_interval_end"), ctx.get("data_interval_start")
    if start is not None and end is not None and end > start:
        return (end - timedelta(days=1)).strftime("%Y-%m-%d")
    when = start or ctx.get("logical_date") or ctx["dag_run"].run_after
    return when.strftime("%Y-%m-%d")


def _config() -> dict:
    from training.workroot import confine

    path = get_current_context()["params"].get("config_path")
    if path:
        with open(confine(path, "config_path")) as fh:
            return json.load(fh)
    text = Variable.get("seqenc_training_config", default=None)
    return json.loads(text) if text else {}


def _catalog() -> str | None:
    """The catalogue's path or text: param (inside the work root), Variable, else None
    ($SEQENC_CATALOG / the built-in one)."""
    from training.workroot import confine

    given = get_current_context()["params"].get("catalog")
    return confine(given, "catalog") if given else Variable.get("seqenc_catalog", default=None)


@task
def tasks() -> list[str]:
    from training.tasks import scheduled_tasks

    return scheduled_tasks(_catalog(), get_current_context()["params"].get("tasks"))


@task(map_index_template="{{ seqenc_task }}")
def train(task_name: str) -> dict | None:
    from airflow.sdk.exceptions import AirflowSkipException

    from training.nightly import SourceNeverIngested, nightly_train

    ctx = get_current_context()
    ctx["seqenc_task"] = task_name
    params = ctx["params"]
    try:
        return nightly_train(_workdir(), task_name, _night(), window_days=int(params["window_days"]),
                             size=params["size"] or None, seed=int(params["seed"]), mode=params["mode"] or None,
                             config=_config(), catalog=_catalog())
    except SourceNeverIngested as exc:  # a source this deployment does not feed; a late one still fails
        raise AirflowSkipException(str(exc)) from exc


# none_failed: a task skipped tonight (its source never ingested) must not skip the others' promotion
@task(map_index_template="{{ seqenc_task }}", trigger_rule="none_failed")
def promote(trained: dict) -> dict:
    from training.nightly import promote_if_better

    ctx = get_current_context()
    ctx["seqenc_task"] = trained["task_name"]
    return promote_if_better(_workdir(), trained, min_delta=float(ctx["params"]["min_delta"]))


@dag(
    dag_id="seqenc_nightly_training",
    description="train each task on the last W days of data; move the champion alias only on improvement",
    # 02:00 UTC, after the day's ingest; the run trains on the window ending with the day before
    schedule=CronDataIntervalTimetable("0 2 * * *", timezone="UTC"),
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,  # nights share the registry's champion
    default_args={"retries": 1, "retry_delay": timedelta(minutes=5)},
    params={
        "workdir": Param(DEFAULT_WORKDIR, type="string", description="work directory (data root <workdir>/data)"),
        "catalog": Param("", type="string", description="catalogue TOML (default: the Variable seqenc_catalog, "
                                                      "else $SEQENC_CATALOG, else the built-in one)"),
        "tasks": Param([], type="array", description="tasks to train tonight (default: every catalogue task)"),
        "window_days": Param(7, type="integer", minimum=1, description="days of data to train on"),
        # checked when a task trains (seqenc.config.TRAINING_MODES: the one list; importing it here
        # would load the package at every DAG parse)
        "mode": Param("", type="string", description="training mode (default: each task's, else interleaved)"),
        "size": Param("", type="string", enum=["", "demo", "tiny"],
                      description="built-in model/step sizes (default: each task's, else demo)"),
        "seed": Param(0, type="integer"),
        "config_path": Param("", type="string", description="JSON training overrides (default: the Variable "
                                                            "seqenc_training_config)"),
        "date": Param("", type="string", description="YYYY-MM-DD: train the window ending that day instead"),
        "min_delta": Param(0.0, type="number", description="how much better than the champion a model must be"),
    },
    tags=["seqenc"],
    doc_md=__doc__,
)
def seqenc_nightly_training():
    promote.expand(trained=train.expand(task_name=tasks()))


seqenc_nightly_training()
