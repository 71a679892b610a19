"""seqenc main job as an Airflow 3 DAG: generate -> ingest -> value sequences -> train -> score.

Each task calls one stage function of ``training.pipeline.stages``; tasks hand each other only the small
dicts those stages return (paths, counts, run ids) through XCom, never data. The heavy imports
(torch, polars, mlflow, ...) happen inside the task functions, so parsing this file stays cheap.

Graph (mapped over the catalogue's sources and tasks: the built-in one, or the param
``catalog``, whose sources need a ``demo_generator``)::

    generate -> ingest[source] -> tasks -> sequences[task] -> train[task] -> score[task]
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import Param, dag, task

from training.engine.sizes import SIZES

DEFAULT_WORKDIR = os.environ.get("SEQENC_WORKDIR", "~/seqenc-work")


@task
def generate() -> list[dict]:
    from training.airflow import demo

    return demo.generate()


@task(map_index_template="{{ seqenc_item }}")
def ingest(item: dict) -> dict:
    from training.airflow import demo

    return demo.ingest(item)


@task
def tasks(ingested: list[dict]) -> list[dict]:
    from training.airflow import demo

    return demo.tasks(ingested)


@task(map_index_template="{{ seqenc_item }}")
def sequences(item: dict) -> dict:
    from training.airflow import demo

    return demo.sequences(item)


@task(map_index_template="{{ seqenc_item }}")
def train(seqs: dict) -> dict:
    from training.airflow import demo

    return demo.train(seqs)


@task(map_index_template="{{ seqenc_item }}")
def score(trained: dict) -> dict:
    from training.airflow import demo

    return demo.score(trained)


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
        "size": Param("demo", type="string", enum=list(SIZES), description="built-in data/model size"),
        "seed": Param(0, type="integer", description="random seed"),
        "catalog": Param("", type="string", description="catalogue TOML (default: the built-in one)"),
    },
    tags=["seqenc"],
    doc_md=__doc__,
)
def seqenc_demo():
    ingested = ingest.expand(item=generate())
    score.expand(trained=train.expand(seqs=sequences.expand(item=tasks(ingested))))


seqenc_demo()
