"""A text and a table as one token sequence, with the structure ids every table encoder reads.

Layout (TAPAS's, Herzig et al. 2020): ``[CLS] text [SEP]`` then the table flattened row by row,
the header row first; every cell's tokens in a row. Per token, computed here and nowhere else:

* ``input_ids``; ``token_type_ids`` 0 for the text, 1 for the table;
* ``segment`` (seqenc.structure): TEXT, HEADER or CELL;
* ``row_ids`` (0: text and header, 1..: data rows) and ``col_ids`` (0: text, 1..: columns);
* ``position_ids``: per-cell positions -- the index of the token inside its cell (the text:
  inside the text). Choice: every variant uses them (the paper of TableFormer needs them for
  invariance, MATE resets positions per cell past 512 tokens), so the variants differ only in
  how attention sees the structure, and any length fits the position table;
* ``numeric_ids``: three ids per token (seqenc.table_numbers, TAPAS's numeric features): its
  cell's rank in a numeric column, the rank from the largest, and its number's relation to the
  text's numbers; (0, 0, 0) for the text, the header and cells without a number;
* ``match_ids``: exact-match features, the table counterpart of the "this word occurs in the
  question" feature of reading-comprehension models (and of TAPAS's feature embeddings): a
  header or cell token is ``WORD_MATCH`` when its word occurs in the text and ``CELL_MATCH``
  when the text names its cell whole -- the cell's tokens occur in the text as one contiguous
  run, in order ("1 - 0" is not named by "... is 0 - 1"); a text token is ``CELL_MATCH`` inside
  such a run and ``WORD_MATCH`` when its word occurs in a kept header or cell. Words are the tokenizer's pre-tokens
  (ValueTokenizer.encode_words) with a letter or digit that are not English function words
  (``STOPWORDS``): punctuation, "the", "of", "a" ... never match; [CLS], [SEP] and padding are
  ``NO_MATCH``. Why: "the value sits in the key's row" asks a model first to find which cells
  the statement names -- token identity across the text and the table, which a small encoder
  trained from scratch on a few thousand statements did not learn (docs/tables.md) -- and then
  to relate them by row. Given the first, the encoders only have to learn the second.
  With ``row_match`` (``TableConfig.table_row_match``) a cell token's id also says how many of
  its row's cells the text names whole -- 0, 1, 2 or 3 and more (``ROW_MATCH_BUCKETS``):
  ``match + MATCH_TYPES * bucket``, so the vocabulary grows to ``MATCH_TYPES * ROW_MATCH_BUCKETS``
  and the ids of the text and the header stay as they were. What is counted is ``row_count``
  (``seqenc.config.TABLE_ROW_COUNTS``): ``"cells"``, every cell named whole; ``"spans"`` (TableConfig's default), the
  stretches of the text that the row's cells name, each once -- two cells holding the same text
  name one stretch, a cell whose stretch lies inside another named cell's ("4" in "... is 4.5")
  adds none, and of overlapping stretches the most that are pairwise disjoint count -- so a row
  holding the text's one value twice does not look like a row naming two things of it. Why: "the statement names two
  cells of one row" is the relation a lookup or a TabFact statement is about; computed from the
  inputs (as TAPAS's rank features are), it reaches [CLS] through one attention layer, where the
  encoder would otherwise have to compose it from two cells' matches across the row first
  (docs/tables.md: without it, whether a scratch run leaves the chance plateau was a coin toss).

With ``header_match`` (``TableConfig.table_header_match``) a cell token's id also says whether
the text names its column's header whole: the ids of such cells move up by the vocabulary
without it (``match_vocabulary``), so the vocabulary doubles. Why: a lookup or a TabFact statement
names a column and a value in it ("the score of ... is 3"); a row can hold the named value under
another column (a "3" in both score and rank), and telling the two apart otherwise asks an encoder
to carry the header's match down its column first. It is the exact-match half of the schema
linking of text-to-SQL parsers (question words against column names), computed from the inputs.

Truncation (TAPAS's order): the text keeps its first ``max_text_tokens`` tokens, each cell its
first ``max_cell_tokens``, at most ``max_columns`` columns and ``max_rows`` data rows, then
whole rows are dropped from the end until the sequence fits ``max_len``. :class:`TableText`
records what was cut.

A table comes from long-form objects (seqenc.sequences: ``step, key, value``) with
:func:`table_of_objects`: objects at a negative step are the text (their values joined), the
others the table's rows (``step`` = row index, ``key`` = column, in the order first seen).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import polars as pl
import torch

from seqenc.config import TABLE_ROW_COUNTS
from seqenc.structure import CELL, HEADER, TEXT
from seqenc.table_numbers import numeric_features
from seqenc.tokenizer import ValueTokenizer

# a text's objects sit at TEXT_STEP + their step (training.tasks.table_task), before the table's rows
TEXT_STEP = -(2**31)
FIELDS = ("input_ids", "token_type_ids", "segment", "row_ids", "col_ids", "position_ids", "match_ids", "numeric_ids")
NO_NUMBER = (0, 0, 0)  # numeric_ids of a token whose cell holds no number (the text's, the header's)
# match_ids (module docstring)
NO_MATCH, WORD_MATCH, CELL_MATCH = 0, 1, 2
MATCH_TYPES = 3
ROW_MATCH_BUCKETS = 4  # a row naming 0, 1, 2, 3+ cells whole (module docstring: row_match)
WORD = re.compile(r"\w+")  # overlap_features' words
# English function words never match (a cell "a" is not named by "the h / a of ... is h"); chosen
# from the errors of a lookup model on its dev split (docs/tables.md)
STOPWORDS = frozenset("a an the of in on at to for by with is are was were be been and or as from that this it "
                      "its".split())
N_OVERLAP = 5  # overlap_features' length


@dataclass
class TableText:
    """One encoded text + table; each field a list over tokens (FIELDS)."""

    input_ids: list[int] = field(default_factory=list)
    token_type_ids: list[int] = field(default_factory=list)
    segment: list[int] = field(default_factory=list)
    row_ids: list[int] = field(default_factory=list)
    col_ids: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    match_ids: list[int] = field(default_factory=list)
    numeric_ids: list[tuple[int, int, int]] = field(default_factory=list)  # seqenc.table_numbers, per token
    rows_dropped: int = 0
    columns_dropped: int = 0

    def add(self, ids: list[int], segment: int, row: int, col: int, match: list[int],
            numeric: tuple[int, int, int] = NO_NUMBER) -> None:
        self.input_ids += ids
        self.token_type_ids += [0 if segment == TEXT else 1] * len(ids)
        self.segment += [segment] * len(ids)
        self.row_ids += [row] * len(ids)
        self.col_ids += [col] * len(ids)
        self.position_ids += list(range(len(ids)))
        self.match_ids += match
        self.numeric_ids += [numeric] * len(ids)

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class TablePieces:
    """The token ids an encoder keeps of a text and a table, after truncation (module docstring),
    and beside each list of ids its tokens' match_ids."""

    text: list[int]  # [CLS] text [SEP]
    header: list[list[int]]  # per kept column: its name's ids
    rows: list[list[list[int]]]  # per kept data row, per kept column: the cell's ids
    text_match: list[int] = field(default_factory=list)
    header_match: list[list[int]] = field(default_factory=list)
    rows_match: list[list[list[int]]] = field(default_factory=list)
    rows_numeric: list[list[tuple[int, int, int]]] = field(default_factory=list)  # per kept row, per column
    rows_dropped: int = 0
    columns_dropped: int = 0


def _content(tok: ValueTokenizer, word: tuple[int, ...]) -> bool:
    """Whether a word (its token ids) can match: it has a letter or a digit and is no STOPWORD."""
    text = "".join((tok.tokenizer.id_to_token(i) or "").removeprefix("##") for i in word)
    return any(ch.isalnum() for ch in text) and text not in STOPWORDS


MAX_SPAN = 32  # a cell longer than this many tokens is never named whole (it would not fit a text span index)


def _spans(ids: list[int]) -> dict[tuple[int, ...], list[int]]:
    """Every contiguous run of ``ids`` up to MAX_SPAN tokens -> its start positions."""
    out: dict[tuple[int, ...], list[int]] = {}
    for i in range(len(ids)):
        for n in range(1, min(MAX_SPAN, len(ids) - i) + 1):
            out.setdefault(tuple(ids[i:i + n]), []).append(i)
    return out


def _cell_match(tok: ValueTokenizer, ids: list[int], words: list[tuple[int, ...]], text_words: set,
                text_spans: dict) -> tuple[list[int], list[int]]:
    """match_ids of a cell's tokens against the text, and where in the text the cell occurs whole
    (the starts of its token sequence as a contiguous run of the text's; [] when it does not, or
    when it has no word that can match)."""
    starts = text_spans.get(tuple(ids), []) if any(_content(tok, w) for w in words) else []
    return [CELL_MATCH if starts else WORD_MATCH if w in text_words else NO_MATCH for w in words], starts


def disjoint_stretches(stretches: set[tuple[int, int]]) -> int:
    """How many of ``stretches`` ((start, end), end exclusive) count as separate things named
    (module docstring, ``row_count="spans"``): those that lie inside no other, then the most of
    them that do not overlap (earliest end first, which is optimal for intervals)."""
    outer = sorted((s for s in stretches if not any(o != s and o[0] <= s[0] and s[1] <= o[1] for o in stretches)),
                   key=lambda s: s[1])
    count, end = 0, -1
    for start, stop in outer:
        if start >= end:
            count, end = count + 1, stop
    return count


def _row_count(row: list[tuple], row_count: str) -> int:
    if row_count == "cells":
        return sum(1 for c in row if c[3])
    if row_count == "spans":  # the text's stretches the row's cells name, as (start, end) token positions
        return disjoint_stretches({(s, s + size) for _, _, _, starts, size in row for s in starts})
    raise ValueError(f"row_count={row_count!r} is not one of {TABLE_ROW_COUNTS}")


def match_vocabulary(row_match: bool, header_match: bool = False) -> int:
    """How many match_ids there are (module docstring), with or without ``row_match`` and
    ``header_match``."""
    return MATCH_TYPES * (ROW_MATCH_BUCKETS if row_match else 1) * (2 if header_match else 1)


def table_pieces(tok: ValueTokenizer, text: str, header: list[str], rows: list[list[str]], max_len: int,
                 max_text_tokens: int = 64, max_cell_tokens: int = 16, max_rows: int = 256,
                 max_columns: int = 64, row_match: bool = False, row_count: str = "cells",
                 header_match: bool = False) -> TablePieces:
    """Tokenise ``text`` + the table once and truncate in TAPAS's order: whole rows are kept
    while the flattened sequence (text, header, rows) fits ``max_len`` tokens. The match_ids
    compare the whole text with each whole cell; a cut cell or text keeps its first tokens'.
    ``row_match``: the cells' ids also carry their row's count of what it names (``row_count``);
    ``header_match``: and whether the text names their column's header whole."""
    columns = min(len(header), max_columns)
    rows = rows[:max_rows]
    pieces = tok.encode_words([text, *header[:columns], *(c for r in rows for c in r[:columns])])
    text_ids, text_word_of = pieces[0]
    text_words = {w for w in text_word_of if _content(tok, w)}
    text_spans = _spans(text_ids)
    # per header name and cell: (ids, match_ids, its words, where the text names it whole, its length)
    cells = [(ids[:max_cell_tokens], match[:max_cell_tokens], words, starts, len(ids))
             for ids, words in pieces[1:] for match, starts in [_cell_match(tok, ids, words, text_words, text_spans)]]
    out = TablePieces(text=[tok.cls_id, *text_ids[:max_text_tokens], tok.sep_id],
                      header=[c[0] for c in cells[:columns]], rows=[],
                      header_match=[c[1] for c in cells[:columns]], columns_dropped=len(header) - columns)
    length = len(out.text) + sum(len(ids) for ids in out.header)
    if length > max_len:
        raise ValueError(f"the text and header take {length} tokens, more than max_len={max_len}")
    kept = cells[:columns]
    # header_match: a cell's ids move past the others' when the text names its column's header whole
    named_header = match_vocabulary(row_match) if header_match else 0
    header_offsets = [named_header if c[3] else 0 for c in cells[:columns]]
    numeric = numeric_features(text, [row[:columns] for row in rows])
    for r in range(len(rows)):
        row = cells[columns * (r + 1):columns * (r + 2)]
        length += sum(len(c[0]) for c in row)
        if length > max_len:
            out.rows_dropped = len(rows) - r
            break
        out.rows.append([c[0] for c in row])
        bucket = MATCH_TYPES * min(_row_count(row, row_count), ROW_MATCH_BUCKETS - 1) if row_match else 0
        out.rows_match.append([[m + bucket + offset for m in c[1]] for c, offset in zip(row, header_offsets)])
        out.rows_numeric.append(numeric[r])
        kept += row
    # the text's side, against the kept header and cells only: CELL_MATCH on the spans that name a
    # kept cell whole, WORD_MATCH on a word a kept cell holds
    table_words = {w for c in kept for w in c[2]}
    named = [NO_MATCH] * len(text_ids)
    for ids, _, _, starts, _ in kept:
        for start in starts:
            named[start:start + len(ids)] = [CELL_MATCH] * len(ids)
    out.text_match = [NO_MATCH, *[CELL_MATCH if m else WORD_MATCH if w in text_words and w in table_words
                                  else NO_MATCH for m, w in zip(named, text_word_of)][:max_text_tokens], NO_MATCH]
    return out


def encode_table_text(tok: ValueTokenizer, text: str, header: list[str], rows: list[list[str]], max_len: int,
                      max_text_tokens: int = 64, max_cell_tokens: int = 16, max_rows: int = 256,
                      max_columns: int = 64, row_match: bool = False, row_count: str = "cells",
                      header_match: bool = False) -> TableText:
    """``text`` + the table (``header``, ``rows`` of cells) -> :class:`TableText` (module docstring)."""
    pieces = table_pieces(tok, text, header, rows, max_len, max_text_tokens, max_cell_tokens, max_rows, max_columns,
                          row_match, row_count, header_match)
    out = TableText(rows_dropped=pieces.rows_dropped, columns_dropped=pieces.columns_dropped)
    out.add(pieces.text, TEXT, 0, 0, pieces.text_match)
    out.position_ids = list(range(len(out)))  # the text counts as one cell
    for c, (ids, match) in enumerate(zip(pieces.header, pieces.header_match), start=1):
        out.add(ids, HEADER, 0, c, match)
    for r, (row, row_match, row_numeric) in enumerate(zip(pieces.rows, pieces.rows_match, pieces.rows_numeric),
                                                      start=1):
        for c, (ids, match, numeric) in enumerate(zip(row, row_match, row_numeric), start=1):
            out.add(ids, CELL, r, c, match, numeric)
    return out


# the key of the derived column "what of the text this row names" that a table task adds to each
# row for TVM-KA (training.tasks.table_task); the table encoders drop it (they compute row-match ids)
ROW_MATCH_KEY = "[row match]"


def text_index(text: str) -> dict[tuple[str, ...], list[int]]:
    """Every run of up to MAX_SPAN words of ``text`` (lower-cased ``\\w+`` words) -> its starts."""
    words = WORD.findall(text.lower())
    out: dict[tuple[str, ...], list[int]] = {}
    for i in range(len(words)):
        for n in range(1, min(MAX_SPAN, len(words) - i) + 1):
            out.setdefault(tuple(words[i:i + n]), []).append(i)
    return out


def named_stretches(index: dict[tuple[str, ...], list[int]], cell: str) -> list[tuple[int, int]]:
    """Where a text (its :func:`text_index`) names ``cell`` whole, as (start, end) word positions:
    the cell's words as one run, in order; a cell of function words alone is never named."""
    words = tuple(WORD.findall(cell.lower()))
    if not words or all(w in STOPWORDS for w in words):
        return []
    return [(s, s + len(words)) for s in index.get(words, [])]


def row_named(index: dict[tuple[str, ...], list[int]], cells: list[str], row_count: str = "spans") -> int:
    """How many things of a text (its :func:`text_index`) a row's ``cells`` name, on words: the
    word-level twin of the row-match count (module docstring, ``row_count``)."""
    found = [named_stretches(index, cell) for cell in cells]
    if row_count == "cells":
        return sum(1 for f in found if f)
    if row_count == "spans":
        return disjoint_stretches({s for f in found for s in f})
    raise ValueError(f"row_count={row_count!r} is not one of {TABLE_ROW_COUNTS}")


def header_hit(index: dict[tuple[str, ...], list[int]], header: list[str], cells: list[str]) -> bool:
    """Whether the text names one of the row's cells and that cell's column header, both whole
    (the word-level twin of ``header_match``)."""
    return any(named_stretches(index, c) and named_stretches(index, h) for h, c in zip(header, cells))


def table_of_objects(objects: pl.DataFrame, text_separator: str = " ") -> tuple[str, list[str], list[list[str]]]:
    """(text, header, rows) of one example's long-form objects (module docstring)."""
    text = text_separator.join(objects.filter(pl.col("step") < 0).sort("step", maintain_order=True)["value"].to_list())
    table = objects.filter((pl.col("step") >= 0) & (pl.col("key") != ROW_MATCH_KEY))
    header = table["key"].unique(maintain_order=True).to_list()
    index = {k: i for i, k in enumerate(header)}
    rows: dict[int, list[str]] = {}
    for step, key, value in table.select("step", "key", "value").iter_rows():
        rows.setdefault(step, [""] * len(header))[index[key]] = value
    return text, header, [rows[s] for s in sorted(rows)]


def collate(examples: list[TableText], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad a batch: every FIELD as a [B, L] long tensor (``numeric_ids`` [B, L, 3]) plus
    ``attention_mask`` [B, L] bool."""
    L = max(len(e) for e in examples)
    out = {name: torch.zeros(len(examples), L, *((3,) if name == "numeric_ids" else ()), dtype=torch.long)
           for name in FIELDS}
    out["input_ids"].fill_(pad_id)
    mask = torch.zeros(len(examples), L, dtype=torch.bool)
    for b, e in enumerate(examples):
        for name in FIELDS:
            out[name][b, :len(e)] = torch.tensor(getattr(e, name))
        mask[b, :len(e)] = True
    out["attention_mask"] = mask
    return out


def table_words(header: list[str], rows: list[list[str]]) -> list[set[str]]:
    """A table's rows (header first), each as its set of lower-cased ``\\w+`` words."""
    return [set(WORD.findall(" ".join(row).lower())) for row in [header, *rows]]


def overlap_features(text: str, rows: list[set[str]]) -> list[float]:
    """Word-overlap features of a text and its table (:func:`table_words`): the shares of the
    text's distinct words found in the best and the second-best data row, in the whole table and
    in the header, and log(1 + the word count). None depends on the order of rows or columns.
    ``seqenc bench tables``' ``overlap_lr`` baseline reads them, and so does a table encoder's
    wide head (``TableConfig.table_wide``)."""
    words = set(WORD.findall(text.lower()))
    n = max(len(words), 1)
    header, body = (rows[0], rows[1:]) if rows else (set(), [])
    best = sorted((len(words & row) / n for row in body), reverse=True) + [0.0, 0.0]
    return [best[0], best[1], len(words & set().union(*rows)) / n, len(words & header) / n, math.log1p(len(words))]
