"""seqenc_ingest: each day, ingest the landing directory's new raw logs and JSON events.

Graph (``mine_file`` and ``ingest_file`` are mapped: one task per file of the data interval,
run in parallel across the executor's workers)::

    find_files -> mine_file[0..n] -> merge_templates -> ingest_file[0..n] -> finalize

* ``find_files`` lists ``<landing>/<source>/<YYYY-MM-DD>/`` for the days of the data interval
  and fixes the detected header of ``auto_header`` log sources (parsers.landing);
* ``mine_file`` reads and masks one raw log file and keeps its distinct masked contents (other
  files pass through); ``merge_templates`` sends them, per source and in file order, to the
  source's Drain3 state -- the one serial step, and a small one -- so the templates and every
  line's template are those of a serial ingest (parsers.parallel_ingest);
* ``ingest_file`` turns one file into Parquet objects (with the merged templates for raw logs)
  or labels in the interval's ``ingest_date=`` partition;
* ``finalize`` removes parts that no file of the interval produced any more, writes each
  partition's manifest and clears the mined contents, so re-running an interval replaces its
  partitions exactly.

Configuration: params ``date`` (a day to (re-)ingest instead of the interval's), ``workdir`` (the data root is ``<workdir>/data``; default
``$SEQENC_WORKDIR``, else ``~/seqenc-work``) and ``landing`` (default ``$SEQENC_LANDING``, else
``<workdir>/landing``) and ``catalog``; per-source options from the catalogue's ``[sources.<name>]``
(training.tasks.catalog): the param ``catalog``, else the Airflow Variable ``seqenc_catalog`` (a path or
the TOML text), else ``$SEQENC_CATALOG``, else the built-in one. The mapped tasks need a shared
work directory when they run on several machines (Celery or Kubernetes executor).
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from training.airflow import ingest
from training.airflow.dag_args import scheduled, workdir_params

# each task is one function of training.airflow.ingest (mapped ones: one per file)
find_files = task(ingest.find_files)
mine_file = task(ingest.mine_file)
merge_templates = task(ingest.merge_templates)
ingest_file = task(ingest.ingest_file)
finalize = task(trigger_rule="none_failed")(ingest.finalize)  # also when the interval has no files


@dag(
    dag_id="seqenc_ingest",
    description="landing directory -> Drain3 / JSON flattening -> the interval's Parquet partitions",
    # a run at midnight ingests the day that just ended: [day 00:00, next day 00:00); one run at a
    # time: runs share the Drain3 state of each source (the merge also takes its lock)
    **scheduled("@daily", retries=2, retry_minutes=2),
    params={
        **workdir_params("work directory (data root: <workdir>/data)"),
        "landing": Param("", type="string", description="landing directory (default $SEQENC_LANDING, "
                                                        "else <workdir>/landing)"),
        "date": Param("", type="string", description="YYYY-MM-DD to ingest instead of the data interval's days"),
    },
    doc_md=__doc__,
)
def seqenc_ingest():
    files = find_files()
    mined = mine_file.expand(item=files)
    reports = ingest_file.expand(item=merge_templates(mined))
    finalize(files, reports)


seqenc_ingest()
