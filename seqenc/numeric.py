"""Quantile-bin tokens for numeric values, so that S(k) carries a number's magnitude.

WordPiece cuts a number into pieces (``117735484`` -> ``117 735 484``): the pieces say which
digits occur, not how large the number is next to the key's other values, and a size above
HDFS's 64 MiB block size looks like any other size. For every key whose values are numbers,
:class:`NumericBins` learns quantile edges on the train split, and the tokenizer
(:meth:`seqenc.tokenizer.ValueTokenizer.encode_values`) puts one bin token before each numeric
value's pieces::

    S(size) = [CLS] size [VAL_SEP] [NUM_5] 671 088 64 [VAL_SEP] [NUM_6] 117 735 484 ...

Choices (the TVM-KA paper treats values as text and says nothing about numbers):

* a key is numeric when at least ``MIN_NUMERIC_SHARE`` of its train values (and at least
  ``MIN_VALUES`` of them) parse as finite decimal numbers; its other values get no bin token;
* the edges are the *distinct* values among the quantiles 0, 1/n, ..., 1 of the key's train
  values, and bin i is the right-closed interval (e[i-1], e[i]] (bin 0: values <= e[0]). A value
  that fills many quantiles, such as the 64 MiB block size, is one edge, so what lies just above
  it gets a bin of its own;
* a value outside the train range takes the nearest extreme bin: it is at least as extreme as
  the most extreme value seen in training, and every bin token the model meets was trained;
* the bin tokens ``[NUM_0]`` .. ``[NUM_n]`` are shared by all keys (the key at the start of
  S(k) says whose bins they are); they are added to the vocabulary as unsplittable tokens but
  are not special: MLM masks and predicts them like any value token.

Off by default (``TVMKAConfig.numeric_bins = 0``); ``numeric_bins=16`` turns it on. Measured before
the protocol of docs/benchmarks.md (test splits that also chose) on ``value_anomaly`` (interleaved, bench settings, seeds 0 / 1 / 2, each seed its own generated
data): test F1 0.545 / 0.591 / 0.222 with 16 bins (mean 0.453), 0.471 / 0.423 / 0.261 without
(mean 0.385, the bench's runs) -- a difference well inside the spread between seeds. (An
earlier note compared with 0.723 / 0.476 for seeds 1 / 2 "without": those runs had a scratch
bin-word transform on, so they were runs *with* bins.) The bin token makes an ``oversize`` size
explicit in S(size); with value links on as well (seqenc.links) the KA found 20 of the 27
oversize test blocks of the three seeds (14 with neither). The edges are saved as ``numeric_bins.json`` beside
``tokenizer.json``.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np

MIN_NUMERIC_SHARE = 0.95
MIN_VALUES = 10
# numbers per key that fit the edges: below it the quantiles are exact; above it BinFitter keeps
# an evenly thinned sample (every 2nd, then 4th, ... value in train order), so fitting the bins
# of a week of logs takes bounded memory (8 MB per numeric key). Chosen, not tuned: a
# quantile's rank error from a 500,000-value sample is about 1e-3, far inside one of 16 bins.
MAX_FIT_VALUES = 1_000_000
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def bin_token(i: int) -> str:
    return f"[NUM_{i}]"


def as_number(value: str) -> float | None:
    """The value as a finite float, or None when it is not a plain decimal number."""
    if not _NUMBER.fullmatch(value.strip()):
        return None
    x = float(value)
    return x if math.isfinite(x) else None


class NumericBins:
    """Per-key quantile edges; :meth:`bin_of` maps a (key, value) to a bin index or None."""

    def __init__(self, n_bins: int, edges: dict[str, list[float]]):
        if n_bins < 1:
            raise ValueError(f"n_bins={n_bins} must be >= 1")
        self.n_bins = n_bins
        self.edges = {k: np.asarray(e, dtype=np.float64) for k, e in edges.items()}

    @property
    def tokens(self) -> list[str]:
        """Every bin token; n_bins + 1 edges give at most n_bins + 1 bins (bin 0 holds the minimum)."""
        return [bin_token(i) for i in range(self.n_bins + 1)]

    @classmethod
    def fit(cls, keys: Iterable[str], values: Iterable[list[str]], n_bins: int = 16) -> NumericBins:
        """Edges from the train split: ``keys[i]`` is the key of the value list ``values[i]``."""
        fitter = BinFitter(n_bins)
        fitter.add(keys, values)
        return fitter.bins()

    def bin_of(self, key: str, value: str) -> int | None:
        edges = self.edges.get(key)
        if edges is None:
            return None
        x = as_number(value)
        if x is None:
            return None
        return min(int(np.searchsorted(edges, x, side="left")), len(edges) - 1)

    # --- persistence ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"n_bins": self.n_bins, "edges": {k: e.tolist() for k, e in self.edges.items()}}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True))

    @classmethod
    def load(cls, path: str | Path) -> NumericBins:
        data = json.loads(Path(path).read_text())
        return cls(int(data["n_bins"]), data["edges"])


class BinFitter:
    """:meth:`NumericBins.fit` a batch at a time (the value sequences of a week come in buckets):
    ``add`` each batch of (key, values) rows in train order, then ``bins``. Exact while a key has
    at most ``max_values`` numbers; past that an evenly thinned sample (``MAX_FIT_VALUES``)."""

    def __init__(self, n_bins: int = 16, max_values: int = MAX_FIT_VALUES):
        self.n_bins, self.max_values = n_bins, max_values
        self.totals: dict[str, int] = defaultdict(int)  # values per key, numeric or not
        self.numbers: dict[str, list[np.ndarray]] = defaultdict(list)  # kept numbers, in chunks
        self.kept: dict[str, int] = defaultdict(int)
        self.seen: dict[str, int] = defaultdict(int)  # numbers met, kept or not
        self.stride: dict[str, int] = defaultdict(lambda: 1)

    def add(self, keys: Iterable[str], values: Iterable[list[str]]) -> None:
        batch: dict[str, list[float]] = defaultdict(list)
        for key, vs in zip(keys, values):
            self.totals[key] += len(vs)
            batch[key].extend(x for x in map(as_number, vs) if x is not None)
        for key, xs in batch.items():
            stride, seen = self.stride[key], self.seen[key]
            arr = np.asarray(xs, dtype=np.float64)
            self.seen[key] = seen + len(arr)
            arr = arr[(-seen) % stride::stride]  # the numbers at positions 0, stride, 2*stride, ...
            self.numbers[key].append(arr)
            self.kept[key] += len(arr)
            while self.kept[key] > self.max_values:  # thin: keep every 2nd kept number
                merged = np.concatenate(self.numbers[key])[::2]
                self.numbers[key], self.kept[key] = [merged], len(merged)
                self.stride[key] = stride = stride * 2

    def bins(self) -> NumericBins:
        edges = {}
        for key in sorted(self.numbers):
            if self.seen[key] >= MIN_VALUES and self.seen[key] >= MIN_NUMERIC_SHARE * self.totals[key]:
                xs = np.concatenate(self.numbers[key])
                edges[key] = np.unique(np.quantile(xs, np.linspace(0.0, 1.0, self.n_bins + 1))).tolist()
        return NumericBins(self.n_bins, edges)
