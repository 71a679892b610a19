"""Split a lazy objects frame into buckets of whole sequences, in one streaming pass.

Work whose memory would follow a whole partition (a day to score, a week to build value
sequences of) instead follows one bucket: :func:`spill_buckets` writes the rows to Parquet files
in a temporary folder, one folder per bucket, every row of a sequence in the same bucket; the
caller then reads, processes and drops one bucket at a time. The partition is read once however
many buckets there are (filtering it once per bucket would read it once per bucket).

Two ways to choose a sequence's bucket:

* :func:`hash_bucket`: a hash of the id -- balanced buckets, in no particular order (scoring,
  whose output is sorted afterwards);
* :func:`range_bucket`: contiguous ranges of the sorted ids -- bucket after bucket in id order,
  so processing the buckets in turn sees the sequences in the same order as one sorted frame
  (value-sequence building, whose sequence order decides splits and batches).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

BUCKET = "_bucket"


def hash_bucket(n_buckets: int) -> pl.Expr:
    """Bucket of each row: a seeded hash of its ``sequence_id`` modulo ``n_buckets``."""
    return pl.col("sequence_id").hash(seed=0) % n_buckets


def range_bucket(sorted_ids: pl.Series, per_bucket: int) -> pl.Expr:
    """Bucket of each row: the rank of its ``sequence_id`` among ``sorted_ids`` (sorted,
    distinct) divided by ``per_bucket``: bucket 0 holds the first ``per_bucket`` ids, and so on."""
    starts = sorted_ids.gather(list(range(0, sorted_ids.len(), per_bucket)))  # the first id of each bucket
    return pl.lit(starts).search_sorted(pl.col("sequence_id"), side="right").cast(pl.Int64) - 1


def spill_buckets(objects: pl.LazyFrame, bucket: pl.Expr, directory: str | Path) -> list[list[Path]]:
    """Write ``objects`` into ``directory`` partitioned by ``bucket`` (one streaming pass) and
    return each non-empty bucket's files, in bucket order; a sequence's rows keep their order."""
    objects.with_columns(bucket.alias(BUCKET)).sink_parquet(
        pl.PartitionBy(directory, key=BUCKET, include_key=False), mkdir=True)
    folders = sorted(Path(directory).glob(f"{BUCKET}=*"), key=lambda p: int(p.name.split("=", 1)[1]))
    return [sorted(folder.glob("*.parquet")) for folder in folders]


def read_bucket(files: list[Path]) -> pl.DataFrame:
    """One bucket's rows, as :func:`spill_buckets` wrote them."""
    return pl.concat([pl.read_parquet(f) for f in files])
