"""What the seqenc DAGs read from the running Airflow task: its params, Variables and dates.

Every DAG file (dags/) declares only its graph and params; each of its tasks asks this module
for what the run says -- the work directory, the catalogue, the days of the data interval --
and hands it to one function of the package. One place, so the four DAGs read a param the same
way. Paths a param names must lie inside the work root (training.airflow.workroot).

Airflow imports a DAG file at every parse, and a DAG file imports its module of training.airflow
(and through it this one) at the top: these modules import the package's heavy parts (torch,
polars, the catalogue) inside their functions, so parsing stays cheap (tests/test_ops_dags.py).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import TYPE_CHECKING

from airflow.sdk import Variable, get_current_context

from training.airflow.workroot import confine, confine_uri

if TYPE_CHECKING:
    from training.tasks.catalog import Catalog
    from training.tasks.spec import TaskSpec

CATALOG_VARIABLE = "seqenc_catalog"
CONFIG_VARIABLE = "seqenc_training_config"


def params() -> dict:
    return get_current_context()["params"]


def name_map_index(key: str, value: str) -> None:
    """Show ``value`` as the mapped task's index (the DAG's ``map_index_template`` reads ``key``)."""
    get_current_context()[key] = value


def workdir() -> str:
    """The param ``workdir``, absolute and inside the work root."""
    return confine(params()["workdir"], "workdir")


def data_root() -> str:
    """The param ``data_root``, else ``$SEQENC_DATA_ROOT`` (the operator's), else ``<workdir>/data``.

    A local param is confined to the work root like every path param; an ``s3://`` param must lie
    under the operator's ``$SEQENC_OBJECT_ROOT`` (an ``s3://bucket/prefix``), or it is refused:
    whoever triggers a run must not make it write into any bucket the workers' credentials reach."""
    given = params().get("data_root")
    if given:
        return confine_uri(given, "data_root") if given.startswith("s3://") else confine(given, "data_root")
    return os.environ.get("SEQENC_DATA_ROOT") or os.path.join(workdir(), "data")


def predictions_root() -> str:
    """``<data root>/predictions`` when the data root is an ``s3://`` URI, else ``<workdir>/predictions``."""
    root = data_root()
    return f"{root.rstrip('/')}/predictions" if root.startswith("s3://") else os.path.join(workdir(), "predictions")


def landing() -> str:
    """The param ``landing`` (inside the work root), else ``$SEQENC_LANDING``, else ``<workdir>/landing``."""
    given = params().get("landing")
    if given:
        return confine(given, "landing")
    return os.path.abspath(os.path.expanduser(os.environ.get("SEQENC_LANDING") or os.path.join(workdir(), "landing")))


def catalog(variable: bool = True) -> Catalog:
    """The run's catalogue, loaded: the param ``catalog`` (a file inside the work root), else
    (``variable``) the Airflow Variable ``seqenc_catalog`` (a path or the TOML text), else
    ``$SEQENC_CATALOG``, else the built-in one (training.tasks.catalog.load_catalog)."""
    from training.tasks.catalog import load_catalog

    given = params().get("catalog")
    if given:
        return load_catalog(confine(given, "catalog"))
    return load_catalog(Variable.get(CATALOG_VARIABLE, default=None) if variable else None)


def task(name: str, variable: bool = True) -> TaskSpec:
    """The task ``name`` of the run's catalogue (:func:`catalog`), resolved once for the stages below."""
    from training.tasks.spec import resolve_task

    return resolve_task(catalog(variable), name)


def scheduled_tasks() -> list[str]:
    """The catalogue's task names, narrowed by the param ``tasks`` (the scheduled DAGs' first task)."""
    from training.tasks.listing import scheduled_tasks as narrowed

    return narrowed(catalog(), params().get("tasks"))


def training_config() -> dict:
    """``{"model": {...}, "train": {...}}`` overrides: the param ``config_path`` (a JSON file inside
    the work root), else the Airflow Variable ``seqenc_training_config`` (JSON), else none."""
    path = params().get("config_path")
    if path:
        with open(confine(path, "config_path")) as fh:
            return json.load(fh)
    text = Variable.get(CONFIG_VARIABLE, default=None)
    return json.loads(text) if text else {}


def _run_day():
    """The data interval's start, else the logical date, else when the run was triggered."""
    ctx = get_current_context()
    return ctx.get("data_interval_start") or ctx.get("logical_date") or ctx["dag_run"].run_after


def first_day() -> str:
    """The param ``date``, else the data interval's (first) day, as YYYY-MM-DD."""
    return params().get("date") or _run_day().strftime("%Y-%m-%d")


def logical_day() -> str:
    """The run's logical date (``ds``), else its data interval's first day, as YYYY-MM-DD."""
    return get_current_context().get("ds") or _run_day().strftime("%Y-%m-%d")


def night() -> str:
    """The param ``date``, else the last day of the data interval (a run without an interval:
    its logical date), as YYYY-MM-DD: the night's training window ends that day."""
    ctx = get_current_context()
    if params().get("date"):
        return params()["date"]
    end, start = ctx.get("data_interval_end"), ctx.get("data_interval_start")
    if start is not None and end is not None and end > start:
        return (end - timedelta(days=1)).strftime("%Y-%m-%d")
    return _run_day().strftime("%Y-%m-%d")


def interval_days() -> list[str]:
    """The param ``date``'s day when given, else the days of the data interval."""
    from parsers.landing import interval_days as days_of

    ctx = get_current_context()
    if params().get("date"):
        return days_of(params()["date"])
    start, end = ctx.get("data_interval_start"), ctx.get("data_interval_end")
    if start is None:  # a manual run without a data interval: the day it was triggered for
        start = ctx.get("logical_date") or ctx["dag_run"].run_after
    return days_of(start, end)
