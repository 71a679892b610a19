"""seqenc_nightly_training: each night, train every catalogue task on the last W days and promote on merit.

Graph: one mapped ``train`` and ``promote`` per task of the catalogue (training.tasks.catalog), so that
adding a task to the catalogue schedules it, with no change here::

    tasks -> train[task] -> promote[task]

* ``tasks``: the catalogue's task names (param ``tasks`` narrows them);
* ``train[task]``: value sequences from the ingest partitions of the ``window_days`` days up to
  the run's date (skipped, with the reason, when the task's source was never ingested; an
  error when it was but the window holds none of it), a split fixed by sequence id, one
  training job (``mode``, interleaved by default; any mode's model is served the same way),
  logged to MLflow and registered as a new version of ``seqenc-<task>``
  (training.pipeline.nightly.nightly_train);
* ``promote_<task>``: the new version and the current ``champion`` (of whatever modes) are
  scored on the same dev sequences; the alias ``champion`` moves only when the new version is
  better by more than ``min_delta``, otherwise the reason is recorded on the version and its run
  (training.pipeline.nightly.promote_if_better).

The catalogue: the param ``catalog`` (a TOML file) when given, else the Airflow Variable
``seqenc_catalog`` (a path or the TOML text), else ``$SEQENC_CATALOG``, else the built-in one.
Training config (``{"model": {...}, "train": {...}}`` overrides on top of each task's): the param
``config_path`` (a JSON file) when given, else the Airflow Variable ``seqenc_training_config``
(JSON), else none.
The MLflow store is ``$MLFLOW_TRACKING_URI``, else ``<workdir>/mlflow.db``.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from training.airflow import nightly
from training.airflow.dag_args import scheduled, workdir_params
from training.engine.modes import SELECTABLE
from training.engine.sizes import SIZES

# each task is one function of training.airflow.nightly
tasks = task(nightly.tasks)
train = task(map_index_template="{{ seqenc_task }}")(nightly.train)
# none_failed: a task skipped tonight (its source never ingested) must not skip the others' promotion
promote = task(map_index_template="{{ seqenc_task }}", trigger_rule="none_failed")(nightly.promote)


@dag(
    dag_id="seqenc_nightly_training",
    description="train each task on the last W days of data; move the champion alias only on improvement",
    # 02:00 UTC, after the day's ingest; the run trains on the window ending with the day before;
    # one night at a time: nights share the registry's champion
    **scheduled("0 2 * * *", retries=1, retry_minutes=5),
    params={
        **workdir_params("work directory (data root <workdir>/data)"),
        "tasks": Param([], type="array", description="tasks to train tonight (default: every catalogue task)"),
        "window_days": Param(7, type="integer", minimum=1, description="days of data to train on"),
        # the registries (training.engine.modes, .sizes) import nothing: cheap at every DAG parse
        "mode": Param("", type="string", enum=["", *SELECTABLE],
                      description="training mode (default: each task's, else interleaved)"),
        "size": Param("", type="string", enum=["", *SIZES],
                      description="built-in model/step sizes (default: each task's, else demo)"),
        "seed": Param(0, type="integer"),
        "config_path": Param("", type="string", description="JSON training overrides (default: the Variable "
                                                            "seqenc_training_config)"),
        "date": Param("", type="string", description="YYYY-MM-DD: train the window ending that day instead"),
        "min_delta": Param(0.0, type="number", description="how much better than the champion a model must be"),
    },
    doc_md=__doc__,
)
def seqenc_nightly_training():
    promote.expand(trained=train.expand(task_name=tasks()))


seqenc_nightly_training()
