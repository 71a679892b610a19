"""Training data: labels, splits, masked-LM batches of value-sequence windows.

Choices:
* Splits are stratified by label and fixed by the seed (60% train / 20% dev / 20% test).
* TVM masked-LM training reads the windows of the *train* sequences only, so no test value is
  ever seen by any part of the model during training.
* Masking follows BERT: 15% of the non-special tokens are picked; of those 80% become [MASK],
  10% a random non-special token, 10% stay; the loss is computed on the picked positions.
  ``TrainConfig.mlm_mask_unit="value"`` picks whole values instead (:func:`mask_tokens`).
"""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl
import torch
from sklearn.model_selection import train_test_split

from seqenc.inference import length_batches, pad_batch
from seqenc.sequences import value_spans
from seqenc.tokenizer import ValueTokenizer
from training.tasks.kinds import get_kind


def label_array(sequence_ids: list[str], labels: pl.DataFrame, class_names: list[str]) -> np.ndarray:
    """Class index of every sequence id; a sequence without a label, or with a label that is not
    a class, is an error."""
    lookup = dict(zip(labels["sequence_id"].to_list(), labels["label"].to_list()))
    missing = [s for s in sequence_ids if s not in lookup]
    if missing:
        raise ValueError(f"{len(missing)} sequences have no label, e.g. {missing[:3]}")
    index = {name: i for i, name in enumerate(class_names)}
    unknown = sorted({lookup[s] for s in sequence_ids} - set(index))
    if unknown:
        raise ValueError(f"labels {unknown[:10]} are not among the classes {class_names[:10]}")
    return np.array([index[lookup[s]] for s in sequence_ids], dtype=np.int64)


def split_indices(y: np.ndarray, seed: int, dev: float = 0.2, test: float = 0.2) -> dict[str, np.ndarray]:
    """Stratified train/dev/test indexes, deterministic for a seed."""
    idx = np.arange(len(y))
    train_dev, test_idx = train_test_split(idx, test_size=test, stratify=y, random_state=seed)
    train_idx, dev_idx = train_test_split(
        train_dev, test_size=dev / (1 - test), stratify=y[train_dev], random_state=seed
    )
    return {"train": np.sort(train_idx), "dev": np.sort(dev_idx), "test": np.sort(test_idx)}


FIXED_SPLIT_SALT = "seqenc-split-v1"


def fixed_split(sequence_ids: list[str], dev: float = 0.2, test: float = 0.2,
                salt: str = FIXED_SPLIT_SALT) -> list[str]:
    """``"train" | "dev" | "test"`` per sequence id, from a hash of the id alone.

    A sequence lands in the same split whatever else is in the data, so models trained on
    different days (different windows of data, seqenc_nightly_training) are compared on dev
    sequences none of them trained on. Choice: blake2b of ``salt + id`` as a number in [0, 1):
    below ``test`` -> test, below ``test + dev`` -> dev, else train. Not stratified: a rare class
    gets its share only on average."""
    out = []
    for sid in sequence_ids:
        u = int.from_bytes(hashlib.blake2b((salt + sid).encode(), digest_size=8).digest(), "big") / 2**64
        out.append("test" if u < test else "dev" if u < test + dev else "train")
    return out


MASK_UNITS = ("token", "value")


def mask_tokens(ids: torch.Tensor, tok: ValueTokenizer, generator: torch.Generator,
                prob: float = 0.15, unit: str = "token") -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking of a padded batch: -> (masked input_ids, labels with -100 where not picked).

    ``unit="token"`` picks each non-special token with ``prob`` (BERT, the paper). ``unit="value"``
    picks each *value* of S(k) with ``prob`` -- every token after a [VAL_SEP] up to the next one,
    so its link / repeat marker and bin token go with it -- and treats its tokens as one: all
    [MASK] (80%), all random (10%) or all kept (10%), as whole-word masking does for words.
    The key's tokens before the first [VAL_SEP] are never picked then. Why: with token masking
    the other pieces of a value nearly give a masked piece away, so the TVM need not read the
    key's *other* values, while a whole masked value can only be predicted from them; and the
    surprise scorer (seqenc.surprise) masks whole values, so the TVM is then trained as it is
    queried. Measured on value_anomaly (links, repeats, bins, surprise; docs/training.md), under
    the protocol (docs/benchmarks.md): chosen on the dev F1 of seeds 0-2, 0.973 against 0.954 for
    token masking, and reported on seeds 10-14, test F1 0.937 +- 0.059. Earlier, on the test
    splits of seeds 0-2 (before the protocol): with the masked LM on normal sequences and the tail-calibrated scorer,
    test F1 0.944 +- 0.026 against 0.903 +- 0.040 with token masking; with the earlier z-score
    scorer and every sequence in the masked LM it did not pay (0.813 +- 0.010 against 0.817 +-
    0.039). A masked random size is still not copied from the other replicas. Off by default."""
    if unit not in MASK_UNITS:
        raise ValueError(f"mask unit {unit!r} is not one of {MASK_UNITS}")
    special = torch.isin(ids, torch.tensor(sorted(tok.special_ids)))
    if unit == "token":
        picked = (torch.rand(ids.shape, generator=generator) < prob) & ~special
        roll = torch.rand(ids.shape, generator=generator)
    else:
        value = torch.cumsum(ids == tok.val_sep_id, dim=1)  # [B, L]: 0 on the key, i on the i-th value
        per_value = torch.rand(ids.shape, generator=generator)  # [B, L]: column i is value i's draw
        picked = (per_value.gather(1, value) < prob) & ~special & (value > 0)
        roll = torch.rand(ids.shape, generator=generator).gather(1, value)  # one roll per value
    labels = torch.where(picked, ids, torch.full_like(ids, -100))
    masked = ids.clone()
    masked[picked & (roll < 0.8)] = tok.mask_id
    random_pos = picked & (roll >= 0.8) & (roll < 0.9)
    # random replacements are drawn from the non-special tokens only
    normal = torch.tensor([i for i in range(tok.vocab_size) if i not in tok.special_ids])
    masked[random_pos] = normal[torch.randint(len(normal), (int(random_pos.sum()),), generator=generator)]
    return masked, labels


class MLMBatches:
    """Endless, shuffled, length-bucketed masked-LM batches over some windows.

    With ``window_keys`` (the key name of each window) and ``replace_prob`` > 0, each row of
    a batch that holds at least ``RVD_MIN_VALUES`` values has one value swapped, with that
    probability, for a different value of the same key drawn from all the windows' values (so
    frequent values are drawn often), before masking; a batch is then ``(ids, mask, labels,
    replaced)`` with ``replaced`` [B, L] bool, the targets of replaced-value detection (see
    seqenc.config): at position 0 ([CLS]) whether the row had a value swapped, elsewhere whether
    the token belongs to the swapped value (ELECTRA-style dense targets, which teach each value
    to compare itself with the others far faster than the [CLS] target alone; measured on a toy
    task, the [CLS]-only loss barely moved in 230 steps). A swap that would not fit in
    ``max_len`` tokens is not made. Choice: rows with fewer values are never swapped, since one
    value alone cannot disagree with the rest.
    """

    RVD_MIN_VALUES = 2

    def __init__(self, windows: list[list[int]], tok: ValueTokenizer, batch_tokens: int, seed: int,
                 window_keys: list[str] | None = None, replace_prob: float = 0.0, max_len: int | None = None,
                 mask_unit: str = "token"):
        if mask_unit not in MASK_UNITS:
            raise ValueError(f"mask unit {mask_unit!r} is not one of {MASK_UNITS}")
        if not windows:
            raise ValueError("no windows to train the TVM on")
        if replace_prob and window_keys is None:
            raise ValueError("replaced-value batches need the key of every window (window_keys)")
        self.windows, self.tok = windows, tok
        lengths = np.fromiter((len(w) for w in windows), dtype=np.int64, count=len(windows))
        self.batches = length_batches(lengths, batch_tokens, max_rows=256)
        self.rng = np.random.default_rng(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self._order: list[int] = []
        self.replace_prob, self.window_keys, self.mask_unit = replace_prob, window_keys, mask_unit
        self.max_len = max_len or int(lengths.max())
        self.pool: dict[str, list[tuple[int, ...]]] = {}
        if replace_prob:
            for w, key in zip(windows, window_keys):
                self.pool.setdefault(key, []).extend(v for _, v in self._values(w))

    def __iter__(self):
        return self

    def __next__(self):
        if not self._order:  # a new epoch: reshuffle the batch order
            self._order = list(self.rng.permutation(len(self.batches)))
        index = self.batches[self._order.pop()]
        swaps = [self._swap(self.windows[i], self.window_keys[i]) for i in index] if self.replace_prob \
            else [None] * len(index)
        rows = [self.windows[i] if swap is None else swap[0] for i, swap in zip(index, swaps)]
        replaced = None
        if self.replace_prob:
            replaced = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.bool)
            for b, swap in enumerate(swaps):
                if swap is not None:
                    _, start, end = swap
                    replaced[b, 0] = True
                    replaced[b, start:end] = True
        ids, attention_mask = pad_batch(rows, self.tok.pad_id)
        masked, labels = mask_tokens(ids, self.tok, self.generator, unit=self.mask_unit)
        return (masked, attention_mask, labels) if replaced is None else (masked, attention_mask, labels, replaced)

    def _values(self, window: list[int]) -> list[tuple[int, tuple[int, ...]]]:
        """(start, token ids) of every value of a window (seqenc.sequences.value_spans)."""
        return [(a, tuple(window[a:b])) for a, b in value_spans(window, self.tok.val_sep_id)]

    def _swap(self, window: list[int], key: str) -> tuple[list[int], int, int] | None:
        """(the window with one value replaced, start, end of the new value's tokens), or None:
        not this time / not possible."""
        if self.rng.random() >= self.replace_prob:
            return None
        values = self._values(window)
        if len(values) < self.RVD_MIN_VALUES:
            return None
        start, old = values[int(self.rng.integers(len(values)))]
        pool = self.pool[key]
        for _ in range(5):  # a draw equal to the old value changes nothing: draw again
            new = pool[int(self.rng.integers(len(pool)))]
            if new != old:
                break
        else:
            return None
        if len(window) - len(old) + len(new) > self.max_len:
            return None
        return window[:start] + list(new) + window[start + len(old):], start, start + len(new)

    @property
    def batches_per_epoch(self) -> int:
        return len(self.batches)


def class_weights(y: np.ndarray, n_classes: int, task: str = "multiclass") -> torch.Tensor | None:
    """Inverse-frequency class weights, normalised to mean 1 (for imbalanced tasks).

    None (an unweighted loss) for a kind without ``weighted_loss`` (training.tasks.kinds:
    next_item, whose catalogue's popularity skew is part of the signal; inverse-frequency weights
    over thousands of items, many seen once in train, would let the rarest items dominate)."""
    if not get_kind(task).weighted_loss:
        return None
    counts = np.bincount(y, minlength=n_classes).astype(np.float64)
    w = np.where(counts > 0, counts.sum() / np.maximum(counts, 1) / n_classes, 0.0)
    return torch.tensor(w / w[counts > 0].mean(), dtype=torch.float32)
