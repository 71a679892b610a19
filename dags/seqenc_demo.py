"""seqenc main job as an Airflow 3 DAG: generate -> ingest -> value sequences -> train -> score.

Each task calls one stage function of ``training.pipeline.stages``; tasks hand each other only the small
dicts those stages return (paths, counts, run ids) through XCom, never data. The heavy imports
(torch, polars, mlflow, ...) happen inside the task functions, so parsing this file stays cheap.

Graph (mapped over the catalogue's sources and tasks: the built-in one, or the param
``catalog``, whose sources need a ``demo_generator``)::

    generate -> ingest[source] -> tasks -> sequences[task] -> train[task] -> score[task]
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from training.airflow import demo
from training.airflow.dag_args import scheduled, workdir_params
from training.engine.sizes import SIZES

# each task is one stage of the main job (training.airflow.demo; mapped over sources and tasks)
generate = task(demo.generate)
ingest = task(map_index_template="{{ seqenc_item }}")(demo.ingest)
tasks = task(demo.tasks)
sequences = task(map_index_template="{{ seqenc_item }}")(demo.sequences)
train = task(map_index_template="{{ seqenc_item }}")(demo.train)
score = task(map_index_template="{{ seqenc_item }}")(demo.score)


@dag(
    dag_id="seqenc_demo",
    description="seqenc main job: synthetic logs/events -> ingest -> TVM-KA train -> score",
    **scheduled(None, retries=1, retry_minutes=1),  # manual runs; one at a time (they share a work directory)
    params={
        **workdir_params("work directory of the job", "catalogue TOML (default: the built-in one)"),
        "size": Param("demo", type="string", enum=list(SIZES), description="built-in data/model size"),
        "seed": Param(0, type="integer", description="random seed"),
    },
    doc_md=__doc__,
)
def seqenc_demo():
    ingested = ingest.expand(item=generate())
    score.expand(trained=train.expand(seqs=sequences.expand(item=tasks(ingested))))


seqenc_demo()
