"""A task resolved once: what an entry point (the CLI, a DAG task, a bench) passes down.

A user names a task; the entry resolves that name against the catalogue into a :class:`TaskSpec`
-- the task's name, its declaration, its kind's registry entry and the catalogue it came from --
and everything below takes the spec. Nothing below the entry looks the catalogue up by name
again, so a task cannot change under a running job, and the name is checked in one place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from training.tasks.catalog import Catalog, Task, load_catalog


@dataclass(frozen=True)
class TaskSpec:
    name: str  # the catalogue's [tasks.<name>]: a safe name (it names folders and the model)
    task: Task  # its declaration (training.tasks.catalog.Task)
    catalog_path: str | None = None  # the catalogue file it was declared in (None: text or the default)

    def __getattr__(self, field: str):
        """The declaration's fields and helpers (``source``, ``kind``, ``kind_spec``,
        ``threshold_policy()``, ...), read through: the spec is the task, with its name."""
        if field.startswith("__"):
            raise AttributeError(field)
        return getattr(self.task, field)


def resolve_task(catalog: str | os.PathLike | Catalog | None, name: str) -> TaskSpec:
    """The task ``name`` of ``catalog`` (a path, TOML text, a loaded Catalog, or None for
    ``$SEQENC_CATALOG`` / the built-in one); training.tasks.catalog.CatalogError when it has none."""
    catalog = load_catalog(catalog)
    return TaskSpec(name, catalog.task(name), catalog.path)


def specs_of(catalog: Catalog) -> list[TaskSpec]:
    """Every task of a loaded catalogue, in its order."""
    return [TaskSpec(name, task, catalog.path) for name, task in catalog.tasks.items()]
