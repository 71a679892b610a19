"""parsers.tables: tables and texts as key-value objects (a real TabFact table round trip, CSV
quoting, Parquet, bad rows, texts with labels), through the CLI and the landing as well."""

import json

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shared_data import DATA, require

from parsers import storage
from parsers.landing import file_kind
from parsers.tables import column_names, ingest_table, ingest_text, sniff_delimiter
from seqenc.sequences import collect_value_sequences
from training.cli.main import main
from training.tasks.catalog import CatalogError, load_catalog

TABFACT = DATA / "tabfact"


def test_a_tabfact_table_round_trips_as_one_sequence_of_rows(tmp_path):
    path = require(TABFACT) / "tables" / "1-10236830-6.html.csv"
    lines = path.read_text().splitlines()
    header, rows = lines[0].split("#"), [line.split("#") for line in lines[1:]]
    for _ in range(2):  # a second ingest of the same file replaces its part: nothing twice
        report = ingest_table(path, tmp_path, source="tabfact", ingest_date="2025-01-01")
    objects = storage.read_objects(tmp_path, "tabfact")
    assert report["parsed"] == len(rows) and report["rejected"] == 0 and report["columns"] == len(header)
    assert objects.height == len(rows) * len(header) and objects["sequence_id"].unique().to_list() == [path.name]
    # S(k) of a column is exactly the column's cells in row order
    s = {k: v for k, v in zip(*collect_value_sequences(objects).select("key", "values").to_dict(as_series=False).values())}
    assert set(s) == set(header)
    for c, name in enumerate(header):
        assert s[name] == [row[c] for row in rows]


def test_quoted_csv_tsv_and_parquet_give_the_same_objects(tmp_path):
    rows = [["city", "note", ""], ["Paris", 'says "hi", twice', "1"], ["Lyon", "two\nlines", ""]]
    csv_path = tmp_path / "t.csv"
    csv_path.write_text('city,note,\nParis,"says ""hi"", twice",1\nLyon,"two\nlines",\n')
    pl.DataFrame({"city": ["Paris", "Lyon"], "note": [rows[1][1], rows[2][1]], "column_3": ["1", ""]}) \
        .write_parquet(tmp_path / "t.parquet")
    (tmp_path / "t.tsv").write_text("city\tnote\t\nParis\t" + rows[1][1] + "\t1\n")
    got = {}
    for name in ("t.csv", "t.parquet", "t.tsv"):
        report = ingest_table(tmp_path / name, tmp_path / "root", source=name.replace(".", "_"), table_id="t")
        got[name] = storage.read_objects(tmp_path / "root", name.replace(".", "_")).select("step", "key", "value")
        assert report["rejected"] == 0
    assert got["t.csv"].equals(got["t.parquet"])  # the blank header named column_3 in both
    assert got["t.tsv"].equals(got["t.csv"].filter(pl.col("step") == 0))
    assert got["t.csv"].filter(pl.col("key") == "note")["value"].to_list() == ['says "hi", twice', "two\nlines"]


def test_bad_rows_are_rejected_with_a_reason_and_the_rest_kept(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_bytes(b"a;b;a\n1;2;3\n1;2\n\n\xff\xfe;x;y\n4;5;6\n")
    report = ingest_table(path, tmp_path / "root", source="t", delimiter=";")
    assert (report["read"], report["parsed"], report["rejected"], report["blank"]) == (5, 2, 2, 1)
    assert report["renamed"] == {"3": "a_2"}
    rejects = storage.read_rejects(tmp_path / "root", "t")
    assert sorted(rejects["reason"].to_list()) == ["row has 2 fields, the header has 3", "undecodable bytes (not UTF-8)"]
    with pytest.raises(ValueError, match="no header"):
        (tmp_path / "empty.csv").write_text("\n\n")
        ingest_table(tmp_path / "empty.csv", tmp_path / "root", source="t", delimiter=",")


def test_header_names_and_delimiter_sniffing():
    assert column_names(["x", "", "x", "x"]) == (["x", "column_2", "x_2", "x_3"], {"2": "column_2", "3": "x_2",
                                                                                  "4": "x_3"})
    assert sniff_delimiter(["a#b#c", "1#2, 3#4"]) == "#" and sniff_delimiter(["a,b", '"1,5",2']) == ","
    with pytest.raises(ValueError, match="--delimiter"):
        sniff_delimiter(["just one column", "x"])


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.binary(max_size=300))
def test_table_ingest_counts_add_up_for_any_bytes(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("tb")
    (tmp / "x.csv").write_bytes(b"k1,k2\n" + data)
    try:
        report = ingest_table(tmp / "x.csv", tmp / "root", source="t", delimiter=",")
    except storage.RejectShareExceeded:
        return
    assert report["read"] == report["parsed"] + report["rejected"] + report["blank"], report
    assert storage.read_objects(tmp / "root", "t").height == 2 * report["parsed"]


def test_texts_become_objects_and_their_labels_stay_out_of_them(tmp_path):
    path = tmp_path / "statements.jsonl"
    records = [{"id": "s1", "statement": "a won. b lost!", "table": "t1.csv", "label": 1},
               {"id": "s2", "statement": "c drew", "table": "t1.csv", "label": 0},
               {"statement": "no id"}]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n[1, 2]\n")
    report = ingest_text(path, tmp_path, source="st", text_field="statement", id_field="id", units="sentences",
                         label_field="label")
    assert (report["read"], report["parsed"], report["rejected"], report["labels"]) == (4, 2, 2, 2)
    objects = storage.read_objects(tmp_path, "st")
    assert objects.filter(pl.col("key") == "statement")["value"].to_list() == ["a won.", "b lost!", "c drew"]
    assert "label" not in objects["key"].to_list() and set(objects["key"]) == {"statement", "table"}
    labels = storage.read_labels(tmp_path, "st")
    assert dict(zip(labels["sequence_id"], labels["label"])) == {"s1": "1", "s2": "0"}
    doc = tmp_path / "doc.txt"
    doc.write_text("first line\n\nsecond line\n")
    ingest_text(doc, tmp_path, source="docs", units="lines")
    assert storage.read_objects(tmp_path, "docs")["value"].to_list() == ["first line", "second line"]


def test_cli_and_catalogue_ingest_tables_and_texts(tmp_path, capsys):
    tables = tmp_path / "tables"
    tables.mkdir()
    (tables / "t1.csv").write_text("name#score\nann#3\nbob#5\n")
    (tables / "t2.csv").write_text("name#score\ncy#1\n")
    (tmp_path / "st.jsonl").write_text('{"statement": "ann beat bob", "table": "t1.csv", "label": 0}\n')
    catalog = tmp_path / "seqenc.toml"
    catalog.write_text('[sources.tab]\nkind = "tables"\npath = "tables/*.csv"\ndelimiter = "#"\n\n'
                       '[sources.st]\nkind = "texts"\ntext_field = "statement"\nlabel_field = "label"\n')
    root = str(tmp_path / "root")
    assert main(["ingest", "table", "--root", root, "--source", "tab", "--catalog", str(catalog)]) == 0
    assert main(["ingest", "text", str(tmp_path / "st.jsonl"), "--root", root, "--source", "st",
                 "--catalog", str(catalog)]) == 0
    assert storage.read_objects(root, "tab")["sequence_id"].unique().sort().to_list() == ["t1.csv", "t2.csv"]
    assert storage.read_labels(root, "st")["label"].to_list() == ["0"]
    assert file_kind("x.csv", "tables") == "tables" and file_kind("x.jsonl", "texts") == "texts"
    assert file_kind("x_labels.csv", "tables") == "tables" and file_kind("x_labels.csv") == "labels"
    assert file_kind("x.csv") is None
    bad = tmp_path / "bad.toml"
    bad.write_text('[sources.x]\nkind = "logs"\ndelimiter = ","\n')
    with pytest.raises(CatalogError, match="delimiter"):
        load_catalog(bad)
