"""Tokenised toy data for the trainer tests: value sequences -> a WordPiece vocabulary learnt on
them -> every S(k) tokenised, with the labels in the data's sequence order."""

from __future__ import annotations

import numpy as np
import polars as pl

from seqenc.sequences import TokenizedSequences, tokenize_value_sequences
from seqenc.tokenizer import ValueTokenizer


def tokenized(value_sequences: pl.DataFrame, labels: np.ndarray, vocab_size: int = 200,
              max_len: int = 32) -> tuple[ValueTokenizer, TokenizedSequences, np.ndarray]:
    """``(tokenizer, data, y)`` for rows of seqenc.sequences.collect_value_sequences whose
    sequence ids are ``s<i>``, ``labels[i]`` the label of ``s<i>``."""
    vs = value_sequences
    tok = ValueTokenizer.train(vs["key"].to_list() + vs["values"].explode().to_list(), vocab_size=vocab_size,
                               min_frequency=1)
    data = tokenize_value_sequences(vs, tok, max_len=max_len)
    return tok, data, np.array([labels[int(s[1:])] for s in data.sequence_ids])


def split_windows(objects: pl.DataFrame, labels: list[int], model: dict, n_train: int, n_dev: int, seed: int = 1):
    """``(tokenizer, data, y, splits)`` of long-form toy objects: the sequence ids (sorted) in a
    seeded random order, the first ``n_train`` train, the next ``n_dev`` dev, the rest test; the
    vocabulary and S(k) windows from the train sequences as the pipeline builds them
    (training.tasks.task_data.vocab_and_windows); ``labels`` in sorted-id order."""
    from seqenc.sequences import collect_value_sequences
    from training.tasks.task_data import vocab_and_windows

    ids = sorted(objects["sequence_id"].unique().to_list())
    order = np.random.default_rng(seed).permutation(len(ids))
    split_of = {ids[i]: ("train" if k < n_train else "dev" if k < n_train + n_dev else "test")
                for k, i in enumerate(order)}
    train_ids = pl.Series([s for s in ids if split_of[s] == "train"])
    tok, data = vocab_and_windows(collect_value_sequences(objects), train_ids, model)
    label = dict(zip(ids, labels))
    y = np.array([label[s] for s in data.sequence_ids])
    splits = {name: np.array([i for i, s in enumerate(data.sequence_ids) if split_of[s] == name])
              for name in ("train", "dev", "test")}
    return tok, data, y, splits
