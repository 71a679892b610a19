"""``seqenc tasks``: the catalogue's tasks, and what the data root holds for each.

Per task: its source, kind, declared classes (or where they come from), split and mode; with a
data root, the source's ingested sequences, how many carry a label, and the labelled ones per
class -- for a binary task in the model's order (negative, positive), so a user sees at once a
labels file that matches no sequence, a class with too few sequences, or a source never
ingested.
"""

from __future__ import annotations

from pathlib import Path

from parsers import storage
from training.tasks.catalog import load_catalog


def task_rows(catalog=None, root: str | Path | None = None) -> list[dict]:
    """One dict per declared task (module docstring)."""
    catalog = load_catalog(catalog)
    rows = []
    for name, task in catalog.tasks.items():
        row = {"task": name, "source": task.source, "kind": task.kind, "classes": task.classes,
               "positive": task.positive, "split": task.split, "mode": task.mode,
               "registered_model": f"seqenc-{name}"}
        if root is not None:
            row.update(_counts(root, task))
        rows.append(row)
    return rows


def _counts(root, task) -> dict:
    dates = storage.ingest_dates(root, task.source)
    if not dates:
        return {"ingest_dates": 0, "sequences": 0, "labelled": 0, "per_class": {}}
    ids = storage.read_objects(root, task.source).select("sequence_id").unique()
    labels, _ = storage.unique_labels(root, task.source)
    labelled = labels.join(ids, on="sequence_id", how="semi")
    per_class = dict(labelled.group_by("label").len().sort("label").iter_rows())
    if task.kind == "binary" and task.positive in per_class:  # the model's order: negative, positive
        per_class = {**{c: n for c, n in per_class.items() if c != task.positive}, task.positive: per_class[task.positive]}
    return {"ingest_dates": len(dates), "first_date": dates[0], "last_date": dates[-1], "sequences": ids.height,
            "labelled": labelled.height, "per_class": per_class if not task.kind_spec.ranks_items else
            {"distinct_targets": labelled["label"].n_unique()}}


def tasks_table(rows: list[dict]) -> str:
    """The rows as a fixed-width table."""
    if not rows:
        return "no tasks declared"
    counted = "sequences" in rows[0]
    head = f"{'task':<20} {'source':<16} {'kind':<11} {'split':<10}" + (
        f" {'sequences':>9} {'labelled':>8}  per class" if counted else "  classes")
    lines = [head]
    for r in rows:
        line = f"{r['task'][:20]:<20} {r['source'][:16]:<16} {r['kind']:<11} {r['split']:<10}"
        if counted:
            classes = ", ".join(f"{c} {n}" for c, n in r["per_class"].items())
            line += f" {r['sequences']:>9} {r['labelled']:>8}  {classes}"
        else:
            line += "  " + (", ".join(r["classes"]) if r["classes"] else
                            "from the data" if r["kind"] != "anomaly" else "none needed")
        lines.append(line)
    return "\n".join(lines)


def scheduled_tasks(catalog=None, wanted: list[str] | None = None) -> list[str]:
    """The catalogue's task names, in its order, narrowed to ``wanted`` when given (the DAGs'
    param ``tasks``); a name the catalogue does not declare is an error."""
    declared = list(load_catalog(catalog).tasks)
    unknown = sorted(set(wanted or []) - set(declared))
    if unknown:
        raise ValueError(f"tasks {unknown} are not in the catalogue's {declared}")
    return [name for name in declared if not wanted or name in wanted]
