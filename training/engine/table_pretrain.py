"""Intermediate pre-training of a table encoder on statements made from the task's own tables.

TAPAS's table encoders learn that a cell belongs to its row in pre-training (Herzig et al. 2020)
and TabFact models gain from intermediate pre-training on synthetic statements (Eisenschlos et
al. 2020, "Understanding tables with intermediate pre-training"). A user's table task starts
from nothing of the kind, so before its own task a table encoder (training mode ``table``) first
learns statements that need exactly one row and one column, written from the **training
split's** tables (no label, no dev or test table is read)::

    the <column header> of <key cell> is <value>

true with the key's own row's value, false with the value of the same column in another row
(:func:`lookup_statement`). A lookup head (``TableConfig.table_lookup_head``, two logits on the
encoder's pooled output) reads them; the task head is untouched.

Curriculum (``TrainConfig.table_pretrain_rows``, the steps split evenly between stages): the
tables cut to their first 2 data rows, then 4, then as the encoder reads them (0) -- the same
statements get harder as the rows they hide among grow. Choices: a statement names only the
rows of its stage's cut, and in the last stage only the first ``CANDIDATES`` rows (so the row it
needs is inside what an encoder keeps of a long table); the key column is the leftmost whose
candidate cells are distinct and not all numbers (:func:`key_column`); tables without one are
not used.

**Statement kinds** (``TrainConfig.table_pretrain_kinds``, the registry :data:`STATEMENT_KINDS`;
each example draws one of the configured kinds, half the examples true). Besides the lookup
above, three kinds from the synthetic grammar of Eisenschlos et al. (2020, section 3: superlatives,
comparisons, counts), written in TabFact's lemmatised wording ("be", "have"):

* ``superlative``: "<key> have the highest|lowest <column>", over a numeric column (every cell a
  number, seqenc.table_numbers.parse_number) of the table as shown, whose extreme is one row;
  false with another named row;
* ``comparison``: "<key a> have a higher|lower <column> than <key b>", two named rows with
  different numbers; false with the other word;
* ``count``: "there be <n> <key header> with <column> <value>", n the rows whose cell is exactly
  the value (one drawn from the table); false with n - 1, n + 1 or n + 2 (at least 1).

Superlatives and counts are over every row the stage shows; an encoder that keeps only part of a
long table is in TabFact's own position there. Choices: the wording and the three kinds are the
grammar's simplest (no filters, no sums or averages); the draw is uniform over kinds.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from seqenc.table_numbers import parse_number

NUMBER = re.compile(r"^[\d\s.,:/%+-]*$")
CANDIDATES = 8  # the rows a statement may name when the whole table is shown


def key_column(rows: list[list[str]]) -> int | None:
    """The leftmost column whose cells in ``rows`` are distinct and non-empty, preferring one
    that is not all numbers; None when no column is distinct."""
    distinct = [c for c in range(len(rows[0]))
                if all(r[c].strip() for r in rows) and len({r[c] for r in rows}) == len(rows)]
    words = [c for c in distinct if not all(NUMBER.match(r[c]) for r in rows)]
    return (words or distinct or [None])[0]


def lookup_statement(header: list[str], body: list[list[str]], key: int, candidates: int, truth: bool,
                     rng: random.Random) -> str | None:
    """One statement about the first ``candidates`` rows of ``body`` with key column ``key``,
    true or not as ``truth`` says; None when 20 draws found no (row, column) whose column has
    another value to swap in and whose key names one row of the table."""
    rows = body[:candidates]
    for _ in range(20):
        r = rng.randrange(len(rows))
        c = rng.choice([j for j in range(len(header)) if j != key])
        value = rows[r][c].strip()
        others = sorted({row[c].strip() for row in rows} - {value, ""})
        unique_key = sum(row[key] == rows[r][key] for row in body) == 1  # the table names one row
        if value and header[c].strip() and others and unique_key:
            shown = value if truth else rng.choice(others)
            return f"the {header[c].strip()} of {rows[r][key].strip()} is {shown}"
    return None


def _numbers(rows: list[list[str]], column: int) -> list[float] | None:
    """Every cell of ``column`` in ``rows`` as a number; None when one is not a number."""
    values = [parse_number(row[column]) for row in rows]
    return None if any(v is None for v in values) else values


def _named(body: list[list[str]], key: int, candidates: int) -> list[int]:
    """The rows among the first ``candidates`` whose key cell names one row of ``body``."""
    return [i for i, row in enumerate(body[:candidates])
            if row[key].strip() and sum(other[key] == row[key] for other in body) == 1]


def _columns(header: list[str], key: int) -> list[int]:
    return [j for j in range(len(header)) if j != key and header[j].strip()]


def superlative_statement(header: list[str], body: list[list[str]], key: int, candidates: int, truth: bool,
                          rng: random.Random) -> str | None:
    """"<key> have the highest|lowest <column>" (module docstring); None when 20 draws found no
    numeric column whose extreme is one row, with a named row to say it of."""
    named, columns = _named(body, key, candidates), _columns(header, key)
    for _ in range(20 if columns else 0):
        c = rng.choice(columns)
        values = _numbers(body, c)
        if values is None or len(set(values)) < 2:
            continue
        most = rng.choice(("highest", "lowest"))
        best = max(values) if most == "highest" else min(values)
        if values.count(best) != 1:
            continue
        pool = [i for i in named if (values[i] == best) == truth]
        if pool:
            return f"{body[rng.choice(pool)][key].strip()} have the {most} {header[c].strip()}"
    return None


def comparison_statement(header: list[str], body: list[list[str]], key: int, candidates: int, truth: bool,
                         rng: random.Random) -> str | None:
    """"<key a> have a higher|lower <column> than <key b>" (module docstring); None when 20 draws
    found no numeric column with two named rows of different numbers."""
    named, columns = _named(body, key, candidates), _columns(header, key)
    for _ in range(20 if columns and len(named) >= 2 else 0):
        c = rng.choice(columns)
        values = _numbers(body, c)
        a, b = rng.sample(named, 2)
        if values is None or values[a] == values[b]:
            continue
        word = "higher" if (values[a] > values[b]) == truth else "lower"
        return f"{body[a][key].strip()} have a {word} {header[c].strip()} than {body[b][key].strip()}"
    return None


def count_statement(header: list[str], body: list[list[str]], key: int, candidates: int, truth: bool,
                    rng: random.Random) -> str | None:
    """"there be <n> <key header> with <column> <value>" (module docstring); None when 20 draws
    found no non-empty cell under a named column."""
    columns = _columns(header, key)
    for _ in range(20 if columns and header[key].strip() else 0):
        c = rng.choice(columns)
        value = body[rng.randrange(len(body))][c].strip()
        if not value:
            continue
        n = sum(row[c].strip() == value for row in body)
        shown = n if truth else rng.choice([m for m in (n - 1, n + 1, n + 2) if m >= 1])
        return f"there be {shown} {header[key].strip()} with {header[c].strip()} {value}"
    return None


Statement = Callable[[list[str], list[list[str]], int, int, bool, random.Random], "str | None"]
# every kind of pre-training statement, by the name TrainConfig.table_pretrain_kinds uses
STATEMENT_KINDS: dict[str, Statement] = {"lookup": lookup_statement, "superlative": superlative_statement,
                                         "comparison": comparison_statement, "count": count_statement}
MAX_MISSES = 1000  # draws in a row that wrote no statement before a batch gives up


def check_kinds(kinds: list[str] | tuple[str, ...]) -> None:
    """A clear error unless ``kinds`` is a non-empty list of STATEMENT_KINDS' names."""
    if not kinds or set(kinds) - set(STATEMENT_KINDS):
        raise ValueError(f"table_pretrain_kinds {list(kinds)}: each must be one of {sorted(STATEMENT_KINDS)}")


class LookupCurriculum:
    """Batches of pre-training statements over ``tables`` ((header, rows) each: the training
    split's, each once), stage by stage: ``stages`` row cuts (0: every row), ``steps`` in all;
    each statement of one of ``kinds`` (STATEMENT_KINDS)."""

    def __init__(self, tables: list[tuple[list[str], list[list[str]]]], stages: list[int], steps: int, seed: int,
                 kinds: list[str] | tuple[str, ...] = ("lookup",)):
        check_kinds(kinds)
        self.stages, self.steps, self.kinds = list(stages) or [0], steps, [STATEMENT_KINDS[k] for k in kinds]
        self.rng = random.Random(seed)
        # per stage: the tables it can use, with their key column over the stage's rows
        self.usable = [[(h, b, k) for h, b in tables for k in [_key(b, cut)] if k is not None and len(h) >= 2]
                       for cut in self.stages]
        if not any(self.usable):
            raise ValueError("no training table has two rows and a column of distinct cells to look up: "
                             "set table_pretrain_steps to 0 for this task")

    def stage(self, step: int) -> int:
        """The row cut of update ``step`` (0: the whole table)."""
        return self.stages[min(len(self.stages) - 1, step * len(self.stages) // max(1, self.steps))]

    def batch(self, step: int, size: int) -> tuple[list[tuple[str, list[str], list[list[str]]]], list[int]]:
        """``size`` examples (statement, header, rows cut to the stage) and their labels, half true.
        One kind (the default, lookup) draws exactly what the lookup curriculum always drew."""
        index = min(len(self.stages) - 1, step * len(self.stages) // max(1, self.steps))
        usable = self.usable[index] or next(u for u in self.usable if u)
        cut = self.stages[index]
        examples, labels, misses = [], [], 0
        while len(examples) < size:
            header, body, key = usable[self.rng.randrange(len(usable))]
            write = self.kinds[0] if len(self.kinds) == 1 else self.rng.choice(self.kinds)
            rows = body[:cut] if cut else body
            truth = len(examples) % 2 == 0
            text = write(header, rows, key, _candidates(rows, cut), truth, self.rng)
            if text is not None:
                examples.append((text, header, rows))
                labels.append(int(truth))
                misses = 0
            elif (misses := misses + 1) >= MAX_MISSES:
                raise ValueError(f"no training table gave a pre-training statement in {MAX_MISSES} draws (stage "
                                 f"{cut or 'whole tables'}): choose other table_pretrain_kinds or set "
                                 "table_pretrain_steps to 0")
        return examples, labels


def _candidates(rows: list[list[str]], cut: int) -> int:
    return len(rows) if cut else min(len(rows), CANDIDATES)


def _key(body: list[list[str]], cut: int) -> int | None:
    rows = body[:cut] if cut else body
    candidates = rows[:_candidates(rows, cut)]
    return key_column(candidates) if len(candidates) >= 2 else None
