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
* ``unique_per_sequence``: each value occurs in one sequence only (ids of the sequence itself,
  e.g. a block id): flagged, kept (the value-link markers of seqenc.links read exactly those);
* ``numeric``: at least 95 % of its values parse as numbers (numeric bins, seqenc.numeric, can
  read them); ``examples``: a few of its most common values.

:func:`starter_task` turns a profile into a task table for the catalogue (seqenc.catalog): the
unique-per-object keys left out, the template text of a log source left out (the event key
carries it), and the kind read from the labels: none -> ``anomaly``, two classes -> ``binary``
(positive: the rarer class, to be checked), more -> ``multiclass``. :func:`append_task` writes
it into a catalogue file, refusing a name already declared, and validates the result.
"""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path

import polars as pl

from parsers import storage

log = logging.getLogger(__name__)

MIN_DISTINCT = 20
UNIQUE_RATIO = 0.5
NUMERIC_SHARE = 0.95
N_EXAMPLES = 3


def profile_source(root: str | Path, source: str, ingest_date=None) -> dict:
    """``{"source", "sequences", "objects", "labels": {class: n}, "keys": [per-key dict, ...]}``
    (module docstring), keys sorted by share then name."""
    objects = storage.read_objects(root, source, ingest_date)
    if objects.height == 0:
        raise FileNotFoundError(f"source {source!r} has no ingested objects under {root}; ingest some first "
                                f"(seqenc ingest events|logs FILE --root {root} --source {source})")
    n_objects = objects.select("sequence_id", "step").unique().height
    n_sequences = objects["sequence_id"].n_unique()
    numeric = pl.col("value").str.strip_chars().cast(pl.Float64, strict=False).is_not_null()
    per_key = (objects.group_by("key").agg(
        pl.len().alias("occurrences"),
        pl.col("value").n_unique().alias("distinct"),
        pl.struct("sequence_id", "step").n_unique().alias("objects"),
        pl.col("sequence_id").n_unique().alias("sequences"),
        numeric.mean().alias("numeric_share"),
    ))
    # values that occur in one sequence only, per key
    spread = (objects.group_by("key", "value").agg(pl.col("sequence_id").n_unique().alias("n"))
              .group_by("key").agg((pl.col("n") == 1).mean().alias("single_sequence_share")))
    top = (objects.group_by("key", "value").len().sort(["key", "len", "value"], descending=[False, True, False])
           .group_by("key", maintain_order=True).head(N_EXAMPLES).group_by("key").agg(pl.col("value")))
    rows = per_key.join(spread, on="key").join(top, on="key").sort(["objects", "key"], descending=[True, False])
    keys = []
    for r in rows.iter_rows(named=True):
        keys.append({
            "key": r["key"],
            "distinct": r["distinct"],
            "share": round(r["objects"] / n_objects, 4),
            "per_sequence": round(r["occurrences"] / r["sequences"], 2),
            "unique_per_object": r["distinct"] > MIN_DISTINCT and r["distinct"] >= UNIQUE_RATIO * r["occurrences"],
            "unique_per_sequence": r["distinct"] > MIN_DISTINCT and r["single_sequence_share"] >= 0.9,
            "numeric": r["numeric_share"] >= NUMERIC_SHARE,
            "examples": [v[:40] for v in r["value"]],
        })
    labels = storage.read_labels(root, source).unique("sequence_id", keep="last")
    labels = labels.join(objects.select("sequence_id").unique(), on="sequence_id", how="semi")
    counts = dict(labels.group_by("label").len().sort("label").iter_rows())
    is_logs = objects["template_id"].drop_nulls().len() > 0
    return {"source": source, "kind": "logs" if is_logs else "events", "sequences": n_sequences,
            "objects": n_objects, "labels": counts, "keys": keys}


def profile_table(profile: dict) -> str:
    """The profile as a fixed-width table for a terminal."""
    lines = [f"source {profile['source']} ({profile['kind']}): {profile['sequences']} sequences, "
             f"{profile['objects']} objects; labels: "
             + (", ".join(f"{k} {v}" for k, v in profile["labels"].items()) or "none"),
             f"{'key':<28} {'distinct':>9} {'share':>6} {'per_seq':>8}  flags                      examples"]
    for k in profile["keys"]:
        flags = ",".join(name for name in ("unique_per_object", "unique_per_sequence", "numeric") if k[name])
        lines.append(f"{k['key'][:28]:<28} {k['distinct']:>9} {k['share']:>6.2f} {k['per_sequence']:>8.1f}  "
                     f"{flags:<26} {' | '.join(k['examples'])[:60]}")
    return "\n".join(lines)


def starter_task(profile: dict) -> dict:
    """A ``[tasks.<name>]`` table for the profiled source (module docstring)."""
    exclude = [k["key"] for k in profile["keys"] if k["unique_per_object"]]
    task: dict = {"source": profile["source"]}
    labels = profile["labels"]
    if len(labels) == 0 or len(labels) == 1:
        task["kind"] = "anomaly"
    elif len(labels) == 2:
        task["kind"] = "binary"
        task["positive"] = min(labels, key=lambda c: (labels[c], c))  # the rarer class: check it
    else:
        task["kind"] = "multiclass"
    if profile["kind"] == "logs":
        task["event_key"] = True
        exclude.append("template")
    task["exclude_keys"] = sorted(set(exclude))
    return task


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def task_toml(name: str, task: dict) -> str:
    """``[tasks.<name>]`` and its fields as TOML text (flat values and lists only)."""
    return f"[tasks.{name}]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in task.items())


def append_task(catalog_path: str | Path, name: str, task: dict, source_table: dict | None = None) -> str:
    """Append ``task`` as ``[tasks.<name>]`` (and ``source_table`` as its ``[sources.<src>]`` when
    the catalogue does not declare the source yet) to a catalogue file, creating it when
    missing; the result must load (seqenc.catalog.load_catalog) or the file is left as it was.
    Returns the text appended."""
    from seqenc.catalog import CatalogError, load_catalog, parse_catalog

    path = Path(catalog_path)
    before = path.read_text(encoding="utf-8") if path.exists() else ""
    declared = load_catalog(path) if before.strip() else None
    if declared is not None and name in declared.tasks:
        raise CatalogError(f"{path}: [tasks.{name}] is already declared; choose another --task-name or edit it")
    text = ""
    if source_table is not None and (declared is None or task["source"] not in declared.sources):
        text += f"[sources.{task['source']}]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in
                                                          source_table.items()) + "\n"
    text += task_toml(name, task)
    after = before + ("\n" if before and not before.endswith("\n\n") else "") + text
    parse_catalog(tomllib.loads(after), str(path), str(path))  # the result must load, or nothing is written
    storage.write_bytes_atomic(after.encode("utf-8"), path)
    return text
