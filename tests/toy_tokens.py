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
