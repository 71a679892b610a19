"""One labelled dataset (:class:`LabelledDataset`: objects, labels, split) and the checks every
loader applies: what the count baselines (training.tasks.baselines) and the benches read.

The bench's loaders live in training.bench.data (and training.bench.hdfs); a task's own data
becomes one in training.serving.evaluate.count_baseline_metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from training.tasks.kinds import get_kind

BINARY = ("Normal", "Anomaly")
SPLITS = ("train", "dev", "test")


@dataclass
class LabelledDataset:
    name: str  # "hdfs" | "bgl" | "milestone" | "value_anomaly"
    task: str  # "binary" | "multiclass" | "next_item"
    class_names: tuple[str, ...]  # next_item: the catalogue
    objects: pl.DataFrame  # long form, exactly the OBJECTS_SCHEMA columns and types
    labels: pl.DataFrame  # sequence_id, label: one per sequence of objects
    split: pl.DataFrame  # sequence_id, split in {"train", "dev", "test"}
    event_key: str  # key whose values are a sequence's events (count baselines)
    exclude_keys: tuple[str, ...]  # keys left out of the value sequences S(k)
    description: str  # source, how objects / labels / split were built
    info: dict = field(default_factory=dict)  # paths, ingest report, generator report
    split_rule: str = "stratified"  # how ``split`` was made: see SPLIT_RULES and the module docstring

    def counts(self) -> dict[str, dict[str, int]]:
        """Number of sequences per split and class: ``{"train": {"Normal": n, ...}, ...}``
        (next_item: per split only, ``{"train": {"sequences": n}, ...}``; the catalogue is large)."""
        if get_kind(self.task).ranks_items:
            n = dict(self.split.group_by("split").len().iter_rows())
            return {s: {"sequences": n.get(s, 0)} for s in SPLITS}
        rows = self.split.join(self.labels, on="sequence_id").group_by("split", "label").len().iter_rows()
        out = {s: dict.fromkeys(self.class_names, 0) for s in SPLITS}
        for split, label, n in rows:
            out[split][label] = n
        return out


def _require(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"real data not found: {path} (expected under the data_dir, see ../shared/data)")
    return path


def _labelled(objects: pl.DataFrame, labels: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Objects of labelled sequences only, and the labels of the sequences that have objects."""
    labels = labels.select("sequence_id", "label")
    objects = objects.join(labels, on="sequence_id", how="semi")
    labels = labels.join(objects.select("sequence_id").unique(), on="sequence_id", how="semi")
    return objects, labels.sort("sequence_id")


def _check(ds: LabelledDataset) -> None:
    seqs = ds.objects["sequence_id"].unique()
    for what, frame in (("label", ds.labels), ("split", ds.split)):
        if frame["sequence_id"].n_unique() != frame.height or frame.height != len(seqs) \
                or not frame["sequence_id"].is_in(seqs.implode()).all():
            raise RuntimeError(f"{ds.name}: every sequence must have exactly one {what}")
    unknown = set(ds.labels["label"].unique()) - set(ds.class_names)
    if unknown:
        raise RuntimeError(f"{ds.name}: labels {sorted(unknown)} are not among {ds.class_names}")


def _split_text(ds_counts: dict) -> str:
    return "; ".join(f"{s}: " + ", ".join(f"{n} {c}" for c, n in ds_counts[s].items()) for s in SPLITS)


def _finish(ds: LabelledDataset) -> LabelledDataset:
    ds.description += f" Sizes: {_split_text(ds.counts())}."
    return ds
