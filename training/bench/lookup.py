"""Cell-lookup statements over real tables: a table-text task a small model can learn on a CPU.

On TabFact itself no table model of ours learns at a CPU budget (docs/tables.md: every variant
at chance, below a bag of words that never reads the table), so an ablation there compares
noise. This task keeps TabFact's real tables and layout and replaces the statements by ones
whose truth needs exactly one row and one column of the table::

    the <column header> of <key cell> is <value>

True statements name the row's own value; false ones a value of the **same column in another
row**, so every word of every statement occurs in its table and a reader of the statement
alone (``bow_lr``) stays at chance: the model has to find the row of the key and compare the
cell. Choices (none in a paper; fixed before any run):

* the key column is the leftmost whose cells in the candidate rows are distinct and not all
  numbers (else the leftmost distinct one); tables without one are skipped;
* candidate rows are the first ``max_rows`` data rows (8), so the row a statement needs is
  inside what every variant reads (the flattened encoders cut at ``max_table_tokens``);
* a table gives ``per_table`` statements (8), half true and half false, each on a row and a
  target column drawn with the seed; a false value is drawn from the column's other values in
  the candidate rows (a value from a row past the cut would be a shortcut: absent from the input);
* ``--tables-out DIR`` writes each table cut to its header and candidate rows, so that every
  variant reads the whole table and a FiD-style model encodes ``max_rows`` blocks, not dozens.

``seqenc bench table-lookup --tables DIR --from FILE --out FILE [--tables-out DIR]`` writes them
as JSON Lines in TabFact's layout (``table``, ``statement``, ``label``, ``caption``) over the
tables that ``--from`` names, for ``seqenc bench tables --train`` (``--tables`` the cut ones).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from parsers.names import UnsafeName, check_name
from training.engine.table_pretrain import key_column, lookup_statement

__all__ = ["key_column", "lookup_statements", "read_table", "synthetic_lookup", "table_statements",
           "write_lookup_statements"]

def read_table(path: Path) -> list[list[str]]:
    """A ``#``-separated table: header first; rows of another width than the header dropped."""
    rows = [line.split("#") for line in path.read_text().splitlines() if line.strip()]
    return [rows[0]] + [r for r in rows[1:] if len(r) == len(rows[0])] if rows else []


def table_statements(name: str, rows: list[list[str]], per_table: int, rng: random.Random,
                     max_rows: int = 8, caption: str = "") -> list[dict]:
    """``per_table`` statements on one table (header + data rows), half true; [] when the table
    has no key column, fewer than two candidate rows or no column whose value can be swapped."""
    header, body = rows[0], rows[1:]
    candidates = body[:max_rows]
    if len(candidates) < 2 or len(header) < 2:
        return []
    key = key_column(candidates)
    if key is None:
        return []
    out = []
    for i in range(per_table):
        truth = i % 2 == 0
        statement = lookup_statement(header, body, key, max_rows, truth, rng)
        if statement is None:
            return out
        out.append({"table": name, "statement": statement, "label": int(truth), "caption": caption})
    return out


def lookup_statements(tables_dir: str | Path, names: list[str], per_table: int = 8, seed: int = 0,
                      max_rows: int = 8, captions: dict[str, str] | None = None) -> list[dict]:
    """Statements over the tables ``names`` (in that order) of ``tables_dir``, seeded."""
    rng = random.Random(seed)
    out = []
    for name in names:
        path = Path(tables_dir) / name
        if not path.is_file():
            raise FileNotFoundError(f"table {name} is not in {tables_dir}")
        rows = read_table(path)
        if rows:
            out += table_statements(name, rows, per_table, rng, max_rows, (captions or {}).get(name, ""))
    return out


def write_lookup_statements(tables_dir: str | Path, from_file: str | Path, out: str | Path, per_table: int = 8,
                            seed: int = 0, max_rows: int = 8, tables_out: str | Path | None = None) -> dict:
    """The statements over the tables named in ``from_file`` (JSON Lines with ``table``, as
    TabFact's), written to ``out``; with ``tables_out`` each used table cut to its header and
    first ``max_rows`` rows is written there. Returns counts."""
    names, captions = [], {}
    for number, line in enumerate(Path(from_file).read_text().splitlines(), 1):
        if line.strip():
            record = json.loads(line)
            if "table" not in record:
                raise ValueError(f"{from_file} line {number}: no 'table' field")
            try:  # a table name becomes a path under --tables / --tables-out
                name = check_name(record["table"], "table name")
            except UnsafeName as e:
                raise UnsafeName(f"{from_file} line {number}: {e}") from None
            if name not in captions:
                names.append(name)
                captions[name] = record.get("caption", "")
    rows = lookup_statements(tables_dir, names, per_table, seed, max_rows, captions)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    used = sorted({r["table"] for r in rows})
    if tables_out is not None:
        Path(tables_out).mkdir(parents=True, exist_ok=True)
        for name in used:
            cut = read_table(Path(tables_dir) / name)[:max_rows + 1]
            (Path(tables_out) / name).write_text("".join("#".join(r) + "\n" for r in cut))
    return {"statements": len(rows), "tables": len(used), "skipped_tables": len(names) - len(used),
            "entailed": sum(r["label"] for r in rows)}


def synthetic_lookup(tables_out: str | Path, out: str | Path, n_tables: int = 200, rows: int = 2, columns: int = 3,
                     vocabulary: int = 40, per_table: int = 4, seed: int = 0) -> dict:
    """A tiny lookup task a small model must learn quickly (tests/test_table_learning.py: a test
    that fails when learning breaks): ``n_tables`` tables of ``rows`` data rows and ``columns``
    columns, the cells of a table distinct words drawn from ``vocabulary`` words ``w0 ...`` (so
    a statement's truth never hangs on a coincidence), header ``c0 ...``, column 0 the keys. Statements as :func:`table_statements`'s: "the c<j> of <key> is <value>", half
    true, a false value taken from another row of the same column (so a bag of words, and a reader
    of the statement alone, stay at chance). Written in TabFact's layout; returns counts."""
    if rows < 2 or columns < 2 or vocabulary < rows * columns:
        raise ValueError("a lookup table needs at least 2 rows, 2 columns and a word for each of its cells")
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocabulary)]
    Path(tables_out).mkdir(parents=True, exist_ok=True)
    records = []
    for t in range(n_tables):
        name = f"t{t}.csv"
        cells = rng.sample(words, rows * columns)
        body = [cells[r * columns:(r + 1) * columns] for r in range(rows)]
        (Path(tables_out) / name).write_text("".join("#".join(r) + "\n" for r in [[f"c{j}" for j in range(columns)],
                                                                               *body]))
        for i in range(per_table):
            truth = i % 2 == 0
            r, c = rng.randrange(rows), rng.randrange(1, columns)
            others = [row[c] for row in body if row is not body[r]]
            value = body[r][c] if truth else rng.choice(others)
            records.append({"table": name, "statement": f"the c{c} of {body[r][0]} is {value}", "label": int(truth),
                            "caption": ""})
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("".join(json.dumps(x) + "\n" for x in records))
    return {"statements": len(records), "tables": n_tables, "entailed": sum(x["label"] for x in records)}
