"""Cell-lookup statements over tables (training.bench.lookup): true ones name the row's own cell,
false ones another candidate row's cell of the same column; the CLI writes them and the cut tables."""

import json
import random

import pytest

from parsers.names import UnsafeName
from training.bench.lookup import key_column, lookup_statements, read_table, table_statements, write_lookup_statements
from training.cli.main import main

TABLE = """rank#player#team#points
1#ann lee#red#30
2#bo kim#blue#28
3#cy dee#red#25
4#di fox#green#25
5#ed gray#blue#20
6#fa hu#white#18
"""


def _tables(tmp_path):
    folder = tmp_path / "tables"
    folder.mkdir()
    (folder / "t1.csv").write_text(TABLE)
    (folder / "same.csv").write_text("a#b\nx#1\nx#2\n")  # no distinct column: skipped
    return folder


def test_key_column_prefers_distinct_words():
    rows = read_table_text(TABLE)[1:]
    assert key_column(rows) == 1  # rank is distinct but all numbers; player is the leftmost distinct words
    assert key_column([["1", "a"], ["2", "a"]]) == 0  # only numbers are distinct: fall back to them
    assert key_column([["x", "a"], ["x", "a"]]) is None


def read_table_text(text):
    return [line.split("#") for line in text.splitlines() if line.strip()]


def test_statements_need_the_row_and_the_column(tmp_path):
    folder = _tables(tmp_path)
    rows = read_table(folder / "t1.csv")
    header, body = rows[0], rows[1:]
    made = lookup_statements(folder, ["t1.csv", "same.csv"], per_table=40, seed=3, max_rows=4)
    assert len(made) == 40 and sum(s["label"] for s in made) == 20  # half true; same.csv has no key
    seen_false = 0
    for s in made:
        column, rest = s["statement"].removeprefix("the ").split(" of ", 1)
        key, value = rest.split(" is ", 1)
        c = header.index(column)
        row = next(r for r in body[:4] if r[1] == key)  # the key names one of the first max_rows rows
        assert c != 1
        if s["label"]:
            assert row[c] == value
        else:  # another candidate row's value of the same column: in the table, so no shortcut
            assert value != row[c] and value in {r[c] for r in body[:4]}
            seen_false += 1
    assert seen_false == 20
    assert lookup_statements(folder, ["t1.csv"], per_table=40, seed=3, max_rows=4) == made[:40]  # seeded
    assert lookup_statements(folder, ["t1.csv"], per_table=8, seed=4, max_rows=4) != \
        lookup_statements(folder, ["t1.csv"], per_table=8, seed=5, max_rows=4)


def test_cli_writes_statements_and_cut_tables(tmp_path, capsys):
    folder = _tables(tmp_path)
    names = tmp_path / "from.jsonl"
    names.write_text("".join(json.dumps({"table": n, "statement": "x", "label": 1, "caption": "c"}) + "\n"
                             for n in ("t1.csv", "t1.csv", "same.csv")))
    out, cut = tmp_path / "lookup.jsonl", tmp_path / "cut"
    assert main(["bench", "table-lookup", "--tables", str(folder), "--from", str(names), "--out", str(out),
                 "--per-table", "6", "--max-rows", "3", "--tables-out", str(cut)]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 6 and {x["table"] for x in lines} == {"t1.csv"} and lines[0]["caption"] == "c"
    assert '"skipped_tables": 1' in capsys.readouterr().out
    assert (cut / "t1.csv").read_text() == "".join(line + "\n" for line in TABLE.splitlines()[:4])
    assert not (cut / "same.csv").exists()
    # a table name that would leave --tables is refused, in one line
    names.write_text(json.dumps({"table": "../t1.csv", "statement": "x", "label": 1}) + "\n")
    with pytest.raises(UnsafeName, match="line 1: .*table name"):
        write_lookup_statements(folder, names, out)
    assert main(["bench", "table-lookup", "--tables", str(folder), "--from", str(names), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "line 1" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_false_values_come_from_the_candidate_rows():
    rng = random.Random(0)
    rows = read_table_text(TABLE)
    for s in table_statements("t", rows, 30, rng, max_rows=2):
        value = s["statement"].rsplit(" is ", 1)[1]
        assert value in {cell for r in rows[1:3] for cell in r}
