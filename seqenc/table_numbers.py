"""Numeric features of a table's cells: rank in their column and relation to the text's numbers.

TAPAS (Herzig et al. 2020, section 3) embeds, per token, the rank of its cell in its column and
its numeric relation to the question's numbers, so a superlative ("the highest attendance") or a
comparison ("less than 40000") becomes something a cell can show rather than arithmetic the
encoder must learn. The same here, for seqenc.table_inputs (``numeric_ids``: three ids a token):

* ``rank``: 1 for the smallest number of the column, 2 for the next, ... (equal numbers share a
  rank), capped at MAX_RANK; 0 for a cell that is no number or a column that is not numeric;
* ``inverse rank``: the same from the largest;
* ``relation`` of the cell's number to the numbers of the text: EQUAL to one of them, LESS than
  all, GREATER than all, BETWEEN (less than some, greater than others); NONE when the cell or the
  text has no number.

Choices (TAPAS parses dates and numbers with units; this is the simple end of it): a cell is a
number when, after removing thousands separators and spaces, it is one signed integer or
decimal, optionally ending in ``%`` or an ordinal suffix (``19th``); "1 - 0", "38'44.105" and
dates are not numbers. A column is numeric when at least half of its non-empty cells are. The
text's numbers are every run of digits (with a decimal part) in it.
"""

from __future__ import annotations

import re

import torch
from torch import nn

MAX_RANK = 32
NONE, EQUAL, LESS, GREATER, BETWEEN = 0, 1, 2, 3, 4
RELATIONS = 5
NUMBER = re.compile(r"^[+-]?\d+(?:\.\d+)?(?:%|st|nd|rd|th)?$")
TEXT_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def parse_number(cell: str) -> float | None:
    """The number a cell holds (module docstring), or None."""
    compact = re.sub(r"(?<=\d),(?=\d{3})", "", cell.strip().lower()).replace(" ", "")
    if not NUMBER.match(compact):
        return None
    return float(re.sub(r"(%|st|nd|rd|th)$", "", compact))


def text_numbers(text: str) -> list[float]:
    """Every number written in ``text`` (thousands separators removed)."""
    return [float(x) for x in TEXT_NUMBER.findall(re.sub(r"(?<=\d),(?=\d{3})", "", text))]


def column_ranks(cells: list[str]) -> list[tuple[int, int]]:
    """(rank, inverse rank) of every cell of one column; (0, 0) for all when the column is not numeric."""
    values = [parse_number(c) for c in cells]
    filled = [c for c in cells if c.strip()]
    numbers = [v for v in values if v is not None]
    if not numbers or len(numbers) * 2 < len(filled):
        return [(0, 0)] * len(cells)
    order = sorted(set(numbers))
    rank = {v: i + 1 for i, v in enumerate(order)}
    return [(0, 0) if v is None else (min(rank[v], MAX_RANK), min(len(order) + 1 - rank[v], MAX_RANK))
            for v in values]


def relation(value: float | None, numbers: list[float]) -> int:
    """A cell's number against the text's numbers (module docstring)."""
    if value is None or not numbers:
        return NONE
    if any(abs(value - n) < 1e-9 for n in numbers):
        return EQUAL
    if all(value < n for n in numbers):
        return LESS
    if all(value > n for n in numbers):
        return GREATER
    return BETWEEN


def numeric_features(text: str, rows: list[list[str]]) -> list[list[tuple[int, int, int]]]:
    """Per row, per column: (rank, inverse rank, relation) of the cell (module docstring)."""
    if not rows:
        return []
    numbers = text_numbers(text)
    columns = [column_ranks([row[c] for row in rows]) for c in range(len(rows[0]))]
    return [[(*columns[c][r], relation(parse_number(cell), numbers)) for c, cell in enumerate(row)]
            for r, row in enumerate(rows)]


class NumericEmbeddings(nn.Module):
    """numeric_ids [..., 3] (rank, inverse rank, relation) -> [..., d_model], the sum of one
    embedding each. They start at zero (:meth:`reset_parameters`, called after the model's own
    init): a model starts as one without them and learns them as they help. Why: with random
    ones, three more random vectors on every token, the scratch dense and TableFormer encoders
    stopped leaving the chance loss in lookup pre-training where they had left it within 600
    updates without them (docs/tables.md)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.rank = nn.Embedding(MAX_RANK + 1, d_model)
        self.inverse_rank = nn.Embedding(MAX_RANK + 1, d_model)
        self.relation = nn.Embedding(RELATIONS, d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for embedding in (self.rank, self.inverse_rank, self.relation):
            nn.init.zeros_(embedding.weight)

    def forward(self, numeric_ids: torch.Tensor) -> torch.Tensor:
        return self.rank(numeric_ids[..., 0]) + self.inverse_rank(numeric_ids[..., 1]) + \
            self.relation(numeric_ids[..., 2])
