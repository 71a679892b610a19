"""The ``seqenc_ingest`` DAG's tasks: a landing folder's files of the data interval -> Parquet.

Graph (dags/seqenc_ingest.py): find_files -> mine_file[file] -> merge_templates ->
ingest_file[file] -> finalize. Each function reads the run's params through
training.airflow.context and calls parsers.landing; the DAG file only wires them. Heavy imports
happen inside the functions: the DAG file imports this module at every parse.
"""

from __future__ import annotations

from training.airflow import context

REPORTED = ("path", "kind", "part", "rows", "labels", "rejected")


def find_files() -> list[dict]:
    """Every data file of the interval's days in the landing folder; an auto-header source's
    format fixed from its first file (parsers.landing.prepare_formats)."""
    from parsers import landing

    catalog = context.catalog()
    files = landing.find_interval_files(context.landing(), context.interval_days(), catalog)
    landing.prepare_formats(files, context.data_root(), catalog)
    return files


def mine_file(item: dict) -> dict:
    from parsers import landing

    return landing.mine_landing_file(item, context.data_root(), context.catalog())


def merge_templates(items: list[dict]) -> list[dict]:
    from parsers import landing

    return landing.merge_landing(list(items), context.data_root(), context.catalog())


def ingest_file(item: dict) -> dict:
    from parsers import landing

    return landing.ingest_file(item, context.data_root(), context.catalog())


def finalize(files: list[dict], reports) -> dict:
    """Stale parts of the interval's partitions removed, manifests written; what was ingested."""
    from parsers import landing

    result = landing.finalize_interval(context.data_root(), context.interval_days(), files)
    result["ingested"] = [{k: r.get(k) for k in REPORTED} for r in (reports or [])]
    return result
