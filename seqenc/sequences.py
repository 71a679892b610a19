"""Column-evolution value sequences S(k) (TVM-KA paper, Eq. 1-2), tokenised and windowed.

For every sequence (an HDFS block, a user session) and every key k seen in it, the values of k
in step order form V(k), and

    S(k) = [CLS] k [VAL_SEP] v1 [VAL_SEP] v2 [VAL_SEP] ... v_n

With value ends (``TVMKAConfig.value_end``, a tokenizer setting as value links) S(k) closes with
one more value, ``[VAL_SEP] [END]``. The paper's S(k) has no end: a sequence cut short (an HDFS
block whose events stop after ``E22 E5``) is then a plausible prefix of a normal one, and nothing
in it is surprising to the masked LM; with the end, "no more values after these two" is a
prediction the masked LM makes and can find surprising (seqenc.surprise).

An S(k) longer than the TVM window (``max_positions`` tokens) is handled by ``mode``:

* ``"window"`` (nothing is lost; the default before 2026-12-06): S(k) is cut into windows, each starting with the same
  prefix [CLS] k; values are packed whole (each with its [VAL_SEP]) into the current window, a
  value that does not fit opens the next window, and a single value longer than a whole window
  is split across windows. The windows are encoded as a batch and pooled into KR(k)
  (:func:`seqenc.model.pool_windows`). At most ``max_windows`` windows are kept per key (the
  most recent); values beyond that are counted and logged, never dropped silently.
* ``"balanced"`` (the default): as many windows as ``"window"`` makes, the values spread evenly
  over them, so the last window is never a short remainder (one value alone, read against nothing).
* ``"truncate"``: only the most recent values that fit in one window are kept; the number of
  dropped values is counted and logged.

The key's own tokens are capped at a quarter of the window so that values always have room.
"""

from __future__ import annotations

import logging
import math
import struct
import zlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from seqenc.config import LONG_SEQUENCES
from seqenc.links import repeat_flags, value_link_flags
from seqenc.tokenizer import ValueTokenizer

log = logging.getLogger(__name__)

# per catalogue item, what :func:`item_histories` computes and the next-item head reads (seqenc.heads)
HISTORY_FEATURES = ("log_count", "recency", "after_last")


def value_spans(window: list[int], val_sep_id: int) -> list[tuple[int, int]]:
    """``(start, end)`` of every value of a window: the tokens after each [VAL_SEP] up to the
    next one (``start == end`` for an empty value)."""
    seps = [i for i, t in enumerate(window) if t == val_sep_id] + [len(window)]
    return [(a + 1, b) for a, b in zip(seps, seps[1:])]


def value_sequence_windows(
    key_ids: list[int],
    values_ids: list[list[int]],
    cls_id: int,
    val_sep_id: int,
    max_len: int,
    mode: str = "balanced",
    max_windows: int = 64,
) -> tuple[list[list[int]], int]:
    """Token windows of S(k) and the number of values that did not make it in.

    ``mode``: "window" packs the values into windows greedily, so the last window holds what is
    left over -- sometimes one value alone; "balanced" makes as many windows as "window" and spreads
    the values evenly over them (each value by where its tokens start in S(k)), so that no window
    is a short remainder: a value alone in a window has no neighbours to be read against, and the
    masked LM, which rarely sees such a window, scores it as surprising (a gateway log whose
    S(node) ran to 3 windows, the last with one value: that value cost 9.7 nats, the others ~1.4;
    docs/model.md). A value longer than a whole window keeps the greedy windows; "truncate" keeps
    only the most recent values that fit one window."""
    prefix = [cls_id] + key_ids[: max(1, max_len // 4)]
    capacity = max_len - len(prefix)
    if capacity < 2:
        raise ValueError(f"max_len={max_len} leaves no room for values")
    units = [[val_sep_id] + v for v in values_ids]

    if mode == "truncate":
        kept, used = [], 0
        for unit in reversed(units):
            unit = unit[:capacity]  # a single over-long value keeps its first tokens
            if used + len(unit) > capacity:
                break
            kept.append(unit)
            used += len(unit)
        window = prefix + [t for unit in reversed(kept) for t in unit]
        return [window], len(units) - len(kept)
    if mode not in LONG_SEQUENCES:
        raise ValueError(f"unknown mode {mode!r}; choose from {LONG_SEQUENCES}")

    windows: list[list[int]] = []
    first_value_of_window: list[int] = []  # index of the first value each window holds
    current = list(prefix)
    current_first = 0
    for i, unit in enumerate(units):
        if len(current) + len(unit) > max_len and len(current) > len(prefix):
            windows.append(current)
            first_value_of_window.append(current_first)
            current, current_first = list(prefix), i
        while len(current) + len(unit) > max_len:  # a value longer than a whole window
            room = max_len - len(current)
            current += unit[:room]
            unit = unit[room:]
            windows.append(current)
            first_value_of_window.append(current_first)
            current, current_first = list(prefix), i
        current += unit
    if len(current) > len(prefix) or not windows:
        windows.append(current)
        first_value_of_window.append(current_first)
    if mode == "balanced" and len(windows) > 1 and max(map(len, units)) <= capacity:
        windows, first_value_of_window = _balanced(prefix, units, len(windows), capacity) or (
            windows, first_value_of_window)

    dropped = 0
    if len(windows) > max_windows:
        cut = len(windows) - max_windows
        dropped = first_value_of_window[cut]
        windows = windows[cut:]
    return windows, dropped


def _balanced(prefix: list[int], units: list[list[int]], n: int, capacity: int):
    """``n`` windows of ``prefix`` + units, unit i in window ``start_i * n // total`` (its first
    token's offset in S(k)); None when one of them would be empty or hold more than ``capacity``."""
    total = sum(map(len, units))
    groups: list[list[list[int]]] = [[] for _ in range(n)]
    start = 0
    for unit in units:
        groups[min(n - 1, start * n // total)].append(unit)
        start += len(unit)
    if any(not g or sum(map(len, g)) > capacity for g in groups):
        return None
    firsts = np.cumsum([0] + [len(g) for g in groups[:-1]]).tolist()
    return [prefix + [t for unit in g for t in unit] for g in groups], firsts


WINDOWS_SCHEMA = pa.schema([("sequence_id", pa.string()), ("key", pa.string()), ("input_ids", pa.list_(pa.int32()))])


@dataclass
class TokenizedSequences:
    """All windows of all S(k) of a set of sequences, flat, with the indexes to regroup them.

    ``windows[w]`` belongs to key row ``window_key[w]``; key row ``r`` is key ``keys[r]`` of
    sequence ``key_seq[r]``; the key rows of one sequence are contiguous and sorted by key.
    """

    sequence_ids: list[str]
    keys: list[str]
    key_seq: np.ndarray  # [n_key_rows] int64, index into sequence_ids
    windows: list[list[int]]
    window_key: np.ndarray  # [n_windows] int64, index into keys
    dropped_values: int = 0
    stats: dict = field(default_factory=dict)
    # next_item with item history (seqenc.heads): per sequence {item index: its features}, from
    # :func:`item_histories`; None where the model does not read it
    item_history: list[dict[int, tuple[float, ...]]] | None = None
    # the bags of values of :meth:`value_count_bags`, built on first use: ((n_buckets, val_sep_id), bags)
    _value_bags: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def n_sequences(self) -> int:
        return len(self.sequence_ids)

    def key_rows_of(self) -> np.ndarray:
        """[n_sequences + 1] offsets: the key rows of sequence i are offsets[i]:offsets[i+1]."""
        counts = np.bincount(self.key_seq, minlength=self.n_sequences)
        return np.concatenate([[0], np.cumsum(counts)])

    def subset(self, sequence_index: np.ndarray) -> TokenizedSequences:
        """The same data restricted to some sequences (in the given order)."""
        offsets = self.key_rows_of()
        key_rows = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in sequence_index]) \
            if len(sequence_index) else np.zeros(0, dtype=np.int64)
        new_key_index = {int(r): j for j, r in enumerate(key_rows)}
        seq_pos = {int(s): j for j, s in enumerate(sequence_index)}
        keep_windows = [w for w, r in enumerate(self.window_key) if int(r) in new_key_index]
        return TokenizedSequences(
            sequence_ids=[self.sequence_ids[i] for i in sequence_index],
            keys=[self.keys[r] for r in key_rows],
            key_seq=np.array([seq_pos[int(self.key_seq[r])] for r in key_rows], dtype=np.int64),
            windows=[self.windows[w] for w in keep_windows],
            window_key=np.array([new_key_index[int(self.window_key[w])] for w in keep_windows], dtype=np.int64),
            item_history=None if self.item_history is None else [self.item_history[i] for i in sequence_index],
        )

    def history_features(self, sequence_index: np.ndarray, n_items: int) -> torch.Tensor:
        """[B, n_items, len(HISTORY_FEATURES)] float32: the item-history features of some
        sequences, zero for an item a sequence never holds."""
        if self.item_history is None:
            raise ValueError("these sequences carry no item history: build it with seqenc.sequences.item_histories "
                             "(the model was trained with item_history)")
        out = torch.zeros(len(sequence_index), n_items, len(HISTORY_FEATURES))
        for b, i in enumerate(sequence_index):
            for item, features in self.item_history[int(i)].items():
                out[b, item] = torch.tensor(features)
        return out

    def value_count_bags(self, sequence_index: np.ndarray, n_buckets: int,
                         val_sep_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The bags of values of some sequences, as ``torch.nn.EmbeddingBag`` takes them:
        ``(buckets [N] int64, offsets [B] int64, weights [N] float32)``.

        A sequence's bag has one entry per bucket its values fall in: every value of every S(k)
        (the token ids between two [VAL_SEP], read from the windows, so exactly what the TVM
        reads, markers included: with value repeats a value's first occurrence, ``[NEW] v``, and
        its later ones, ``[SEEN] v``, are two pairs that still carry the count; values that did
        not fit the windows are not counted) is hashed with its key into ``n_buckets`` (CRC-32
        of the key's UTF-8, continued over the ids as little-endian int32: the same on every run
        and machine); the weight is log(1 + the number of values in the bucket). What the head
        of ``TVMKAConfig.value_counts`` reads (seqenc.heads). The bags of all sequences are built
        on the first call and kept."""
        if self._value_bags is None or self._value_bags[0] != (n_buckets, val_sep_id):
            self._value_bags = ((n_buckets, val_sep_id), self._build_value_bags(n_buckets, val_sep_id))
        chosen = [self._value_bags[1][int(i)] for i in sequence_index]
        lengths = np.array([len(b) for b, _ in chosen], dtype=np.int64)
        offsets = np.cumsum(lengths) - lengths  # where each bag starts
        buckets = np.concatenate([b for b, _ in chosen] or [np.zeros(0, np.int64)])
        weights = np.concatenate([w for _, w in chosen] or [np.zeros(0, np.float32)])
        return torch.as_tensor(buckets), torch.as_tensor(offsets), torch.as_tensor(weights)

    def _build_value_bags(self, n_buckets: int, val_sep_id: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per sequence (buckets, log(1 + counts)) of :meth:`value_count_bags`."""
        values_of_row: list[Counter] = [Counter() for _ in self.keys]
        for window, row in zip(self.windows, self.window_key):
            values_of_row[row].update(tuple(window[a:b]) for a, b in value_spans(window, val_sep_id))
        counts: list[Counter] = [Counter() for _ in range(self.n_sequences)]
        key_hash: dict[str, int] = {}
        for row, values in enumerate(values_of_row):
            key = self.keys[row]
            if key not in key_hash:
                key_hash[key] = zlib.crc32(key.encode())
            bag = counts[self.key_seq[row]]
            for tokens, n in values.items():
                bag[zlib.crc32(struct.pack(f"<{len(tokens)}i", *tokens), key_hash[key]) % n_buckets] += n
        return [(np.fromiter(bag.keys(), np.int64, len(bag)), np.log1p(np.fromiter(bag.values(), np.float32, len(bag))))
                for bag in counts]

    # --- Parquet, one row per window -------------------------------------------------------------
    def write_parquet(self, path) -> None:
        pq.write_table(self.to_arrow(), path)

    def to_arrow(self) -> pa.Table:
        """One row per window: ``sequence_id``, ``key``, ``input_ids`` (what :meth:`read_parquet` reads)."""
        return pa.table({
            "sequence_id": [self.sequence_ids[self.key_seq[r]] for r in self.window_key],
            "key": [self.keys[r] for r in self.window_key],
            "input_ids": self.windows,
        }, schema=WINDOWS_SCHEMA)

    @classmethod
    def read_parquet(cls, path) -> TokenizedSequences:
        df = pl.read_parquet(path)
        sequence_ids, keys, key_seq, window_key = index_windows(df["sequence_id"].to_list(), df["key"].to_list())
        return cls(sequence_ids, keys, key_seq, [list(w) for w in df["input_ids"].to_list()], window_key)


def index_windows(seq_ids: list[str], keys: list[str]) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    """The index of the windows file's rows (``sequence_id`` and ``key`` per window, in file order:
    the rows of one sequence contiguous, and those of one key row): ``(sequence_ids, keys,
    key_seq, window_key)`` as :class:`TokenizedSequences` holds them."""
    sequence_ids: list[str] = []
    seq_index: dict[str, int] = {}
    key_rows: dict[tuple[str, str], int] = {}
    out_keys, key_seq, window_key = [], [], []
    for s, k in zip(seq_ids, keys):
        if s not in seq_index:
            seq_index[s] = len(sequence_ids)
            sequence_ids.append(s)
        if (s, k) not in key_rows:
            key_rows[(s, k)] = len(out_keys)
            out_keys.append(k)
            key_seq.append(seq_index[s])
        window_key.append(key_rows[(s, k)])
    return sequence_ids, out_keys, np.array(key_seq, dtype=np.int64), np.array(window_key, dtype=np.int64)


def with_event_key(objects: pl.DataFrame) -> pl.DataFrame:
    """Add one ``event`` row per object carrying its template id as ``E<id>``."""
    events = (
        objects.filter(pl.col("template_id").is_not_null())
        .unique(["sequence_id", "step"], keep="first", maintain_order=True)
        .with_columns(pl.lit("event").alias("key"), ("E" + pl.col("template_id").cast(pl.String)).alias("value"))
    )
    return pl.concat([objects, events.select(objects.columns)])


def collect_value_sequences(objects: pl.DataFrame, exclude_keys: tuple[str, ...] = ()) -> pl.DataFrame:
    """Long-form objects -> one row per (sequence_id, key) with ``values``, V(k) in step order."""
    return (
        objects.filter(~pl.col("key").is_in(list(exclude_keys)))
        .sort(["sequence_id", "step"])
        .group_by(["sequence_id", "key"], maintain_order=True)
        .agg(pl.col("value"))
        .sort(["sequence_id", "key"])
        .rename({"value": "values"})
    )


def item_histories(value_sequences: pl.DataFrame, sequence_ids: list[str], item_key: str,
                   items: list[str]) -> list[dict[int, tuple[float, float, float]]]:
    """Per sequence of ``sequence_ids`` (rows of :func:`collect_value_sequences`): for every
    catalogue item among its values of ``item_key`` the features of :data:`HISTORY_FEATURES`,
    ``(log(1 + count), recency, log(1 + after_last))``: recency ``(p + 1) / n`` for its last
    occurrence at p of n values (1.0: the latest value), after_last how often it came directly
    after an occurrence of the sequence's last value. Values that are no catalogue item are left
    out; a sequence without the key gets {}."""
    index = {item: i for i, item in enumerate(items)}
    rows = value_sequences.filter(pl.col("key") == item_key)
    values_of = dict(zip(rows["sequence_id"].to_list(), rows["values"].to_list()))
    out = []
    for seq in sequence_ids:
        values = values_of.get(seq) or []
        counts: dict[int, int] = {}
        last: dict[int, int] = {}
        after_last: dict[int, int] = {}
        for p, v in enumerate(values):
            i = index.get(v)
            if i is None:
                continue
            counts[i] = counts.get(i, 0) + 1
            last[i] = p
            if p and values[p - 1] == values[-1]:
                after_last[i] = after_last.get(i, 0) + 1
        out.append({i: (math.log1p(c), (last[i] + 1) / len(values), math.log1p(after_last.get(i, 0)))
                    for i, c in counts.items()})
    return out


def tokenize_value_sequences(
    value_sequences: pl.DataFrame,
    tokenizer: ValueTokenizer,
    max_len: int,
    mode: str = "balanced",
    max_windows: int = 64,
) -> TokenizedSequences:
    """Build and tokenise every S(k); the rows must be sorted by (sequence_id, key). A tokenizer
    with value links (seqenc.links) marks every value linked / alone within its sequence, one
    with value repeats every value seen before in S(k) / new."""
    seq_col = value_sequences["sequence_id"].to_list()
    key_col = value_sequences["key"].to_list()
    values_col = value_sequences["values"].to_list()
    links_col = value_link_flags(value_sequences) if tokenizer.value_links else [None] * len(key_col)
    key_tokens = dict(zip(dict.fromkeys(key_col), tokenizer.encode_many(list(dict.fromkeys(key_col)))))
    all_values = [v for vs in values_col for v in vs]
    tokenizer.encode_many(all_values)  # fill the cache in one batched call

    sequence_ids: list[str] = []
    key_seq, windows, window_key = [], [], []
    dropped = 0
    for row, (seq, key, values, linked) in enumerate(zip(seq_col, key_col, values_col, links_col)):
        if not sequence_ids or sequence_ids[-1] != seq:
            sequence_ids.append(seq)
        key_seq.append(len(sequence_ids) - 1)
        seen = repeat_flags(values) if tokenizer.value_repeats else None
        values_ids = tokenizer.encode_values(key, values, linked, seen)
        if tokenizer.value_end:
            values_ids.append([tokenizer.end_id])
        w, d = value_sequence_windows(key_tokens[key], values_ids, tokenizer.cls_id, tokenizer.val_sep_id,
                                      max_len, mode, max_windows)
        windows.extend(w)
        window_key.extend([row] * len(w))
        dropped += d
    n_values = len(all_values)
    if dropped:
        log.warning("%d of %d values did not fit (mode=%s, max_len=%d, max_windows=%d)",
                    dropped, n_values, mode, max_len, max_windows)
    stats = {"sequences": len(sequence_ids), "keys": len(key_col), "windows": len(windows),
             "values": n_values, "dropped_values": dropped,
             "tokens": int(sum(len(w) for w in windows))}
    log.info("value sequences: %s", stats)
    return TokenizedSequences(sequence_ids, key_col, np.array(key_seq, dtype=np.int64), windows,
                              np.array(window_key, dtype=np.int64), dropped, stats)
