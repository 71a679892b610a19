"""seqenc_batch_score: each day, score the day's sequences with each task's champion model.

Graph: ``tasks -> score[task]``, one mapped ``score`` per task of the catalogue (training.tasks.catalog;
the param ``catalog``, else the Airflow Variable ``seqenc_catalog``, else ``$SEQENC_CATALOG``,
else the built-in one), so a task added to the catalogue is scored once it has a champion.

It runs at 01:00 UTC, before the night's training (02:00): the champion that scores a day was
trained on a window ending the day before it, so no scheduled score is in-sample (a day re-scored
by hand after that night's training is, and its run says how many of its sequences were).

Each loads ``models:/seqenc-<task>@champion`` from the Model Registry (only the bundle's
safetensors + JSON, training.serving.registry), scores every sequence of the day's ingest partition of
the task's source, and writes ``<workdir>/predictions/<task>/date=<YYYY-MM-DD>/part-0.parquet``
(sequence_id, score, label, prob_<class>..., model_name, model_version), replacing that day's
earlier output; the counts per label and the score distribution (with a histogram) go to the
MLflow experiment ``seqenc-scoring`` (training.serving.batch_score). A task whose model has no champion
yet is skipped with that reason.

Params: ``workdir`` (data root ``<workdir>/data``, predictions, and the MLflow store unless
``$MLFLOW_TRACKING_URI`` is set), ``catalog``, ``tasks`` (default: all), ``alias`` (default ``champion``), ``date`` (a day
to score instead of the data interval's).
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from training.airflow import batch_score
from training.airflow.dag_args import scheduled, workdir_params

# each task is one function of training.airflow.batch_score
tasks = task(batch_score.tasks)
score = task(map_index_template="{{ seqenc_task }}")(batch_score.score)


@dag(
    dag_id="seqenc_batch_score",
    description="score each day's sequences with the registry's champion models",
    # 01:00 UTC: after the day's ingest (00:00) and *before* the night's training (02:00), so the
    # champion that scores the day before was trained on the days before it: out of sample
    **scheduled("0 1 * * *", retries=2, retry_minutes=2),
    params={
        **workdir_params("work directory"),
        "tasks": Param([], type="array", description="tasks to score (default: every catalogue task)"),
        "alias": Param("champion", type="string", description="registry alias of the model to use"),
        "date": Param("", type="string", description="YYYY-MM-DD to score instead of the data interval's day"),
    },
    doc_md=__doc__,
)
def seqenc_batch_score():
    score.expand(task_name=tasks())


seqenc_batch_score()
