"""A task's value sequences, split, vocabulary and windows, built a bucket of sequences at a time.

This is the engine of ``training.pipeline.stages.stage_sequences``. Its input is lazy
(training.tasks.task_data.task_input: a week of ingest partitions is not read into memory); its
memory follows ``chunk_sequences`` sequences, not the week:

1. **bucket**: one streaming pass splits the task's objects into buckets of ``chunk_sequences``
   sequences by ranges of the sorted sequence ids (training.tasks.buckets.range_buckets), Parquet in a
   temporary folder; each bucket's S(k) (training.tasks.task_data.value_sequences) is written there too
   and its objects dropped. A task of at most ``chunk_sequences`` sequences is one bucket, built
   in memory without a spill;
2. **split**: labels and train / dev / test per sequence (only ids and labels in memory);
3. **vocabulary**: WordPiece from the train rows of at most VOCAB_SEQUENCES train sequences
   (training.tasks.task_data.vocab_sample: a stable sample by id hash) and numeric bins from every train
   row, read bucket by bucket (training.tasks.task_data.fit_tokenizer; the bins exact up to
   seqenc.numeric.MAX_FIT_VALUES numbers per key, a thinned sample past it);
4. **windows**: each bucket tokenised and appended to ``windows.parquet`` (and a next_item
   task's ``item_history.parquet``), so neither is ever whole in memory here.

The buckets are contiguous ranges of the sorted ids and S(k) rows are sorted by sequence and key
within a bucket, so every file equals what one in-memory pass over all sequences writes (the
test builds both and compares them): the bucket size changes memory, never the result.
What reads the files afterwards (training) loads the windows it trains on; a task's
``max_sequences`` bounds that.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from parsers import storage
from seqenc.sequences import WINDOWS_SCHEMA
from training.tasks.buckets import sequence_chunks
from training.tasks.catalog import Task
from training.tasks.spec import TaskSpec
from training.tasks.task_data import (
    TaskInput,
    assign_splits,
    fit_tokenizer,
    item_history_frame,
    label_vector,
    value_sequences,
    vocab_sample,
    windows_of,
    write_task,
)

log = logging.getLogger(__name__)

# sequences per bucket. Chosen, not tuned: at 2 days of 100k generated HDFS lines (12,948
# sequences, ``seqenc bench sequences``) buckets of 2,000 peaked at 753 MB and of 500 at 694 MB.
# A week of 10.4M-line days (4.5M sequences, 626M object rows) with this size peaks at 1,819 MB
# (2026-11-27, in the per-bucket value sequences; the spill 1.7 GB; the windows step, tokenised
# WINDOW_SEQUENCES at a time, 1.26 GB: docs/operations.md); it had peaked at 2,264 MB with whole buckets
# tokenised at once and a tokenizer cache of 1M entries.
CHUNK_SEQUENCES = 20_000
# sequences tokenised at a time in the windows step: its windows are Python lists of ints
# (~36 bytes a token), so a whole bucket of 20,000 week sequences (11.5M tokens) held ~400 MB of
# them plus ~130 MB of Arrow; a slice of 2,000 holds a tenth. The rows written are the same.
WINDOW_SEQUENCES = 2_000
STAT_SUMS = ("sequences", "keys", "windows", "values", "dropped_values", "tokens")


def sequence_slices(value_seqs: pl.DataFrame, n: int) -> Iterator[pl.DataFrame]:
    """``value_seqs`` (rows of one sequence contiguous) in zero-copy slices of at most ``n`` whole sequences."""
    if value_seqs.height == 0:
        yield value_seqs
        return
    lengths = value_seqs["sequence_id"].rle().struct.field("len").to_numpy()  # rows per sequence, in order
    starts = np.concatenate([[0], np.cumsum(lengths)])
    for first in range(0, len(lengths), n):
        last = min(first + n, len(lengths))
        yield value_seqs.slice(int(starts[first]), int(starts[last] - starts[first]))


class ValueSequenceParts:
    """The S(k) rows of a task, bucket after bucket in sequence-id order: in memory (one
    bucket) or as Parquet files in a spill folder, read again on every pass."""

    def __init__(self, frames: list[pl.DataFrame] | None = None, files: list[Path] | None = None):
        self._frames, self._files = frames, files
        self.sequence_ids: list[str] = []
        for frame in self.frames():
            self.sequence_ids.extend(frame["sequence_id"].unique(maintain_order=True).to_list())

    def __len__(self) -> int:
        return len(self._frames if self._frames is not None else self._files)

    def frames(self) -> Iterator[pl.DataFrame]:
        if self._frames is not None:
            yield from self._frames
        else:
            for path in self._files:
                yield pl.read_parquet(path)


def collect_parts(inp: TaskInput, task: Task, directory: Path, chunk_sequences: int = CHUNK_SEQUENCES,
                  progress: bool = True) -> ValueSequenceParts:
    """Step 1 of the module docstring: the S(k) of ``inp``'s sequences, by bucket, under ``directory``."""
    ids = inp.sequence_ids.sort()
    if ids.len() <= chunk_sequences:
        return ValueSequenceParts(frames=[value_sequences(inp.objects.collect(), task)])
    files = []
    chunks = sequence_chunks(inp.objects, ids, chunk_sequences, directory / "objects")
    for b, objects in enumerate(tqdm(chunks, total=-(-ids.len() // chunk_sequences), unit="chunk",
                                     desc=f"value sequences of {ids.len()} sequences", disable=not progress)):
        path = directory / f"value-sequences-{b:06d}.parquet"
        value_sequences(objects, task).write_parquet(path)
        files.append(path)
    return ValueSequenceParts(files=files)


def build_sequences(out: Path, task: TaskSpec, inp: TaskInput, split: str, seed: int, model_cfg: dict,
                    pretrained: str | None = None, ingest_date=None, chunk_sequences: int = CHUNK_SEQUENCES,
                    spill_dir: str | Path | None = None, progress: bool = True) -> dict:
    """The files of ``stage_sequences`` into ``out`` (``splits.parquet``, ``tokenizer.json``,
    ``windows.parquet``, ``task.json``, ``input.json``, ``stats.json``, and a next_item task's
    ``item_history.parquet``); returns the stats. ``spill_dir``: where the bucket folder goes
    (default: the system's temporary folder)."""
    if chunk_sequences < 1:
        raise ValueError(f"chunk_sequences must be >= 1, got {chunk_sequences}")
    with tempfile.TemporaryDirectory(prefix="seqenc-sequences-", dir=spill_dir) as tmp:
        parts = collect_parts(inp, task, Path(tmp), chunk_sequences, progress)
        sequence_ids = parts.sequence_ids
        if not sequence_ids:
            raise ValueError(f"task {task.name}: every key of source {task.source!r} is excluded (exclude_keys / "
                             "keep_keys); keep at least one")
        y = label_vector(sequence_ids, inp.labels, inp.classes, task)
        split_of = assign_splits(sequence_ids, y, split, seed, task, inp.objects, inp.groups, inp.given_splits)
        by_id = dict(zip(inp.labels["sequence_id"].to_list(), inp.labels["label"].cast(pl.String).to_list()))
        split_df = pl.DataFrame({"sequence_id": sequence_ids, "split": split_of,
                                 "label": [by_id.get(s) for s in sequence_ids]}, schema_overrides={"label": pl.String})
        split_df.write_parquet(out / "splits.parquet")

        train_ids = split_df["sequence_id"].filter(split_df["split"] == "train")
        n_sequences = len(sequence_ids)
        # the per-sequence lists (a week: 4.5M Python strings, ~400 MB) are done with; free them
        # before the tokenizer's fit, which holds the train ids and its word counts: with them
        # alive that step was a week build's peak (2,014 MB)
        del sequence_ids, split_of, by_id, split_df
        parts.sequence_ids = []
        tok = _fit_tokenizer(train_ids, parts, model_cfg, pretrained)
        tok.save(out / "tokenizer.json")
        del train_ids
        stats = _write_windows(out, parts, tok, model_cfg, task, inp.classes, progress)

    write_task(out, task, inp.classes)
    dates = None if ingest_date is None else sorted(
        storage.ingest_date_str(d) for d in (ingest_date if isinstance(ingest_date, (list, tuple)) else [ingest_date]))
    (out / "input.json").write_text(json.dumps({"source": task.source, "ingest_dates": dates}))
    stats = {**stats, "vocab_size": tok.vocab_size, "n_classes": len(inp.classes), "sequences": n_sequences,
             **inp.label_report}
    if task.kind_spec.ranks_items:  # a catalogue: how many items are ever a target, not one count each
        stats["distinct_targets"] = int((np.bincount(y, minlength=len(inp.classes)) > 0).sum())
    else:
        labelled = y[y >= 0]
        counts = np.bincount(labelled, minlength=len(inp.classes))
        stats["class_counts"] = {c: int(counts[i]) for i, c in enumerate(inp.classes)}
        if task.kind == "anomaly":
            stats["unlabelled"] = int((y < 0).sum())
    (out / "stats.json").write_text(json.dumps(stats, indent=2))
    return stats


def _fit_tokenizer(train: pl.Series, parts: ValueSequenceParts, model_cfg: dict, pretrained: str | None):
    """Step 3: the tokenizer from the S(k) rows of the ``train`` sequence ids (the vocabulary
    from the :func:`vocab_sample` of them), read bucket by bucket."""
    vocab = pl.Series(vocab_sample(train), dtype=pl.String).implode()
    train = train.implode()
    return fit_tokenizer(lambda: (vs.filter(pl.col("sequence_id").is_in(train)) for vs in parts.frames()),
                         model_cfg, pretrained,
                         lambda: (vs.filter(pl.col("sequence_id").is_in(vocab)) for vs in parts.frames()))


def _write_windows(out: Path, parts: ValueSequenceParts, tok, model_cfg: dict, task: Task, classes: list[str],
                   progress: bool) -> dict:
    """Step 4: every bucket tokenised and appended to ``windows.parquet`` (and, for next_item,
    ``item_history.parquet``); returns the summed tokenisation stats."""
    stats = dict.fromkeys(STAT_SUMS, 0)
    history = None
    with pq.ParquetWriter(out / "windows.parquet", WINDOWS_SCHEMA) as windows:
        for bucket in tqdm(parts.frames(), total=len(parts), desc="windows", unit="bucket",
                           disable=not progress or len(parts) == 1):
            for vs in sequence_slices(bucket, WINDOW_SEQUENCES):
                data = windows_of(vs, tok, model_cfg)
                windows.write_table(data.to_arrow())
                for name in STAT_SUMS:
                    stats[name] += data.stats[name]
                if task.kind_spec.ranks_items:
                    frame = item_history_frame(vs, data.sequence_ids, task, classes).to_arrow()
                    history = history or pq.ParquetWriter(out / "item_history.parquet", frame.schema)
                    history.write_table(frame)
    if history is not None:
        history.close()
    return stats
