"""A starter task for a profiled source (``seqenc profile``), written into a catalogue file.

:func:`starter_task` turns a profile (parsers.profile.profile_source) into a ``[tasks.<name>]``
table: the unique-per-object keys (ids) and the clock keys (a log header's date and time) left out
-- but not the measurements (numbers that differ per object because they are measured finely: an
amount, a latency; parsers.profile), where a value-only anomaly lives --, the template text of a
log source left out (the event key carries it), and the kind read from the labels: none -> ``anomaly``, two classes ->
``binary`` (positive: the rarer class, to be checked), more -> ``multiclass``.
:func:`append_task` writes it into a catalogue file, refusing a name already declared, and
validates the result.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from parsers import storage
from training.tasks.catalog import CatalogError, load_catalog, parse_catalog


def starter_task(profile: dict) -> dict:
    """A ``[tasks.<name>]`` table for the profiled source (module docstring)."""
    exclude = [k["key"] for k in profile["keys"]
               if (k["unique_per_object"] and not k.get("measurement")) or k.get("clock")]
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
    missing; the result must load (training.tasks.catalog.load_catalog) or the file is left as it was.
    Returns the text appended."""
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
