"""What the four seqenc DAGs declare alike: their schedule arguments and shared params.

Imported by the DAG files at every parse: nothing here imports more than airflow.sdk.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import CronDataIntervalTimetable, Param

DEFAULT_WORKDIR = os.environ.get("SEQENC_WORKDIR", "~/seqenc-work")
DATA_ROOT_HELP = ("data root: a folder inside the work root or s3://bucket/prefix under $SEQENC_OBJECT_ROOT "
                  "(default $SEQENC_DATA_ROOT, else <workdir>/data)")
CATALOG_HELP = "catalogue TOML (default: the Variable seqenc_catalog, else $SEQENC_CATALOG, else the built-in one)"


def scheduled(cron: str | None, retries: int, retry_minutes: int) -> dict:
    """``@dag`` arguments: a daily cron in UTC over data intervals (None: manual runs only), no
    catch-up, one run at a time (runs share a work directory, a Drain3 state, a champion)."""
    return {"schedule": CronDataIntervalTimetable(cron, timezone="UTC") if cron else None,
            "start_date": datetime(2025, 1, 1, tzinfo=UTC), "catchup": False, "max_active_runs": 1,
            "default_args": {"retries": retries, "retry_delay": timedelta(minutes=retry_minutes)},
            "tags": ["seqenc"]}


def workdir_params(workdir_help: str, catalog_help: str = CATALOG_HELP) -> dict:
    """The params every DAG takes: ``workdir`` and ``catalog`` (paths inside the work root,
    training.airflow.workroot), and ``data_root`` (training.airflow.context.data_root)."""
    return {"workdir": Param(DEFAULT_WORKDIR, type="string", description=workdir_help),
            "catalog": Param("", type="string", description=catalog_help),
            "data_root": Param("", type="string", description=DATA_ROOT_HELP)}
