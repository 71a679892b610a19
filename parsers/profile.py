"""``seqenc profile``: what the keys of an ingested source look like, and a starter task for it.

A user should not have to know which header fields flood the vocabulary. Per key of a source's
objects (:func:`profile_source`):

* ``distinct``: how many different values it takes; ``share``: the share of objects (a log line,
  an event) that carry it; ``per_sequence``: its mean number of values in a sequence;
* ``unique_per_object``: whether its values are (nearly) all different from object to object --
  clock times, request ids, pids. Such a key says nothing a model can learn and makes every
  value a new vocabulary entry. Choice: at least half as many distinct values as occurrences,
  and more than ``MIN_DISTINCT`` of them (a key seen five times with five values is not yet
  evidence);
* ``measurement``: unique per object, but a number that measures something -- an amount, a
  latency, a size: at least 95 % of its values a number, or a number and a unit (``MEASURE``:
  ``5.8 KB``, ``250ms``, ``12 %``), not a clock, and not named as an identifier (``ID_NAME``: ``id``,
  ``pid``, ``tid``, ``uuid``, ``port``, ``*_id``, ``orderId``, ``id_2``, ...). Its values differ
  from object to object because they are measured finely, not because they name something, and a
  value-only anomaly (a fraudulent amount, a stuck job's duration) lives in exactly such a key,
  so the starter task keeps it (training.tasks.starter). Why: a checkout stream whose fraud
  shows only in amounts (two decimals, nearly all distinct) had its ``amount`` left out of the
  starter task, and the model could not see the fraud (docs/training.md, "Measurements are not
  ids"). On the twelve LogHub systems the numeric unique keys left out by name are the header's
  ``pid`` / ``tid`` and the id mask's ``id_N``; kept: counters and durations (``num_N``);
* ``unique_per_sequence``: each value occurs in one sequence only (ids of the sequence itself,
  e.g. a block id): flagged, kept (the value-link markers of seqenc.links read exactly those);
* ``numeric``: at least 95 % of its values parse as numbers (numeric bins, seqenc.numeric, can
  read them); ``examples``: a few of its most common values;
* ``clock``: at least 95 % of its values look like a date, a clock time or a month name
  (``CLOCK``), or are Unix times (``EPOCH``: seconds, milliseconds, microseconds or nanoseconds
  since 1970 that fall between 2000 and 2100; a size of 1-4 GB in bytes would read as one too, so
  the profile prints the flag for a user to check), or the key is named so (``CLOCK_NAME``: ``date``,
  ``time``, ``timestamp2``, ``ts``, ``epoch``, ``created_at``, ... -- the names a detected header
  gives its clock fields, as HDFS's compact ``081109 203615``): a log header's date and time
  fields, which the object's ``ts`` already holds, or an event's other clocks. A
  date field takes one value a day, so it is no id within a day (``unique_per_object`` misses
  it), but every later day brings a value the model never saw: scored on day 2, every sequence
  of a model trained on day 1 looked novel (a made-up job log, ``2026-04-01 00:00:03,250 INFO
  ...``: the day's median at the reference's 100th percentile, nothing flagged; docs/training.md).

A source cut into fewer than ``FEW_SEQUENCES`` sequences gets a ``note`` (:func:`few_sequences_note`).
training.tasks.starter turns a profile into a starter task for the catalogue.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import polars as pl

from parsers import storage
from parsers.sessions import MIN_STEP_S

log = logging.getLogger(__name__)

MIN_DISTINCT = 20
UNIQUE_RATIO = 0.5
NUMERIC_SHARE = 0.95
N_EXAMPLES = 3
FEW_SEQUENCES = 50  # fewer: the profile's note says so (few_sequences_note)
SUGGESTED_WINDOWS = 200  # the note's log window cuts the time span into about this many
CLOCK_SHARE = 0.95
_MONTHS = ("Jan(uary)?|Feb(ruary)?|Mar(ch)?|Apr(il)?|May|June?|July?|Aug(ust)?|Sep(tember)?|Oct(ober)?"
           "|Nov(ember)?|Dec(ember)?")
# a date (2026-04-01, 2005.06.03, 04/01/2026, 06.01.26; not an IP address such as 10.0.10.1, nor
# a dotted version such as jetty-6.1.26's 6.1.26: a day-first date with dots has a four-digit year
# or two-digit day, month and year), a clock time (00:00:03,250), or a month name, at the start of
# the value; what follows a date may be anything (2005-06-03-15.42.50.675872, 2026-03-01T00:00:01Z).
# Case-insensitive; polars reads it as is (its regex engine has no back-references)
CLOCK = re.compile(r"(?i)^(\d{4}[-./]\d{1,2}[-./]\d{1,2}"
                   r"|((\d{1,2}-\d{1,2}-|\d{1,2}/\d{1,2}/)\d{2,4}|\d{2}\.\d{2}\.\d{2}|\d{1,2}\.\d{1,2}\.\d{4})([^.\d]|$)"
                   rf"|\d{{1,2}}:\d{{2}}(:\d{{2}})?([.,]\d+)?$|({_MONTHS})\b)")


# a clock's name: a header's date / time fields, ts, epoch, or *_at / *_ts (created_at); not *_time,
# which names durations as often (response_time, exec_time)
CLOCK_NAME = re.compile(r"(?i)^(date|time|timestamp|datetime|ts|at|epoch)\d*$|[._-](at|ts)$")
# Unix times between 2000-01-01 and 2100-01-01, in seconds, ms, µs or ns: [low, high) per unit
EPOCH = [(946_684_800 * 10 ** e, 4_102_444_800 * 10 ** e) for e in (0, 3, 6, 9)]
# a number, or a number and a short unit: 42, -0.5, 1e-3, 5.8 KB, 250ms, 12 %
MEASURE = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*([A-Za-z%µ/]{1,5})?\s*$")
# a key named as an identifier: its last name part (after ".", "_", "-" or a lower-to-upper case
# step) is id, pid, tid, uuid, guid or port, with an optional number (the masks' id_2, a header's pid)
ID_NAME = re.compile(r"(?:^|[._-]|(?<=[a-z])(?=[A-Z]))(?i:id|pid|tid|uuid|guid|port)(?:[_-]?\d+)?$")


def profile_source(root: str | Path, source: str, ingest_date=None) -> dict:
    """``{"source", "sequences", "objects", "labels": {class: n}, "keys": [per-key dict, ...], "note"}``
    (module docstring), keys sorted by share then name."""
    objects = storage.read_objects(root, source, ingest_date)
    if objects.height == 0:
        raise FileNotFoundError(f"source {source!r} has no ingested objects under {root}; ingest some first "
                                f"(seqenc ingest events|logs FILE --root {root} --source {source})")
    n_objects = objects.select("sequence_id", "step").unique().height
    n_sequences = objects["sequence_id"].n_unique()
    number = pl.col("value").str.strip_chars().cast(pl.Float64, strict=False)  # null: not a number
    per_key = (objects.group_by("key").agg(
        pl.len().alias("occurrences"),
        pl.col("value").n_unique().alias("distinct"),
        pl.struct("sequence_id", "step").n_unique().alias("objects"),
        pl.col("sequence_id").n_unique().alias("sequences"),
        number.is_not_null().mean().alias("numeric_share"),
        pl.col("value").str.contains(MEASURE.pattern).mean().alias("measure_share"),
        (pl.col("value").str.contains(CLOCK.pattern) | _epoch(number)).mean().alias("clock_share"),
    ))
    # values that occur in one sequence only, per key
    spread = (objects.group_by("key", "value").agg(pl.col("sequence_id").n_unique().alias("n"))
              .group_by("key").agg((pl.col("n") == 1).mean().alias("single_sequence_share")))
    top = (objects.group_by("key", "value").len().sort(["key", "len", "value"], descending=[False, True, False])
           .group_by("key", maintain_order=True).head(N_EXAMPLES).group_by("key").agg(pl.col("value")))
    rows = per_key.join(spread, on="key").join(top, on="key").sort(["objects", "key"], descending=[True, False])
    keys = []
    for r in rows.iter_rows(named=True):
        unique = r["distinct"] > MIN_DISTINCT and r["distinct"] >= UNIQUE_RATIO * r["occurrences"]
        numeric = r["numeric_share"] >= NUMERIC_SHARE
        clock = r["clock_share"] >= CLOCK_SHARE or bool(CLOCK_NAME.search(r["key"]))
        keys.append({
            "key": r["key"],
            "distinct": r["distinct"],
            "share": round(r["objects"] / n_objects, 4),
            "per_sequence": round(r["occurrences"] / r["sequences"], 2),
            "unique_per_object": unique,
            "unique_per_sequence": r["distinct"] > MIN_DISTINCT and r["single_sequence_share"] >= 0.9,
            "numeric": numeric,
            "clock": clock,
            "measurement": unique and r["measure_share"] >= NUMERIC_SHARE and not clock and not ID_NAME.search(r["key"]),
            "examples": [v[:40] for v in r["value"]],
        })
    labels = storage.read_labels(root, source).unique("sequence_id", keep="last")
    labels = labels.join(objects.select("sequence_id").unique(), on="sequence_id", how="semi")
    counts = dict(labels.group_by("label").len().sort("label").iter_rows())
    is_logs = objects["template_id"].drop_nulls().len() > 0
    out = {"source": source, "kind": "logs" if is_logs else "events", "sequences": n_sequences,
           "objects": n_objects, "labels": counts, "keys": keys}
    return out | {"note": few_sequences_note(out, objects)}


def _epoch(number: pl.Expr) -> pl.Expr:
    """Whether a value (as a number) is a Unix time of ``EPOCH``; a value that is no number is not."""
    out = pl.lit(False)
    for low, high in EPOCH:
        out = out | ((number >= low) & (number < high)).fill_null(False)
    return out


def few_sequences_note(profile: dict, objects: pl.DataFrame) -> str | None:
    """A line for a source cut into fewer than ``FEW_SEQUENCES`` sequences (None otherwise): a model
    learns from hundreds and a split needs three. For logs it suggests a ``window`` that would cut
    the ingested time span into about ``SUGGESTED_WINDOWS`` windows and says how many non-empty
    windows it makes of these lines' timestamps (more where the ingest also splits by a session
    field); where even that is under ``FEW_SEQUENCES`` it says why (timestamps to the second over a
    31 s log make at most 31 windows: Spark_2k).
    Why: Android_2k, Hadoop_2k, OpenStack_2k and Spark_2k span minutes, so the README's ``window =
    600`` made one sequence each, and training stopped on scikit-learn's words about ``n_samples=1``."""
    n = profile["sequences"]
    if n >= FEW_SEQUENCES:
        return None
    note = (f"only {n} sequence(s): a model learns from hundreds (a task's split needs at least 3); cut the "
            "data into more sequences or ingest more")
    ts = objects["ts"].drop_nulls()
    if profile["kind"] == "logs" and ts.len() > 1:
        span = (ts.max() - ts.min()).total_seconds()
        if span > 0:
            window = suggested_window(span)
            seconds = ts.dt.epoch("us").cast(pl.Float64) / 1e6

            def made_by(w: float) -> int:  # non-empty fixed windows: they start at multiples of w, as ingest's
                return (seconds / w).floor().n_unique()

            made = made_by(window)
            if window < 1 and made_by(1.0) == made:  # stamps to the second: a fraction of one cuts no finer
                window = 1.0
            note += (f" (its lines span {span:,.0f} s: window = {window:g} in the source's catalogue entry "
                     f"makes {made} windows")
            note += (")" if made >= FEW_SEQUENCES else
                     f", still under {FEW_SEQUENCES}: the lines' timestamps are too coarse or too few for time "
                     "windows; ingest more lines, or cut by a session field (session_field))")
    return note


def suggested_window(span: float) -> float:
    """A window that cuts ``span`` seconds into about ``SUGGESTED_WINDOWS``: whole seconds from one
    second up, two significant digits below (never under ingest's shortest step)."""
    raw = span / SUGGESTED_WINDOWS
    return float(max(1, round(raw))) if raw >= 1 else max(MIN_STEP_S, float(f"{raw:.2g}"))


def profile_table(profile: dict) -> str:
    """The profile as a fixed-width table for a terminal."""
    lines = [f"source {profile['source']} ({profile['kind']}): {profile['sequences']} sequences, "
             f"{profile['objects']} objects; labels: "
             + (", ".join(f"{k} {v}" for k, v in profile["labels"].items()) or "none"),
             f"{'key':<28} {'distinct':>9} {'share':>6} {'per_seq':>8}  flags                                  examples"]
    for k in profile["keys"]:
        flags = ",".join(name for name in ("unique_per_object", "unique_per_sequence", "numeric", "clock",
                                           "measurement")
                         if k.get(name))
        lines.append(f"{k['key'][:28]:<28} {k['distinct']:>9} {k['share']:>6.2f} {k['per_sequence']:>8.1f}  "
                     f"{flags:<38} {' | '.join(k['examples'])[:60]}")
    if profile.get("note"):
        lines.append(f"note: {profile['note']}")
    return "\n".join(lines)
