"""The ``seqenc_batch_score`` DAG's tasks (dags/seqenc_batch_score.py)::

    tasks -> score[task]

A day's partitions of each task's source are scored by the model under the param ``alias``
(``champion``: what the nightly DAG promoted), through training.serving.batch_score. The DAG
file imports this module at every parse: heavy modules are imported inside the functions.
"""

from __future__ import annotations

from training.airflow import context


def tasks() -> list[str]:
    return context.scheduled_tasks()


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
        return score_partitions(uri, context.data_root(), f"{context.predictions_root()}/{task_name}",
                                dates=[context.first_day()], tracking_dir=workdir, progress=False)
    except NoChampionError as exc:
        raise AirflowSkipException(str(exc)) from exc
