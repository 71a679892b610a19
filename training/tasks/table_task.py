"""Table tasks: each example is a text (a statement, a question) joined to the table it names.

A task with ``table_source`` (training.tasks.catalog.Task) reads its source's texts (parsers.tables:
``ingest text``) and, for each, the table of ``table_source`` whose id the text's ``table_key``
holds (``ingest table``: a table's id is its file name). :func:`join_tables` gives one example's
objects as long-form rows of the text's sequence id:

* the text's objects at negative steps (``TEXT_STEP`` + their step), so they come before the
  table and seqenc.table_inputs can tell them apart; the ``table_key`` row itself is left out
  (an id, not content);
* the table's rows at their own steps (row index), keys = columns. A column named like one of
  the text's keys (or ``ROW_MATCH_KEY``) is renamed ``<name> (column)``, so S(k) never mixes text
  and cells, or cells and the derived rows.

* one derived object per table row, key ``ROW_MATCH_KEY``: how many things of the text the row
  names, and whether one of them sits under a header the text names (:func:`row_match_rows`).

So the TVM-KA reads a table as the paper's column-evolution view -- one S(k) per column and one
for the text, the KA over all of them -- and the table encoders (seqenc.table_model) rebuild the
flattened table from the same rows. A table ingested on several dates counts once, its newest
copy. A text whose table is missing keeps only its text; the count is logged.
"""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from parsers import storage
from seqenc.table_inputs import ROW_MATCH_KEY, TEXT_STEP, header_hit, row_named, text_index

log = logging.getLogger(__name__)

COLUMN_SUFFIX = " (column)"


def latest_tables(root: str | Path, table_source: str) -> pl.LazyFrame:
    """The objects of every table of ``table_source``, each from its newest ingest date."""
    dates = sorted(storage.ingest_dates(root, table_source), reverse=True)
    if not dates:
        raise FileNotFoundError(f"no tables of source {table_source!r} under {root}; ingest them first "
                                f"(seqenc ingest table ... --source {table_source})")
    frames, seen = [], pl.Series("sequence_id", [], dtype=pl.String)
    for day in dates:
        scan = storage.scan_objects(root, table_source, day)
        ids = scan.select("sequence_id").unique().collect()["sequence_id"]
        new = ids.filter(~ids.is_in(seen.implode()))
        if new.len():
            frames.append(scan.filter(pl.col("sequence_id").is_in(new.implode())))
            seen = pl.concat([seen, new])
    return pl.concat(frames)


def join_tables(texts: pl.LazyFrame, root: str | Path, table_source: str, table_key: str) -> pl.LazyFrame:
    """The examples' objects (module docstring) from the texts' objects ``texts``."""
    links = (texts.filter(pl.col("key") == table_key).group_by("sequence_id")
             .agg(pl.col("value").first().alias("_table")))
    text_rows = texts.filter(pl.col("key") != table_key).with_columns(pl.col("step") + TEXT_STEP)
    text_keys = text_rows.select("key").unique().collect()["key"].implode()
    _check_links(texts, links, table_key)
    tables = latest_tables(root, table_source)
    _report_missing(links, tables, table_source)
    table_rows = (links.join(tables.rename({"sequence_id": "_table"}), on="_table", how="inner")
                  .with_columns(pl.when(pl.col("key").is_in(text_keys) | (pl.col("key") == ROW_MATCH_KEY))
                                .then(pl.col("key") + COLUMN_SUFFIX)
                                .otherwise(pl.col("key")).alias("key"))
                  .select(texts.collect_schema().names()))
    return pl.concat([text_rows, table_rows, row_match_rows(text_rows, table_rows)])


def row_match_rows(text_rows: pl.LazyFrame, table_rows: pl.LazyFrame) -> pl.LazyFrame:
    """One more object per table row: key ``ROW_MATCH_KEY``, value how many things of its text the
    row names (seqenc.table_inputs.row_named, "spans"; "3" for 3 and more), followed by "h" when
    the text also names the header of one of the named cells (table_inputs.header_hit): "0", "1",
    "1h", "2", "2h", ... TVM-KA reads a table by columns -- one S(k) per column, the KA over their
    KRs -- so which row a value sits in is lost between keys; this column keeps the row relation a
    lookup is about as a key's values over the rows, as the table encoders' row-match and
    header-match ids keep it per cell (they drop the column)."""
    texts = (text_rows.sort("step", maintain_order=True).group_by("sequence_id")
             .agg(pl.col("value").str.join(" ").alias("_text")).collect())
    index = {sid: text_index(text) for sid, text in texts.iter_rows()}
    rows = (table_rows.group_by("sequence_id", "step", maintain_order=True)
            .agg(pl.col("key").alias("_keys"), pl.col("value").alias("_cells"), pl.col("ts").first(),
                 pl.col("template_id").first()).collect())
    named = []
    for sid, keys, cells in rows.select("sequence_id", "_keys", "_cells").iter_rows():
        words = index.get(sid, {})
        header = [k.removesuffix(COLUMN_SUFFIX) for k in keys]
        named.append(f"{min(row_named(words, cells), 3)}{'h' if header_hit(words, header, cells) else ''}")
    return (rows.drop("_keys", "_cells")
            .with_columns(pl.lit(ROW_MATCH_KEY).alias("key"), pl.Series("value", named, pl.String))
            .select(table_rows.collect_schema().names()).lazy())


def _check_links(texts: pl.LazyFrame, links: pl.LazyFrame, table_key: str) -> None:
    """Texts that name no table: an error when none does (``table_key`` is not the field that
    names the tables), else a warning with their count -- never a silent text-only example."""
    n_texts = texts.select(pl.col("sequence_id").n_unique()).collect().item()
    n_linked = links.select(pl.len()).collect().item()
    if n_texts and not n_linked:
        fields = sorted(texts.select("key").unique().collect()["key"].to_list())
        raise ValueError(f"no text has the field {table_key!r} naming its table (fields: {', '.join(fields[:10])}): "
                         f"set the task's table_key to the field that holds the table's file name")
    if n_linked < n_texts:
        log.warning("%d of %d texts have no %r field: those texts have no table", n_texts - n_linked, n_texts, table_key)


def _report_missing(links: pl.LazyFrame, tables: pl.LazyFrame, table_source: str) -> None:
    named = links.select("_table").unique().collect()["_table"]
    have = tables.select("sequence_id").unique().collect()["sequence_id"]
    missing = named.filter(~named.is_in(have.implode()))
    if missing.len():
        log.warning("%d tables named by the texts are not in source %r (e.g. %s): those texts have no table",
                    missing.len(), table_source, missing.head(3).to_list())


def example_objects(root: str | Path, source: str, ingest_date=None, table_source: str | None = None,
                    table_key: str = "table") -> pl.LazyFrame:
    """The objects a task (or a model's metadata) reads: the source's (the ingest dates given,
    or all), joined to their tables when ``table_source`` is given."""
    scan = storage.scan_objects(root, source, ingest_date)
    return join_tables(scan, root, table_source, table_key) if table_source else scan


def groups_of(texts: pl.LazyFrame, key: str) -> pl.DataFrame:
    """``sequence_id, group``: each sequence's first value of ``key`` (the ``grouped`` split
    keeps a group in one split; a table task's groups are its tables), read from the source's
    own objects (``texts``, before :func:`join_tables` drops the table key)."""
    return (texts.filter(pl.col("key") == key).sort("step", maintain_order=True)
            .group_by("sequence_id", maintain_order=True).agg(pl.col("value").first().alias("group")).collect())
