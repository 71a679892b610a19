"""A text and a table as one token sequence, with the structure ids every table encoder reads.

Layout (TAPAS's, Herzig et al. 2020): ``[CLS] text [SEP]`` then the table flattened row by row,
the header row first; every cell's tokens in a row. Per token, computed here and nowhere else:

* ``input_ids``; ``token_type_ids`` 0 for the text, 1 for the table;
* ``segment`` (seqenc.structure): TEXT, HEADER or CELL;
* ``row_ids`` (0: text and header, 1..: data rows) and ``col_ids`` (0: text, 1..: columns);
* ``position_ids``: per-cell positions -- the index of the token inside its cell (the text:
  inside the text). Choice: every variant uses them (the paper of TableFormer needs them for
  invariance, MATE resets positions per cell past 512 tokens), so the variants differ only in
  how attention sees the structure, and any length fits the position table.

Truncation (TAPAS's order): the text keeps its first ``max_text_tokens`` tokens, each cell its
first ``max_cell_tokens``, at most ``max_columns`` columns and ``max_rows`` data rows, then
whole rows are dropped from the end until the sequence fits ``max_len``. :class:`TableText`
records what was cut.

A table comes from long-form objects (seqenc.sequences: ``step, key, value``) with
:func:`table_of_objects`: objects at a negative step are the text (their values joined), the
others the table's rows (``step`` = row index, ``key`` = column, in the order first seen).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl
import torch

from seqenc.structure import CELL, HEADER, TEXT
from seqenc.tokenizer import ValueTokenizer

# a text's objects sit at TEXT_STEP + their step (training.table_task), before the table's rows
TEXT_STEP = -(2**31)
FIELDS = ("input_ids", "token_type_ids", "segment", "row_ids", "col_ids", "position_ids")


@dataclass
class TableText:
    """One encoded text + table; each field a list over tokens (FIELDS)."""

    input_ids: list[int] = field(default_factory=list)
    token_type_ids: list[int] = field(default_factory=list)
    segment: list[int] = field(default_factory=list)
    row_ids: list[int] = field(default_factory=list)
    col_ids: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    rows_dropped: int = 0
    columns_dropped: int = 0

    def add(self, ids: list[int], segment: int, row: int, col: int) -> None:
        self.input_ids += ids
        self.token_type_ids += [0 if segment == TEXT else 1] * len(ids)
        self.segment += [segment] * len(ids)
        self.row_ids += [row] * len(ids)
        self.col_ids += [col] * len(ids)
        self.position_ids += list(range(len(ids)))

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class TablePieces:
    """The token ids an encoder keeps of a text and a table, after truncation (module docstring)."""

    text: list[int]  # [CLS] text [SEP]
    header: list[list[int]]  # per kept column: its name's ids
    rows: list[list[list[int]]]  # per kept data row, per kept column: the cell's ids
    rows_dropped: int = 0
    columns_dropped: int = 0


def table_pieces(tok: ValueTokenizer, text: str, header: list[str], rows: list[list[str]], max_len: int,
                 max_text_tokens: int = 64, max_cell_tokens: int = 16, max_rows: int = 256,
                 max_columns: int = 64) -> TablePieces:
    """Tokenise ``text`` + the table once and truncate in TAPAS's order: whole rows are kept
    while the flattened sequence (text, header, rows) fits ``max_len`` tokens."""
    columns = min(len(header), max_columns)
    rows = rows[:max_rows]
    pieces = tok.encode_many([text, *header[:columns], *(c for r in rows for c in r[:columns])])
    out = TablePieces(text=[tok.cls_id, *pieces[0][:max_text_tokens], tok.sep_id],
                      header=[ids[:max_cell_tokens] for ids in pieces[1:1 + columns]], rows=[],
                      columns_dropped=len(header) - columns)
    length = len(out.text) + sum(len(ids) for ids in out.header)
    if length > max_len:
        raise ValueError(f"the text and header take {length} tokens, more than max_len={max_len}")
    cells = pieces[1 + columns:]
    for r in range(len(rows)):
        row = [cells[r * columns + c][:max_cell_tokens] for c in range(columns)]
        length += sum(len(ids) for ids in row)
        if length > max_len:
            out.rows_dropped = len(rows) - r
            break
        out.rows.append(row)
    return out


def encode_table_text(tok: ValueTokenizer, text: str, header: list[str], rows: list[list[str]], max_len: int,
                      max_text_tokens: int = 64, max_cell_tokens: int = 16, max_rows: int = 256,
                      max_columns: int = 64) -> TableText:
    """``text`` + the table (``header``, ``rows`` of cells) -> :class:`TableText` (module docstring)."""
    pieces = table_pieces(tok, text, header, rows, max_len, max_text_tokens, max_cell_tokens, max_rows, max_columns)
    out = TableText(rows_dropped=pieces.rows_dropped, columns_dropped=pieces.columns_dropped)
    out.add(pieces.text, TEXT, 0, 0)
    out.position_ids = list(range(len(out)))  # the text counts as one cell
    for c, ids in enumerate(pieces.header, start=1):
        out.add(ids, HEADER, 0, c)
    for r, row in enumerate(pieces.rows, start=1):
        for c, ids in enumerate(row, start=1):
            out.add(ids, CELL, r, c)
    return out


def table_of_objects(objects: pl.DataFrame, text_separator: str = " ") -> tuple[str, list[str], list[list[str]]]:
    """(text, header, rows) of one example's long-form objects (module docstring)."""
    text = text_separator.join(objects.filter(pl.col("step") < 0).sort("step", maintain_order=True)["value"].to_list())
    table = objects.filter(pl.col("step") >= 0)
    header = table["key"].unique(maintain_order=True).to_list()
    index = {k: i for i, k in enumerate(header)}
    rows: dict[int, list[str]] = {}
    for step, key, value in table.select("step", "key", "value").iter_rows():
        rows.setdefault(step, [""] * len(header))[index[key]] = value
    return text, header, [rows[s] for s in sorted(rows)]


def collate(examples: list[TableText], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad a batch: every FIELD as a [B, L] long tensor plus ``attention_mask`` [B, L] bool."""
    L = max(len(e) for e in examples)
    out = {name: torch.zeros(len(examples), L, dtype=torch.long) for name in FIELDS}
    out["input_ids"].fill_(pad_id)
    mask = torch.zeros(len(examples), L, dtype=torch.bool)
    for b, e in enumerate(examples):
        for name in FIELDS:
            out[name][b, :len(e)] = torch.tensor(getattr(e, name))
        mask[b, :len(e)] = True
    out["attention_mask"] = mask
    return out
