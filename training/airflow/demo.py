"""The ``seqenc_demo`` DAG's tasks: generate -> ingest[source] -> tasks -> sequences[task] ->
train[task] -> score[task], each one stage of training.pipeline.stages.

The demo reads its catalogue from the param ``catalog`` or ``$SEQENC_CATALOG`` / the built-in one
(not the Airflow Variable the scheduled DAGs read). Tasks hand each other only the small dicts
the stages return. Heavy imports happen inside the functions: the DAG file imports this module
at every parse.
"""

from __future__ import annotations

from training.airflow import context


def _size_seed() -> tuple[str, int]:
    params = context.params()
    return params["size"], int(params["seed"])


def generate() -> list[dict]:
    from training.pipeline import stages

    size, seed = _size_seed()
    generated = stages.stage_generate(context.workdir(), size, seed, context.catalog(variable=False))
    return [{"source": name, **files} for name, files in generated.items()]


def ingest(item: dict) -> dict:
    from training.pipeline import stages

    context.name_map_index("seqenc_item", item["source"])
    return stages.stage_ingest(context.workdir(), item["source"], item["path"], item["labels"],
                               ingest_date=context.logical_day(), catalog=context.catalog(variable=False))


def tasks(ingested: list[dict]) -> list[dict]:
    """The catalogue's tasks whose source was generated and ingested, with its ingest date."""
    date_of = {item["source"]: item["ingest_date"] for item in ingested}
    return [{"task_name": name, "ingest_date": date_of[task.source]}
            for name, task in context.catalog(variable=False).tasks.items() if task.source in date_of]


def sequences(item: dict) -> dict:
    from training.pipeline import stages

    context.name_map_index("seqenc_item", item["task_name"])
    size, seed = _size_seed()
    task = context.task(item["task_name"], variable=False)
    return {**stages.stage_sequences(context.workdir(), task, size, seed, ingest_date=item["ingest_date"]), **item}


def train(seqs: dict) -> dict:
    from training.pipeline import stages

    context.name_map_index("seqenc_item", seqs["task_name"])
    size, seed = _size_seed()
    trained = stages.stage_train(context.workdir(), seqs["task_name"], size, seed, progress=False)
    return {**trained, "task_name": seqs["task_name"], "ingest_date": seqs["ingest_date"]}


def score(trained: dict) -> dict:
    from training.pipeline import stages

    context.name_map_index("seqenc_item", trained["task_name"])
    return stages.stage_score(context.workdir(), trained["task_name"], progress=False,
                              ingest_date=trained["ingest_date"])
