"""The ``seqenc_nightly_training`` DAG's tasks: tasks -> train[task] -> promote[task].

Each function reads the run's params through training.airflow.context and calls
training.pipeline.nightly; the DAG file only wires them. Heavy imports happen inside the
functions: the DAG file imports this module at every parse.
"""

from __future__ import annotations

from training.airflow import context


def tasks() -> list[str]:
    return context.scheduled_tasks()


def train(task_name: str) -> dict:
    """Tonight's model of the task; skipped (with the reason) when its source was never ingested."""
    from airflow.sdk.exceptions import AirflowSkipException

    from training.pipeline.nightly import SourceNeverIngested, nightly_train

    context.name_map_index("seqenc_task", task_name)
    params = context.params()
    try:
        return nightly_train(context.workdir(), context.task(task_name), context.night(),
                             window_days=int(params["window_days"]), size=params["size"] or None,
                             seed=int(params["seed"]), mode=params["mode"] or None, config=context.training_config(),
                             data_root=context.data_root())
    except SourceNeverIngested as exc:  # a source this deployment does not feed; a late one still fails
        raise AirflowSkipException(str(exc)) from exc


def promote(trained: dict) -> dict:
    """The new version becomes champion only when it beats the current one (training.pipeline.nightly)."""
    from training.pipeline.nightly import promote_if_better

    context.name_map_index("seqenc_task", trained["task_name"])
    return promote_if_better(context.workdir(), trained, min_delta=float(context.params()["min_delta"]))
