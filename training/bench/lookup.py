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
import re
from pathlib import Path

from seqenc.catalog import UnsafeName, check_name

NUMBER = re.compile(r"^[\d\s.,:/%+-]*$")


def read_table(path: Path) -> list[list[str]]:
    """A ``#``-separated table: header first; rows of another width than the header dropped."""
    rows = [line.split("#") for line in path.read_text().splitlines() if line.strip()]
    return [rows[0]] + [r for r in rows[1:] if len(r) == len(rows[0])] if rows else []


def key_column(rows: list[list[str]]) -> int | None:
    """The leftmost column whose cells in ``rows`` are distinct and non-empty, preferring one
    that is not all numbers; None when no column is distinct."""
    distinct = [c for c in range(len(rows[0]))
                if all(r[c].strip() for r in rows) and len({r[c] for r in rows}) == len(rows)]
    words = [c for c in distinct if not all(NUMBER.match(r[c]) for r in rows)]
    return (words or distinct or [None])[0]


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
        for _ in range(20):  # a (row, column) pair whose column has another value to swap in
            r = rng.randrange(len(candidates))
            c = rng.choice([j for j in range(len(header)) if j != key])
            value = candidates[r][c].strip()
            others = sorted({row[c].strip() for row in candidates} - {value, ""})
            unique_key = sum(row[key] == candidates[r][key] for row in body) == 1  # the table names one row
            if value and header[c].strip() and others and unique_key:
                break
        else:
            return out
        shown = value if truth else rng.choice(others)
        out.append({"table": name, "statement": f"the {header[c].strip()} of {candidates[r][key].strip()} is {shown}",
                    "label": int(truth), "caption": caption})
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
