"""What one data-parallel rank reads of a task's value sequences: the index of every sequence,
and the windows of its own share of the sequences only.

The windows (the token ids of every S(k) window: nearly all of ``windows.parquet``'s bytes) are
the data of the TVM-KA trainers. Under DeepSpeed with several ranks
(training.engine.engines.data_parallel), rank ``r`` of ``W`` reads (:meth:`RankShare.read`):

* **the index** of every row -- the ``sequence_id`` and ``key`` columns only -- which gives every
  sequence's key rows (``TokenizedSequences`` without windows: reading them raises). The KA steps,
  the KR standardisation and the evaluation work on key rows (the KRs of any sequence, gathered
  after every refresh), so every rank needs the index of all;
* **the windows of its share**: a contiguous range of the file's sequences (the build writes a
  sequence's rows together), cut so that each rank holds about ``1/W`` of the windows (the unit of
  every cost below). Only the Parquet row groups that hold the range are read (pyarrow).

What each part of training then reads (training.engine.trainer, training.engine.unlabelled):

* masked-LM batches: each rank draws its own from its share's train windows, ``batch_tokens / W``
  tokens each (seed + rank), as torch's DistributedSampler divides a data set; together they are
  one batch of the configured size, and DeepSpeed averages the gradients;
* the KR refresh: each rank encodes the distinct windows it owns (training.engine.sharding:
  a window that several ranks hold is encoded once, by one of them), gathers them, pools its own
  key rows and gathers the KRs of all;
* the KA steps: as before, every rank draws the same batch of sequences and reads its rows
  ``rank::W`` from the gathered KRs; the bags of values (``value_counts``) each rank builds for its
  share and gathers once (:meth:`RankShare.gather_value_bags`);
* the surprise and the novel values: each rank reads its own sequences, then all are gathered.

One rank (``W == 1``, every run without DeepSpeed) reads the whole file: index and share are the
same object, and every path is the one-process one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from seqenc.novel_values import NovelValues, key_value_sets
from seqenc.sequences import TokenizedSequences, index_windows
from training.engine.collectives import gather_concat


class NotHeld:
    """The windows a rank does not hold (the index's ``windows``): any read is an error that
    says where they are, never an empty list that would make a silent zero."""

    def _fail(self, *args):
        raise RuntimeError("this data-parallel rank holds only its share of the windows "
                           "(training.engine.rank_share: RankShare.local); the index of every sequence has none")

    __iter__ = __getitem__ = __len__ = _fail


def share_bounds(windows_per_sequence: np.ndarray, world: int) -> np.ndarray:
    """[world + 1] sequence indexes: rank ``r`` holds the sequences ``bounds[r]:bounds[r + 1]``,
    contiguous, each rank at least one, the cuts where the running window count is nearest to
    ``r / world`` of all."""
    n = len(windows_per_sequence)
    if n < world:
        raise ValueError(f"{n} sequences cannot be shared by {world} data-parallel ranks: use fewer ranks")
    running = np.concatenate([[0], np.cumsum(windows_per_sequence)])
    cuts = [int(np.abs(running - running[-1] * r / world).argmin()) for r in range(1, world)]
    bounds = [0]
    for r, cut in enumerate(cuts, start=1):
        bounds.append(min(max(cut, bounds[-1] + 1), n - (world - r)))
    return np.array(bounds + [n], dtype=np.int64)


@dataclass
class RankShare:
    """``index``: every sequence's key rows (windows :class:`NotHeld` when ``world`` > 1);
    ``local``: the sequences ``start:start + local.n_sequences`` of the index, with their
    windows; the local key rows are the index's ``key_row_start:`` onwards, in the same order."""

    index: TokenizedSequences
    local: TokenizedSequences
    start: int = 0
    key_row_start: int = 0
    rank: int = 0
    world: int = 1

    @property
    def stop(self) -> int:
        return self.start + self.local.n_sequences

    def local_of(self, sequences: np.ndarray) -> np.ndarray:
        """Those of ``sequences`` (indexes into the index) that are this rank's, as indexes into
        ``local``, in the given order."""
        s = np.asarray(sequences, dtype=np.int64)
        return s[(s >= self.start) & (s < self.stop)] - self.start

    def local_part(self, sequences: np.ndarray) -> TokenizedSequences:
        """The windows of those of ``sequences`` (indexes into the index) that are this rank's, in
        the given order: ``local`` itself when they are all of it, in order."""
        mine = self.local_of(sequences)
        return self.local if np.array_equal(mine, np.arange(self.local.n_sequences)) else self.local.subset(mine)

    @classmethod
    def whole(cls, data: TokenizedSequences) -> RankShare:
        return cls(data, data)

    @classmethod
    def of(cls, data: TokenizedSequences, rank: int, world: int) -> RankShare:
        """The share of ``data`` (already read whole, as the benches hold it) that rank ``rank``
        trains on: the same cut as :meth:`read`."""
        if world == 1:
            return cls.whole(data)
        bounds = share_bounds(np.bincount(data.key_seq[data.window_key], minlength=data.n_sequences), world)
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        local = data.subset(np.arange(lo, hi))
        index = replace(data, windows=NotHeld(), window_key=np.zeros(0, dtype=np.int64), _value_bags=None)
        return cls(index, local, lo, int(data.key_rows_of()[lo]), rank, world)

    @classmethod
    def read(cls, path, rank: int, world: int) -> RankShare:
        """Rank ``rank``'s share of the windows file ``path`` (module docstring)."""
        if world == 1:
            return cls.whole(TokenizedSequences.read_parquet(path))
        names = pl.read_parquet(path, columns=["sequence_id", "key"])
        sequence_ids, keys, key_seq, window_key = index_windows(names["sequence_id"].to_list(),
                                                                names["key"].to_list())
        row_seq = key_seq[window_key]
        if np.any(np.diff(row_seq) < 0):
            raise ValueError(f"{path}: the rows of a sequence are not together; rebuild the value sequences "
                             "(seqenc train builds them so)")
        bounds = share_bounds(np.bincount(row_seq, minlength=len(sequence_ids)), world)
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        first, last = np.searchsorted(row_seq, [lo, hi])
        rows = _read_rows(pq.ParquetFile(path), int(first), int(last))
        local_ids, local_keys, local_key_seq, local_window_key = index_windows(
            rows.column("sequence_id").to_pylist(), rows.column("key").to_pylist())
        key_row_start = int(np.searchsorted(key_seq, lo))
        if local_ids != sequence_ids[lo:hi] or local_keys != keys[key_row_start:key_row_start + len(local_keys)]:
            raise RuntimeError(f"{path} changed while rank {rank} read it")
        local = TokenizedSequences(local_ids, local_keys, local_key_seq,
                                   [list(w) for w in rows.column("input_ids").to_pylist()], local_window_key)
        index = TokenizedSequences(sequence_ids, keys, key_seq, NotHeld(), np.zeros(0, dtype=np.int64))
        return cls(index, local, lo, key_row_start, rank, world)

    # --- what the ranks gather -------------------------------------------------------------------
    def gather_value_bags(self, n_buckets: int, val_sep_id: int) -> None:
        """Every sequence's bag of values (TokenizedSequences.value_count_bags) on the index: each
        rank builds its share's, then all gather (collective: every rank calls it)."""
        if self.world == 1:
            return
        bags = self.local._build_value_bags(n_buckets, val_sep_id)
        lengths = gather_concat(np.array([len(b) for b, _ in bags], dtype=np.int64), self.world)
        buckets = gather_concat(np.concatenate([b for b, _ in bags] or [np.zeros(0, np.int64)]), self.world)
        weights = gather_concat(np.concatenate([w for _, w in bags] or [np.zeros(0, np.float32)]), self.world)
        ends = np.cumsum(lengths)
        self.index._value_bags = ((n_buckets, val_sep_id), [(buckets[e - n:e], weights[e - n:e])
                                                            for e, n in zip(ends, lengths)])

    def novel_values(self, fit: np.ndarray, vocabulary: np.ndarray, key: str, val_sep_id: int,
                     skip: frozenset[int]) -> tuple[NovelValues | None, np.ndarray | None]:
        """seqenc.novel_values over every sequence (``fit`` and ``vocabulary``: indexes into the
        index): the fitted values, and how many each sequence holds ([n_sequences]); each rank
        reads its own sequences' values, then the sets and counts are gathered (collective)."""
        if self.world == 1:
            novel = NovelValues.fit(self.local, fit, vocabulary, key, val_sep_id, skip)
            return novel, None if novel is None else novel.counts(self.local)
        fitted, known = key_value_sets(self.local, self.local_of(fit), self.local_of(vocabulary), key, val_sep_id,
                                       skip)
        fitted = set(gather_concat(np.array(sorted(fitted), dtype=np.int64), self.world).tolist())
        known = set(gather_concat(np.array(sorted(known), dtype=np.int64), self.world).tolist())
        novel = NovelValues.from_sets(key, val_sep_id, skip, fitted, known)
        counts = None if novel is None else gather_concat(novel.counts(self.local), self.world)
        return novel, counts


def _read_rows(parquet: pq.ParquetFile, first: int, last: int) -> pa.Table:
    """Rows ``first:last`` of a Parquet file, reading only the row groups that hold them."""
    groups, start, offset = [], 0, None
    for g in range(parquet.metadata.num_row_groups):
        n = parquet.metadata.row_group(g).num_rows
        if start < last and start + n > first:
            groups.append(g)
            offset = start if offset is None else offset
        start += n
    if not groups:
        return parquet.schema_arrow.empty_table()
    return parquet.read_row_groups(groups).slice(first - offset, last - first)
