"""seqenc main job as an Airflow 3 DAG: generate -> ingest -> value sequences -> train -> score.

Each task calls one stage function of ``training.pipeline``; tasks hand each other only the small
dicts those stages return (paths, counts, run ids) through XCom, never data. The heavy imports
(torch, polars, mlflow, ...) happen inside the task functions, so parsing this file stays cheap.

Graph (mapped over the catalogue's sources and tasks: the built-in one, or the param
``catalog``, whose sources need a ``demo_generator``)::

    generate -> ingest[source] -> tasks -> sequences[task] -> train[task] -> score[task]
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import Param, dag, get_current_context, task

DEFAULT_WORKDIR = os.environ.get("SEQENC_WORKDIR", "~/seqenc-work")


def _params() -> tuple[str, str, int]:
    """(workdir, size, seed) of the current run, the work directory made absolute."""
    params = get_current_context()["params"]
    from training.workroot import confine

    return confine(params["workdir"], "workdir"), params["size"], int(params["seed"])


def _ingest_date() -> str:
    """The run's logical date (``ds``), else its data interval start / run_after, as YYYY-MM-DD."""
    ctx = get_current_context()
    if ctx.get("ds"):
        return ctx["ds"]
    dag_run = ctx["dag_run"]
    when = ctx.get("data_interval_start") or dag_run.run_after
    return when.strftime("%Y-%m-%d")


def _catalog() -> str | None:
    from training.workroot import confine

    given = get_current_context()["params"].get("catalog")
    return confine(given, "catalog") if given else None


@task
def generate() -> list[dict]:
    from training.pipeline import stage_generate

    workdir, size, seed = _params()
    return [{"source": name, **files} for name, files in stage_generate(workdir, size, seed, _catalog()).items()]


@task(map_index_template="{{ seqenc_item }}")
def ingest(item: dict) -> dict:
    from training.pipeline import stage_ingest

    get_current_context()["seqenc_item"] = item["source"]
    workdir, _, _ = _params()
    return stage_ingest(workdir, item["source"], item["path"], item["labels"], ingest_date=_ingest_date(),
                        catalog=_catalog())


@task
def tasks(ingested: list[dict]) -> list[dict]:
    """The catalogue's tasks whose source was generated and ingested, with its ingest date."""
    from seqenc.catalog import load_catalog

    date_of = {item["source"]: item["ingest_date"] for item in ingested}
    return [{"task_name": name, "ingest_date": date_of[task.source]}
            for name, task in load_catalog(_catalog()).tasks.items() if task.source in date_of]


@task(map_index_template="{{ seqenc_item }}")
def sequences(item: dict) -> dict:
    from training.pipeline import stage_sequences

    get_current_context()["seqenc_item"] = item["task_name"]
    workdir, size, seed = _params()
    return {**stage_sequences(workdir, item["task_name"], size, seed, ingest_date=item["ingest_date"],
                              catalog=_catalog()), **item}


@task(map_index_template="{{ seqenc_item }}")
def train(seqs: dict) -> dict:
    from training.pipeline import stage_train

    get_current_context()["seqenc_item"] = seqs["task_name"]
    workdir, size, seed = _params()
    return {**stage_train(workdir, seqs["task_name"], size, seed, progress=False), "task_name": seqs["task_name"],
            "ingest_date": seqs["ingest_date"]}


@task(map_index_template="{{ seqenc_item }}")
def score(trained: dict) -> dict:
    from training.pipeline import stage_score

    get_current_context()["seqenc_item"] = trained["task_name"]
    workdir, _, _ = _params()
    return stage_score(workdir, trained["task_name"], progress=False, ingest_date=trained["ingest_date"])


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
        "catalog": Param("", type="string", description="catalogue TOML (default: the built-in one)"),
    },
    tags=["seqenc"],
    doc_md=__doc__,
)
def seqenc_demo():
    ingested = ingest.expand(item=generate())
    score.expand(trained=train.expand(seqs=sequences.expand(item=tasks(ingested))))


seqenc_demo()
