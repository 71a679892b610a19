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
* with ``gap_cuts`` (``TVMKAConfig.numeric_gap_cuts``) each of the two outer quantile bins is
  cut further where its train values leave a gap of a decade or more (two consecutive distinct
  values of one sign, the larger at least ``GAP_RATIO`` times the smaller): at most ``gap_cuts``
  cuts a bin, the widest gaps first, each at the value below the gap. A quantile bin holds 1/n of
  the values, so the top bin of a key whose values form clusters orders of magnitude apart holds
  them together -- 20-90 kB exports and 2-9 MB exfiltrations in the gateway stream of
  docs/training.md, whose anomalies then hide in the bin of normal exports; a cut at the gap gives
  each cluster its bin. Where the values run on without such a gap nothing changes, not even the
  vocabulary (the bin tokens are as many as the longest key's bins need). Cuts at every power of
  ten inside the outer bins were tried first and cost value_anomaly's dev (docs/training.md,
  "Magnitude gaps"): its small sizes run evenly over three decades, and more bins of normal
  values only made them harder to predict;
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
# a gap in a key's train values this wide (the larger value over the smaller) cuts an outer bin
# (gap_cuts): a decade, chosen not tuned -- an order of magnitude with nothing between
GAP_RATIO = 10.0
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

    def __init__(self, n_bins: int, edges: dict[str, list[float]], gap_cuts: int = 0):
        if n_bins < 1:
            raise ValueError(f"n_bins={n_bins} must be >= 1")
        if gap_cuts < 0:
            raise ValueError(f"gap_cuts={gap_cuts} must be >= 0 (0: no cuts at magnitude gaps)")
        self.n_bins, self.gap_cuts = n_bins, gap_cuts
        self.edges = {k: np.asarray(e, dtype=np.float64) for k, e in edges.items()}

    @property
    def tokens(self) -> list[str]:
        """Every bin token: n_bins + 1 edges give at most n_bins + 1 bins (bin 0 holds the
        minimum); a key whose outer bins were cut at gaps may need more, and gets them."""
        longest = max((len(e) for e in self.edges.values()), default=0)
        return [bin_token(i) for i in range(max(self.n_bins + 1, longest))]

    @classmethod
    def fit(cls, keys: Iterable[str], values: Iterable[list[str]], n_bins: int = 16,
            gap_cuts: int = 0) -> NumericBins:
        """Edges from the train split: ``keys[i]`` is the key of the value list ``values[i]``."""
        fitter = BinFitter(n_bins, gap_cuts=gap_cuts)
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
        return {"n_bins": self.n_bins, "gap_cuts": self.gap_cuts,
                "edges": {k: e.tolist() for k, e in self.edges.items()}}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True))

    @classmethod
    def load(cls, path: str | Path) -> NumericBins:
        data = json.loads(Path(path).read_text())
        return cls(int(data["n_bins"]), data["edges"], int(data.get("gap_cuts", 0)))


class BinFitter:
    """:meth:`NumericBins.fit` a batch at a time (the value sequences of a week come in buckets):
    ``add`` each batch of (key, values) rows in train order, then ``bins``. Exact while a key has
    at most ``max_values`` numbers; past that an evenly thinned sample (``MAX_FIT_VALUES``)."""

    def __init__(self, n_bins: int = 16, max_values: int = MAX_FIT_VALUES, gap_cuts: int = 0):
        self.n_bins, self.max_values, self.gap_cuts = n_bins, max_values, gap_cuts
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
                quantiles = np.unique(np.quantile(xs, np.linspace(0.0, 1.0, self.n_bins + 1)))
                edges[key] = with_gap_cuts(quantiles, xs, self.gap_cuts).tolist()
        return NumericBins(self.n_bins, edges, self.gap_cuts)


def gap_cuts_between(values: np.ndarray, lo: float, hi: float, at_most: int) -> list[float]:
    """Cuts inside the bin (lo, hi]: for the ``at_most`` widest gaps of at least ``GAP_RATIO``
    between consecutive distinct ``values`` in [lo, hi] of one sign, the value below the gap."""
    inside = np.unique(values[(values >= lo) & (values <= hi)])
    a, b = inside[:-1], inside[1:]
    same_sign = a * b > 0
    ratio = np.where(same_sign, np.maximum(abs(a), abs(b)) / np.maximum(np.minimum(abs(a), abs(b)), 1e-300), 0.0)
    wide = np.flatnonzero((ratio >= GAP_RATIO) & (a > lo) & (a < hi))  # a cut at lo or hi is an edge already
    wide = wide[np.argsort(-ratio[wide], kind="stable")][:at_most]
    return sorted(float(a[i]) for i in wide)


def with_gap_cuts(quantiles: np.ndarray, values: np.ndarray, gap_cuts: int) -> np.ndarray:
    """Quantile edges with the outer two bins cut at their magnitude gaps (:func:`gap_cuts_between`)."""
    if gap_cuts < 1 or len(quantiles) < 2:
        return quantiles
    cuts = gap_cuts_between(values, quantiles[0], quantiles[1], gap_cuts)
    if len(quantiles) > 2:  # one bin: its cuts are the bottom bin's
        cuts += gap_cuts_between(values, quantiles[-2], quantiles[-1], gap_cuts)
    return np.unique(np.concatenate([quantiles, np.asarray(cuts, dtype=np.float64)]))
