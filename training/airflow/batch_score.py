"""The ``seqenc_batch_score`` DAG's tasks: tasks -> score[task] with the registry's champion.

Each function reads the run's params through training.airflow.context and calls
training.serving.batch_score; the DAG file only wires them. Heavy imports happen inside the
functions: the DAG file imports this module at every parse.
"""

from __future__ import annotations

import os

from training.airflow import context


def tasks() -> list[str]:
    """The catalogue's task names, narrowed by the param ``tasks``."""
    from training.tasks.listing import scheduled_tasks

    return scheduled_tasks(context.catalog(), context.params().get("tasks"))


def score(task_name: str) -> dict:
    """The day's partitions scored by the model the param ``alias`` names; skipped when the task
    has no such model yet."""
    from airflow.sdk.exceptions import AirflowSkipException

    from training.serving.batch_score import score_partitions
    from training.serving.registry import NoChampionError, model_uri, registered_model_name

    context.name_map_index("seqenc_task", task_name)
    workdir = context.workdir()
    uri = model_uri(registered_model_name(task_name), context.params()["alias"])
    try:
        return score_partitions(uri, context.data_root(), os.path.join(workdir, "predictions", task_name),
                                dates=[context.first_day()], tracking_dir=workdir, progress=False)
    except NoChampionError as exc:
        raise AirflowSkipException(str(exc)) from exc
