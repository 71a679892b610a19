"""Novel values: a value the training data holds but the sequences the model learned never do.

The masked LM scores how surprising each value is given its neighbours. In DeepLog's setting
(the model learns the sequences a user marks as normal) some anomalies are plainer than that:
they hold an event the normal sequences never hold. On bgl, 11-12 of the 89-90 event types of
the train windows occur only in alert windows; no normal dev or test window holds one, and
78-100 % of the alert windows do (seeds 0-2, dev and test). On hdfs, 14 of 28 events occur only
in anomalous train blocks; no normal block holds one, 31-44 % of the anomalous blocks do. To the
masked LM such an event is one more rare value, as surprising as a rare parameter of a normal
line, so the surprise ranked bgl's dev windows at ROC AUC 0.964 and flagged normal windows first
at strict thresholds (docs/training.md, "Novel values").

DeepLog flags a log key it never saw in normal execution. :class:`NovelValues` does the same for
the values of one key (``"event"``: the template id of each log line, seqenc.sequences.
with_event_key): the values that the *vocabulary* sequences hold (every train sequence,
labelled or not) and the *fitted* sequences (those the masked LM learned) never do. A value
seen in neither is not one of them: a value new to all of train is the surprise's to judge (an
unseen event column scored normal windows with rare events as anomalous: ROC AUC 0.984 against
0.999 for loglizer's PCA on train's columns, bgl dev). When the masked LM learns every train
sequence the two sets are equal and nothing is novel.

Values are read from the tokenised windows exactly as the TVM reads them (seqenc.sequences.
value_spans: the token ids between two [VAL_SEP], link and repeat markers and [END] dropped), as
a CRC-32 of their ids, so training and scoring count the same thing without the raw objects.
seqenc.surprise.SurpriseScorer adds a sequence's novel values as a line of its own, above every
tail score (``NOVEL_SCORE``). The set is JSON in the bundle's metadata, nothing pickled.
"""

from __future__ import annotations

import struct
import zlib
from collections import Counter
from dataclasses import dataclass

import numpy as np

from seqenc.sequences import TokenizedSequences, value_spans

NOVEL_KEY = "event"  # the key a log task reads: the line's template id (seqenc.sequences.with_event_key)


def value_hash(tokens: tuple[int, ...]) -> int:
    """A value's token ids as one int (CRC-32 of little-endian int32): the same on every machine."""
    return zlib.crc32(struct.pack(f"<{len(tokens)}i", *tokens))


def skipped_ids(tok) -> frozenset[int]:
    """The token ids a value is read without: link and repeat markers and [END]."""
    kinds = tok.marker_kinds
    return kinds["link"] | kinds["repeat"] | frozenset([tok.end_id] if tok.end_id is not None else [])


def key_value_counts(data: TokenizedSequences, key: str, val_sep_id: int,
                     skip: frozenset[int] = frozenset()) -> list[Counter]:
    """Per sequence, how often each value of ``key`` occurs (as :func:`value_hash` of its tokens
    less ``skip``: a value's link or repeat marker does not make it another value, and the
    closing [END] is no value)."""
    counts = [Counter() for _ in range(data.n_sequences)]
    for window, row in zip(data.windows, data.window_key):
        if data.keys[row] != key:
            continue
        bag = counts[data.key_seq[row]]
        for a, b in value_spans(window, val_sep_id):
            tokens = tuple(t for t in window[a:b] if t not in skip)
            if tokens:
                bag[value_hash(tokens)] += 1
    return counts


def key_value_sets(data: TokenizedSequences, fit: np.ndarray, vocabulary: np.ndarray, key: str, val_sep_id: int,
                   skip: frozenset[int] = frozenset()) -> tuple[set[int], set[int]]:
    """(the values of ``key`` that the ``fit`` sequences hold, those the ``vocabulary`` ones hold),
    as :func:`value_hash` ints; both index ``data``."""
    counts = key_value_counts(data, key, val_sep_id, skip)
    fitted = set().union(*(counts[i] for i in np.asarray(fit, dtype=np.int64)))
    known = set().union(*(counts[i] for i in np.asarray(vocabulary, dtype=np.int64)))
    return fitted, known


@dataclass
class NovelValues:
    """The values of ``key`` that the vocabulary sequences hold and the fitted ones never do
    (module docstring), as :func:`value_hash` ints."""

    key: str
    val_sep_id: int
    skip: list[int]
    values: list[int]

    @classmethod
    def fit(cls, data: TokenizedSequences, fit: np.ndarray, vocabulary: np.ndarray, key: str, val_sep_id: int,
            skip: frozenset[int] = frozenset()) -> NovelValues | None:
        """From the ``vocabulary`` and ``fit`` sequences (indexes into ``data``). None when the
        key has no values in the fitted sequences (a task without it: nothing to compare)."""
        return cls.from_sets(key, val_sep_id, skip, *key_value_sets(data, fit, vocabulary, key, val_sep_id, skip))

    @classmethod
    def from_sets(cls, key: str, val_sep_id: int, skip: frozenset[int], fitted: set[int],
                  known: set[int]) -> NovelValues | None:
        """From the values the fitted sequences hold and those the vocabulary holds
        (:func:`key_value_sets`; each possibly gathered from several data-parallel ranks)."""
        if not fitted:
            return None
        return cls(key, int(val_sep_id), sorted(int(t) for t in skip), sorted(int(v) for v in known - fitted))

    def counts(self, data: TokenizedSequences) -> np.ndarray:
        """[n_sequences] how many novel values each sequence of ``data`` holds."""
        novel = set(self.values)
        bags = key_value_counts(data, self.key, self.val_sep_id, frozenset(self.skip))
        return np.array([sum(n for v, n in bag.items() if v in novel) for bag in bags], dtype=np.float64)

    def to_dict(self) -> dict:
        return {"key": self.key, "val_sep_id": self.val_sep_id, "skip": self.skip, "values": self.values}

    @classmethod
    def from_dict(cls, d: dict) -> NovelValues:
        missing = [f for f in ("key", "val_sep_id", "skip", "values") if f not in d]
        if missing:
            raise ValueError(f"the novel values in this bundle lack {', '.join(missing)}: retrain the model")
        return cls(str(d["key"]), int(d["val_sep_id"]), [int(t) for t in d["skip"]], [int(v) for v in d["values"]])
