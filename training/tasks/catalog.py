"""The catalogue: which sources a deployment ingests and which tasks it trains, in one TOML file.

A user declares their own data here instead of in code (``--catalog FILE``, else the
environment variable ``SEQENC_CATALOG``, else the shipped ``default_catalog.toml``: the built-in
demo's sources and tasks)::

    [sources.payments]                  # a name of [A-Za-z0-9_.-]: it becomes a partition folder
    kind = "events"                     # "logs" | "events" | "tables" | "texts"
    path = "landing/payments/*.jsonl"   # file or glob of raw files (relative: to the catalogue's folder;
                                        # s3://bucket/... too: fetched by seqenc ingest)
    session_field = "order.id"          # events: the field that groups events into sequences
    ts_field = "at"                     # events: the time field
    labels = "labels/payments.csv"      # optional labels CSV ...
    label_id_column = "order_id"        # ... its id column (default: the first)
    label_column = "outcome"            # ... its label column (default: the second)

    [tasks.fraud]                       # a name of [A-Za-z0-9_.-]: model name seqenc-fraud
    source = "payments"
    kind = "binary"                     # "binary" | "multiclass" | "next_item" | "anomaly" (no labels)
    positive = "fraud"                  # binary: the positive class (the other one is negative)
    exclude_keys = ["request_id"]       # keys left out of S(k)
    split = "stratified"                # "stratified" | "fixed" | "time" | "grouped" (default: stratified;
                                        # a table task's default is grouped by table)
    config = {model = {d_model = 64}}   # TVMKAConfig / TrainConfig overrides

Every field of both tables is below (:class:`Source`, :class:`Task`); an unknown field, a wrong
kind or a task over an undeclared source is an error that names the file, the table and the
field, and lists what is allowed (:class:`CatalogError`).

Choices where the issue leaves room:

* relative paths resolve against the catalogue file's folder (so a catalogue and its data move
  together); the shipped catalogue has no paths: ``seqenc demo`` generates its data
  (``demo_generator``);
* a binary task's classes are put in the order (negative, positive), so index 1 is the positive
  class everywhere downstream (thresholds, P(positive) scores, the masked LM of normal
  sequences); the classes come from ``classes`` or, when not given, from the labels;
* ``kind = "anomaly"`` needs no labels. Labels, where they exist, only evaluate it: ``positive``
  names the anomalous class in them (every other label is normal), and ``train_on = "normal"``
  trains the masked LM on the sequences labelled normal only (DeepLog's setting);
* ``split = "time"``: sequences ordered by their first timestamp, the oldest 70 % train, the
  next 15 % dev, the newest 15 % test (what will be scored next is newer than what trained).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from parsers.names import NAME
from parsers.objectstore import S3Path, as_path, is_remote
from parsers.sources import Source
from training.engine.modes import SELECTABLE as TRAINING_MODES
from training.engine.sizes import SIZES as _SIZES
from training.tasks.kinds import KINDS, TASK_KINDS, THRESHOLD_POLICIES, TaskKind

SIZE_NAMES = tuple(_SIZES)

DEFAULT_CATALOG = Path(__file__).with_name("default_catalog.toml")
ENV_VAR = "SEQENC_CATALOG"
SPLITS = ("stratified", "fixed", "time", "grouped")


class CatalogError(ValueError):
    """A catalogue that cannot be used; the message names the file, the table and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Threshold(_Strict):
    """How a binary or anomaly task turns scores into flags. Binary, a rule fitted on the
    labelled dev sequences (training.tasks.thresholds): ``best_f1`` the threshold with the best dev F1,
    ``one_se`` the one nearest 0.5 within one standard error of it (binary's default; a score
    combined with the surprise, which has no 0.5 of its own, takes that band's median), ``half`` 0.5;
    anomaly: ``contamination``: flag the top ``share`` of the reference (dev) sequences' scores
    (anomaly's default, share 0.05);
    ``quantile``: flag above the ``q``-quantile of the reference scores (a clean reference
    window: ``train_on = "normal"``)."""

    policy: Literal[THRESHOLD_POLICIES]  # type: ignore[valid-type]
    share: float | None = Field(default=None, gt=0, le=0.5)
    q: float | None = Field(default=None, gt=0, lt=1)

    @model_validator(mode="after")
    def _fields(self) -> Threshold:
        need = {"contamination": "share", "quantile": "q"}.get(self.policy)
        for name in ("share", "q"):
            if name != need and getattr(self, name) is not None:
                raise ValueError(f"{name} is not used by policy {self.policy!r}")
        if need and getattr(self, need) is None:
            raise ValueError(f"policy {self.policy!r} needs {need}")
        return self

    def to_dict(self) -> dict:
        return self.model_dump(exclude_none=True)



class Task(_Strict):
    """``[tasks.<name>]``: what to predict from a source's sequences."""

    source: str
    kind: Literal[TASK_KINDS]  # type: ignore[valid-type]
    classes: list[str] | None = None  # binary / multiclass: default the labels' distinct values
    positive: str | None = None  # binary: the positive class; anomaly: the anomalous label (evaluation)
    exclude_keys: list[str] = []  # keys kept in Parquet but left out of S(k)
    keep_keys: list[str] | None = None  # when given: only these keys (and the event key) make S(k)
    event_key: bool = False  # logs: a key "event" with the line's template id (S(event) = the event order)
    item_key: str | None = None  # next_item: the key whose values are the catalogue's items
    # default (left out): "stratified", a table task's "grouped" by its table (_default_split)
    split: Literal[SPLITS] = "stratified"  # type: ignore[valid-type]
    size: Literal[SIZE_NAMES] | None = None  # type: ignore[valid-type]  # model and step sizes (default: the command's)
    mode: Literal[TRAINING_MODES] = "interleaved"  # type: ignore[valid-type]
    config: dict[str, dict[str, Any]] = {}  # {"model": {TVMKAConfig fields}, "train": {TrainConfig fields}}
    threshold: Threshold | None = None
    train_on: Literal["all", "normal"] = "all"  # anomaly: which train sequences the masked LM reads
    # at most this many sequences read for training (a stable sample: the smallest hashes of the
    # ids), so memory is bounded however many days the window holds; None: every sequence
    max_sequences: int | None = Field(default=None, ge=1)
    # tables (training.tasks.table_task): the examples are the source's texts, each joined to the table
    # of `table_source` whose id its `table_key` holds (TabFact: statements and their tables)
    table_source: str | None = None
    table_key: str = "table"
    # split = "grouped": sequences with the same value of this key stay in one split (default for
    # a table task: its table_key, so no test table is seen in training)
    group_key: str | None = None
    # a key whose value "train", "dev" or "test" fixes a sequence's split (an official test set);
    # the other sequences are split as `split` says, with its test share going to train. Never
    # model input: it joins exclude_keys (_split_key_excluded)
    split_key: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_split(cls, data: Any) -> Any:
        """A table task left without ``split`` is split by table: a stratified split would put a
        test statement's table, with its other statements, in train (stated only if given)."""
        if isinstance(data, dict) and "split" not in data and data.get("table_source"):
            return {**data, "split": "grouped"}
        return data

    @model_validator(mode="before")
    @classmethod
    def _split_key_excluded(cls, data: Any) -> Any:
        """A split_key says where a sequence is evaluated, not what it is: never model input."""
        if isinstance(data, dict) and data.get("split_key") and data["split_key"] not in data.get("exclude_keys", []):
            return {**data, "exclude_keys": [*data.get("exclude_keys", []), data["split_key"]]}
        return data

    @model_validator(mode="after")
    def _by_kind(self) -> Task:
        if set(self.config) - {"model", "train"}:
            raise ValueError(f"config has sections {sorted(self.config)}; allowed: model, train")
        if self.classes is not None and len(set(self.classes)) != len(self.classes):
            raise ValueError(f"classes repeat a name: {self.classes}")
        if self.kind == "binary":
            if not self.positive:
                raise ValueError("a binary task needs positive = the name of its positive class")
            if self.classes is not None and (len(self.classes) != 2 or self.positive not in self.classes):
                raise ValueError(f"a binary task's classes are two names, positive among them; got {self.classes}")
        if self.kind == "multiclass" and self.classes is not None and len(self.classes) < 2:
            raise ValueError(f"a multiclass task needs at least two classes, got {self.classes}")
        kind = KINDS[self.kind]
        if kind.ranks_items and not self.item_key:
            raise ValueError(f"a {self.kind} task needs item_key = the key whose values are the items")
        if not kind.ranks_items and self.item_key:
            raise ValueError(f"item_key is for {', '.join(k for k in KINDS if KINDS[k].ranks_items)} tasks")
        if not kind.declares_classes and self.classes is not None:
            raise ValueError(f"a {self.kind} task has no classes field (next_item: the items come from the data; "
                             "anomaly: normal / positive)")
        if self.kind != "anomaly" and self.train_on != "all":
            raise ValueError("train_on is for anomaly tasks")
        if self.kind == "anomaly" and self.train_on == "normal" and not self.positive:
            raise ValueError('train_on = "normal" needs positive = the anomalous label (the rest is normal)')
        if self.mode == "table" and not self.table_source:
            raise ValueError('mode = "table" reads a text joined to its table: it needs table_source')
        if self.split == "grouped" and not (self.group_key or self.table_source):
            raise ValueError('split = "grouped" needs group_key (or a table task: table_source)')
        policy = self.threshold.policy if self.threshold else None
        if policy and policy not in kind.threshold_policies:
            applies = "; ".join(f"{name}: {', '.join(k.threshold_policies)}" for name, k in KINDS.items()
                                if k.threshold_policies)
            raise ValueError(f"threshold policy {policy!r} does not apply to a {self.kind} task ({applies})")
        return self

    @property
    def kind_spec(self) -> TaskKind:
        """The kind's entry in the registry (training.tasks.kinds)."""
        return KINDS[self.kind]

    @property
    def labelled(self) -> bool:
        """Whether training needs labels (every kind but anomaly)."""
        return self.kind_spec.labelled

    @property
    def model_task(self) -> str:
        """TVMKAConfig.task of the model: an anomaly task's model scores normal / anomalous."""
        return self.kind_spec.head

    @property
    def grouping_key(self) -> str | None:
        """The key whose value groups sequences for the ``grouped`` split."""
        return self.group_key or (self.table_key if self.table_source else None)

    def threshold_policy(self) -> dict:
        """The declared threshold policy, else the kind's default (for ``train_on = "normal"``, whose
        reference holds normal sequences only, the kind's ``clean_reference_threshold``)."""
        if self.threshold is not None:
            return self.threshold.to_dict()
        if self.train_on == "normal" and self.kind_spec.clean_reference_threshold is not None:
            return dict(self.kind_spec.clean_reference_threshold)
        return dict(self.kind_spec.default_threshold or {})

    def ordered_classes(self, labels: list[str]) -> list[str]:
        """The model's classes in output order, from ``classes`` or the distinct ``labels``.
        Binary: (negative, positive). Anomaly: (normal, ``positive`` or "anomaly"), whatever
        the labels say. Raises ValueError when the labels cannot make the task."""
        if self.kind == "anomaly":
            positive = self.positive or "anomaly"
            return ["normal" if positive != "normal" else "not_normal", positive]
        found = sorted(set(labels))
        classes = list(self.classes) if self.classes is not None else found
        if self.classes is not None:
            unknown = sorted(set(found) - set(classes))
            if unknown:
                raise ValueError(f"labels {unknown[:10]} are not among the declared classes {classes}; add them to "
                                 "classes or fix the labels")
        if self.kind == "binary":
            if len(classes) != 2:
                raise ValueError(f"a binary task needs labels of exactly two classes, found {classes}; a multiclass "
                                 "task takes more, and one class alone cannot be learned")
            if self.positive not in classes:
                raise ValueError(f"positive class {self.positive!r} is not among the labels' classes {classes}")
            return [c for c in classes if c != self.positive] + [self.positive]
        if self.kind == "multiclass" and len(classes) < 2:
            raise ValueError(f"a multiclass task needs labels of at least two classes, found {classes}")
        return classes


class Catalog(_Strict):
    """The whole file: ``[sources.<name>]`` and ``[tasks.<name>]`` tables."""

    sources: dict[str, Source] = {}
    tasks: dict[str, Task] = {}
    path: str | None = Field(default=None, exclude=True)  # where it was read from (messages, relative paths)

    @model_validator(mode="after")
    def _names(self) -> Catalog:
        for table, names in (("sources", self.sources), ("tasks", self.tasks)):
            for name in names:
                if not NAME.fullmatch(name):
                    raise ValueError(f"[{table}.{name}]: a name is 1-64 characters of [A-Za-z0-9_.-], starting "
                                     "with a letter or digit (it becomes a folder and a model name)")
        for name, task in self.tasks.items():
            if task.source not in self.sources:
                raise ValueError(f"[tasks.{name}] source: {task.source!r} is not a declared source; declared: "
                                 f"{', '.join(sorted(self.sources)) or 'none'}")
            if task.table_source is not None:
                kind = self.sources[task.table_source].kind if task.table_source in self.sources else None
                if kind != "tables":
                    raise ValueError(f"[tasks.{name}] table_source: {task.table_source!r} is not a declared tables "
                                     "source; declare it with kind = \"tables\"")
        return self

    def task(self, name: str) -> Task:
        if name not in self.tasks:
            raise CatalogError(f"unknown task {name!r} in {self.where}; declared tasks: "
                               f"{', '.join(sorted(self.tasks)) or 'none'}")
        return self.tasks[name]

    def source(self, name: str) -> Source:
        if name not in self.sources:
            raise CatalogError(f"unknown source {name!r} in {self.where}; declared sources: "
                               f"{', '.join(sorted(self.sources)) or 'none'}")
        return self.sources[name]

    @property
    def where(self) -> str:
        return self.path or "the catalogue"

    def resolve_path(self, path: str) -> Path | S3Path:
        """A path of the catalogue: an ``s3://`` URI or an absolute path as given, a relative one
        against the catalogue's folder."""
        if is_remote(path):
            return as_path(path)
        p = Path(os.path.expanduser(path))
        return p if p.is_absolute() or not self.path else Path(self.path).parent / p


def _describe(err: dict, where: str) -> str:
    """One pydantic error as 'FILE: [table.name] field: what is wrong; allowed: ...'."""
    loc = [str(x) for x in err["loc"]]
    table = f"[{'.'.join(loc[:2])}]" if len(loc) >= 2 else f"[{loc[0]}]" if loc else ""
    field = ".".join(loc[2:])
    if err["type"] == "extra_forbidden":
        model = {"sources": Source, "tasks": Task}.get(loc[0]) if loc else None
        if model is not None and len(loc) == 3:
            allowed = sorted(model.model_fields)
        elif model is None and len(loc) == 1:
            allowed = ["sources", "tasks"]
        else:
            allowed = sorted(Threshold.model_fields) if "threshold" in loc else []
        return (f"{where}: {table} unknown field {field or loc[-1]!r}"
                + (f"; allowed fields: {', '.join(allowed)}" if allowed else ""))
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "literal_error":
        message = f"{err.get('input')!r} is not allowed; allowed: {err['ctx']['expected']}"
    if not table:  # a check over the whole file: the message names its table
        return f"{where}: {message}"
    return f"{where}: {table}{' ' + field if field else ''}: {message}"


def parse_catalog(data: dict, where: str = "the catalogue", path: str | None = None) -> Catalog:
    """A catalogue from its parsed TOML (a dict); CatalogError on anything invalid. ``where``
    names it in messages; ``path`` is its file (relative paths resolve against its folder)."""
    if "path" in data:
        raise CatalogError(f"{where}: unknown top-level table 'path'; allowed: sources, tasks")
    try:
        return Catalog.model_validate({**data, "path": path})
    except ValidationError as exc:
        raise CatalogError("; ".join(_describe(e, where) for e in exc.errors()[:5])) from None


def load_catalog(catalog: str | os.PathLike | Catalog | None = None) -> Catalog:
    """A :class:`Catalog` from a file path, TOML text (the Airflow Variable may hold either),
    an already loaded one, or None: ``$SEQENC_CATALOG``, else the shipped default."""
    if isinstance(catalog, Catalog):
        return catalog
    if catalog is None or str(catalog) == "":
        catalog = os.environ.get(ENV_VAR) or DEFAULT_CATALOG
    text = str(catalog)
    if "\n" in text or text.lstrip().startswith("["):
        where, path, raw = "the catalogue text", None, text
    else:
        path = Path(os.path.expanduser(text))
        if not path.is_file():
            raise CatalogError(f"catalogue {path} does not exist; pass an existing TOML file with --catalog "
                               f"(or ${ENV_VAR})")
        where, raw = str(path.resolve()), path.read_text(encoding="utf-8")
        path = where
    try:
        data = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{where}: not valid TOML ({exc})") from None
    return parse_catalog(data, where, path)


def catalog_ref(catalog: str | os.PathLike | Catalog | None) -> str | None:
    """What to store so that a later step (a resumed job, an Airflow task) loads the same
    catalogue: its path, or None for the default."""
    if isinstance(catalog, Catalog):
        return catalog.path
    return None if catalog is None else str(catalog)
