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

**Several data-parallel ranks** (:class:`Ranks`: ``seqenc train --deepspeed`` with WORLD_SIZE > 1)
divide steps 1 and 4, the costly ones: rank ``r`` takes the ``r``-th contiguous range of the
sorted ids, builds its S(k) (step 1, reading only its sequences' objects) and later tokenises
them (step 4), each into a folder of its own under a scratch folder the ranks share. Rank 0 does
steps 2 and 3 over every rank's S(k) (the split and the vocabulary need all train sequences) and
at the end appends the ranks' windows in rank order -- the ranges are contiguous, so the files
equal one rank's. The others wait at the barriers between the steps.
What reads the files afterwards (training) loads the windows it trains on; a task's
``max_sequences`` bounds that.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Ranks:
    """This process's place among data-parallel ranks that build one task's files together:
    ``barrier`` waits for every rank; ``scratch`` is a folder every rank sees (under the work
    directory), empty when the build starts."""

    rank: int
    world: int
    barrier: Callable[[], None]
    scratch: Path


def collect_parts(inp: TaskInput, task: Task, directory: Path, chunk_sequences: int = CHUNK_SEQUENCES,
                  progress: bool = True, ids: pl.Series | None = None, spill: bool = False) -> ValueSequenceParts:
    """Step 1 of the module docstring: the S(k) of ``inp``'s sequences (``ids``, sorted: only
    those), by bucket, under ``directory``; ``spill``: as files even when one bucket holds them."""
    objects = inp.objects if ids is None else inp.objects.filter(pl.col("sequence_id").is_in(ids.implode()))
    ids = inp.sequence_ids.sort() if ids is None else ids
    if ids.len() == 0:  # a rank with no sequences (fewer sequences than ranks)
        return ValueSequenceParts(files=[])
    if ids.len() <= chunk_sequences and not spill:
        return ValueSequenceParts(frames=[value_sequences(objects.collect(), task)])
    files = []
    chunks = sequence_chunks(objects, ids, chunk_sequences, directory / "objects")
    for b, objects in enumerate(tqdm(chunks, total=-(-ids.len() // chunk_sequences), unit="chunk",
                                     desc=f"value sequences of {ids.len()} sequences", disable=not progress)):
        path = directory / f"value-sequences-{b:06d}.parquet"
        value_sequences(objects, task).write_parquet(path)
        files.append(path)
    return ValueSequenceParts(files=files)


def build_sequences(out: Path, task: TaskSpec, inp: TaskInput, split: str, seed: int, model_cfg: dict,
                    pretrained: str | None = None, ingest_date=None, chunk_sequences: int = CHUNK_SEQUENCES,
                    spill_dir: str | Path | None = None, progress: bool = True, ranks: Ranks | None = None) -> dict:
    """The files of ``stage_sequences`` into ``out`` (``splits.parquet``, ``tokenizer.json``,
    ``windows.parquet``, ``task.json``, ``input.json``, ``stats.json``, and a next_item task's
    ``item_history.parquet``); returns the stats. ``spill_dir``: where the bucket folder goes
    (default: the system's temporary folder). With ``ranks`` of world > 1 every rank calls it
    (``out`` is rank 0's; the others write only under ``ranks.scratch``) and only rank 0's
    return value is the stats (module docstring)."""
    if chunk_sequences < 1:
        raise ValueError(f"chunk_sequences must be >= 1, got {chunk_sequences}")
    if ranks is not None and ranks.world > 1:
        return _build_ranked(out, task, inp, split, seed, model_cfg, pretrained, ingest_date, chunk_sequences,
                             progress, ranks)
    with tempfile.TemporaryDirectory(prefix="seqenc-sequences-", dir=spill_dir) as tmp:
        parts = collect_parts(inp, task, Path(tmp), chunk_sequences, progress)
        tok, n_sequences, y = _split_and_vocabulary(out, task, inp, split, seed, model_cfg, pretrained, parts)
        stats = _write_windows(out, parts, tok, model_cfg, task, inp.classes, progress)
    return _finish(out, task, inp, ingest_date, tok, n_sequences, y, stats)


def _split_and_vocabulary(out: Path, task: TaskSpec, inp: TaskInput, split: str, seed: int, model_cfg: dict,
                          pretrained: str | None, parts: ValueSequenceParts):
    """Steps 2 and 3: ``splits.parquet`` and ``tokenizer.json`` into ``out``; returns the
    tokenizer, the number of sequences and their label vector."""
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
    return tok, n_sequences, y


def _finish(out: Path, task: TaskSpec, inp: TaskInput, ingest_date, tok, n_sequences: int, y: np.ndarray,
            stats: dict) -> dict:
    """``task.json``, ``input.json`` and ``stats.json``; returns the stats."""
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


def _build_ranked(out: Path, task: TaskSpec, inp: TaskInput, split: str, seed: int, model_cfg: dict,
                  pretrained: str | None, ingest_date, chunk_sequences: int, progress: bool, ranks: Ranks) -> dict:
    """:func:`build_sequences` divided between ``ranks`` (module docstring)."""
    from seqenc.tokenizer import ValueTokenizer

    r, world = ranks.rank, ranks.world
    mine_dir = ranks.scratch / f"rank-{r}"
    mine_dir.mkdir(parents=True, exist_ok=True)
    ids = inp.sequence_ids.sort()
    per = -(-ids.len() // world)
    t0 = time.perf_counter()
    mine = collect_parts(inp, task, mine_dir, chunk_sequences, progress and r == 0, ids=ids.slice(r * per, per),
                         spill=True)  # step 1 on this rank's id range, into files rank 0 reads
    work = {"rank": r, "sequences": len(mine.sequence_ids), "value_sequence_seconds": time.perf_counter() - t0}
    ranks.barrier()
    if r == 0:  # steps 2 and 3 over every rank's S(k), in rank order = sorted id order
        every = ValueSequenceParts(files=[f for q in range(world)
                                          for f in sorted((ranks.scratch / f"rank-{q}").glob("value-sequences-*.parquet"))])
        tok, n_sequences, y = _split_and_vocabulary(out, task, inp, split, seed, model_cfg, pretrained, every)
        tok.save(ranks.scratch / "tokenizer.json")
    ranks.barrier()
    tok = ValueTokenizer.from_file(ranks.scratch / "tokenizer.json")
    t0 = time.perf_counter()
    stats = _write_windows(mine_dir, mine, tok, model_cfg, task, inp.classes, progress and r == 0)  # step 4
    work.update(windows=stats["windows"], window_seconds=time.perf_counter() - t0)
    (mine_dir / "stats.json").write_text(json.dumps({"stats": stats, "work": work}))
    ranks.barrier()
    if r != 0:
        return {}
    done = [json.loads((ranks.scratch / f"rank-{q}" / "stats.json").read_text()) for q in range(world)]
    for name in ("windows.parquet", "item_history.parquet"):
        _concatenate([ranks.scratch / f"rank-{q}" / name for q in range(world)], out / name)
    stats = {k: sum(d["stats"][k] for d in done) for k in STAT_SUMS}
    result = _finish(out, task, inp, ingest_date, tok, n_sequences, y, stats)
    result["build_ranks"] = [d["work"] for d in done]  # what each rank built (stats.json holds it too)
    (out / "stats.json").write_text(json.dumps(result, indent=2))
    log.info("value sequences built by %d ranks: %s", world, result["build_ranks"])
    shutil.rmtree(ranks.scratch, ignore_errors=True)
    return result


def _concatenate(files: list[Path], path: Path) -> None:
    """The Parquet ``files`` that exist, one after the other, into ``path`` (none: nothing written)."""
    files = [f for f in files if f.exists()]
    if not files:
        return
    with pq.ParquetWriter(path, pq.read_schema(files[0])) as writer:
        for f in files:
            source = pq.ParquetFile(f)
            for g in range(source.num_row_groups):
                writer.write_table(source.read_row_group(g))


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
