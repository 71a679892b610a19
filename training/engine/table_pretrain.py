"""Intermediate pre-training of a table encoder on lookup statements made from the task's own tables.

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
"""

from __future__ import annotations

import random
import re

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


class LookupCurriculum:
    """Batches of lookup statements over ``tables`` ((header, rows) each: the training split's,
    each once), stage by stage: ``stages`` row cuts (0: every row), ``steps`` in all."""

    def __init__(self, tables: list[tuple[list[str], list[list[str]]]], stages: list[int], steps: int, seed: int):
        self.stages, self.steps = list(stages) or [0], steps
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
        """``size`` examples (statement, header, rows cut to the stage) and their labels, half true."""
        index = min(len(self.stages) - 1, step * len(self.stages) // max(1, self.steps))
        usable = self.usable[index] or next(u for u in self.usable if u)
        cut = self.stages[index]
        examples, labels = [], []
        while len(examples) < size:
            header, body, key = usable[self.rng.randrange(len(usable))]
            rows = body[:cut] if cut else body
            truth = len(examples) % 2 == 0
            text = lookup_statement(header, rows, key, _candidates(rows, cut), truth, self.rng)
            if text is not None:
                examples.append((text, header, rows))
                labels.append(int(truth))
        return examples, labels


def _candidates(rows: list[list[str]], cut: int) -> int:
    return len(rows) if cut else min(len(rows), CANDIDATES)


def _key(body: list[list[str]], cut: int) -> int | None:
    rows = body[:cut] if cut else body
    candidates = rows[:_candidates(rows, cut)]
    return key_column(candidates) if len(candidates) >= 2 else None
