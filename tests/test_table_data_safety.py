"""Nothing lost, merged or leaked in the table and text paths: each case gets a clear error or a
count, never silence (issue 48, point 4)."""

import json

import polars as pl
import pytest
from cli_error import cli_error

from parsers import storage
from parsers.landing import file_kind
from parsers.tables import ingest_table, ingest_text, label_leaks
from training.cli.main import main
from training.tasks.catalog import Task
from training.tasks.spec import TaskSpec


def test_tables_of_the_same_name_in_two_folders_are_refused_before_anything_is_written(tmp_path):
    for folder, cell in (("a", "1"), ("b", "2")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "t.csv").write_text(f"name,score\nann,{cell}\n")
    root = tmp_path / "root"
    msg = cli_error(["ingest", "table", str(tmp_path / "a" / "t.csv"), str(tmp_path / "b" / "t.csv"),
                  "--root", str(root), "--source", "tables"])
    assert "same file name" in msg and "rename one" in msg
    assert not (root / "objects").exists()
    # x.csv beside x.csv.gz would share a part too
    (tmp_path / "a" / "t.csv.gz").write_bytes(b"")
    assert "same file name" in cli_error(["ingest", "table", str(tmp_path / "a" / "t.csv"), str(tmp_path / "a" / "t.csv.gz"),
                                       "--root", str(root), "--source", "tables"])


def test_names_that_differ_in_unsafe_characters_keep_their_own_parts(tmp_path):
    """``q 1.csv`` and ``q_1.csv`` are two tables: their parts differ (the sanitised name gets a
    hash of the real one), so neither overwrites the other."""
    (tmp_path / "q 1.csv").write_text("name,score\nann,1\n")
    (tmp_path / "q_1.csv").write_text("name,score\nbob,2\n")
    for name in ("q 1.csv", "q_1.csv"):
        ingest_table(tmp_path / name, tmp_path / "root", source="tables", ingest_date="2025-01-01")
    assert storage.part_name("q 1.csv") != storage.part_name("q_1.csv") == "part-q_1.csv.parquet"
    objects = storage.read_objects(tmp_path / "root", "tables")
    assert sorted(objects["sequence_id"].unique().to_list()) == ["q 1.csv", "q_1.csv"]


def test_a_text_file_landed_on_two_days_keeps_both_days_sequences_and_labels(tmp_path):
    path = tmp_path / "statements.jsonl"
    root = tmp_path / "root"
    for day, label in (("2025-01-01", 1), ("2025-01-02", 0)):
        path.write_text(json.dumps({"statement": f"made on {day}", "table": "t.csv", "label": label}) + "\n")
        ingest_text(path, root, source="st", text_field="statement", label_field="label", ingest_date=day)
    objects = storage.read_objects(root, "st")
    ids = sorted(objects["sequence_id"].unique().to_list())
    assert ids == ["statements.jsonl@2025-01-01:1", "statements.jsonl@2025-01-02:1"]  # not merged
    labels, report = storage.unique_labels(root, "st")
    assert dict(labels.iter_rows()) == {ids[0]: "1", ids[1]: "0"} and report["conflicts"] == 0
    # ingesting the first day's file again replaces that day's labels, nothing doubles
    path.write_text(json.dumps({"statement": "made on 2025-01-01", "table": "t.csv", "label": 1}) + "\n")
    ingest_text(path, root, source="st", text_field="statement", label_field="label", ingest_date="2025-01-01")
    assert storage.read_labels(root, "st").height == 2


def test_a_table_task_is_split_by_table_unless_the_user_says_otherwise():
    assert Task(source="st", kind="binary", positive="1", table_source="tables").split == "grouped"
    assert Task(source="st", kind="binary", positive="1", table_source="tables", split="stratified").split == "stratified"
    assert Task(source="st", kind="binary", positive="1").split == "stratified"


def test_a_file_named_labels_in_a_tables_source_is_a_table():
    assert file_kind("labels.csv", "tables") == "tables" and file_kind("team_labels.csv", "tables") == "tables"
    assert file_kind("labels.csv", "events") == "labels" and file_kind("labels.csv") == "labels"


def test_labels_that_name_no_sequence_and_labels_that_disagree_are_counted(tmp_path, caplog):
    """Unmatched labels are counted (and logged) where they used to vanish; two label files that
    disagree resolve to the newest ingest -- whatever the files are called -- with a count and a
    warning naming both."""
    root = tmp_path / "root"
    path = tmp_path / "st.jsonl"
    path.write_text("".join(json.dumps({"id": f"s{i}", "statement": f"s{i}", "label": i % 2}) + "\n" for i in range(6)))
    ingest_text(path, root, source="st", text_field="statement", id_field="id", label_field="label",
                ingest_date="2025-01-01")
    # a later, corrected label file, named so that it sorts first, and a label for no sequence
    (tmp_path / "a_fix.csv").write_text("id,label\ns0,1\nghost,0\n")
    from parsers.logs import ingest_labels

    ingest_labels(tmp_path / "a_fix.csv", root, "st")
    with caplog.at_level("WARNING"):
        labels, report = storage.unique_labels(root, "st")
    assert report["conflicts"] == 1 and report["conflict_examples"][0]["sequence_id"] == "s0"
    assert dict(labels.iter_rows())["s0"] == "1"  # the newest ingest wins
    assert "disagreeing labels" in caplog.text

    from training.tasks.catalog import Task as T
    from training.tasks.task_data import task_input

    inp = task_input(TaskSpec("t", T(source="st", kind="binary", positive="1")), root)
    assert inp.label_report == {"labels_unmatched": 1, "label_conflicts": 1}


def test_mode_table_on_a_task_without_tables_is_refused(tmp_path):
    with pytest.raises(ValueError, match="table_source"):
        Task(source="st", kind="binary", positive="1", mode="table")
    from byod_data import write_byod

    made = write_byod(tmp_path, n_orders=30, n_sessions=6)
    orders, catalog = made["orders"], made["catalog"]
    root = tmp_path / "work" / "data"
    assert main(["ingest", "events", str(orders["events"]), "--root", str(root), "--source", "orders",
                 "--catalog", str(catalog), "--labels", str(orders["stage"])]) == 0
    msg = cli_error(["train", "--catalog", str(catalog), "--task", "order_stage", "--workdir", str(tmp_path / "work"),
                  "--mode", "table", "--size", "tiny", "--no-progress"])
    assert "no table_source" in msg and "--mode table" in msg


def test_a_text_field_that_gives_the_label_away_is_reported(tmp_path, caplog):
    path = tmp_path / "qa.jsonl"
    records = [{"statement": f"claim {i}", "answer": "yes" if i % 2 else "no", "topic": f"t{i % 3}",
                "table": f"t{i}.csv", "label": i % 2} for i in range(40)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with caplog.at_level("WARNING"):
        report = ingest_text(path, tmp_path / "root", source="qa", text_field="statement", label_field="label")
    assert report["label_leaks"] == {"answer": 1.0}  # topic says nothing; table is one per record (an id)
    assert "answer" in caplog.text and "exclude_keys" in caplog.text
    assert label_leaks({"k": [("a", "1"), ("b", "0")] * 3}, 6) == {"k": 1.0}
    assert label_leaks({"k": [("a", "1"), ("a", "0")] * 3}, 6) == {}


def test_split_key_holds_an_official_test_set(tmp_path):
    """A task's split_key: sequences with "test" there are the test split; the others are split
    as declared with their test share in train; the key is never model input."""
    import numpy as np

    from training.tasks.task_data import assign_splits

    task = Task(source="st", kind="binary", positive="1", split_key="official")
    assert "official" in task.exclude_keys
    ids = [f"s{i}" for i in range(100)]
    given = pl.DataFrame({"sequence_id": ids[:30], "group": ["test"] * 30})
    split = dict(zip(ids, assign_splits(ids, np.array([i % 2 for i in range(100)]), "stratified", 0, task, given=given)))
    assert all(split[s] == "test" for s in ids[:30]) and set(split[s] for s in ids[30:]) == {"train", "dev"}
    with pytest.raises(ValueError, match="must be one of"):
        assign_splits(ids, np.zeros(100, dtype=np.int64), "stratified", 0, task,
                      given=pl.DataFrame({"sequence_id": ["s0"], "group": ["holdout"]}))


def test_texts_that_name_no_table_are_an_error_or_a_count(tmp_path, caplog):
    from training.tasks.table_task import join_tables

    texts = pl.LazyFrame({"sequence_id": ["a", "a", "b", "b"], "step": [0, 1, 0, 1], "ts": [None] * 4,
                          "key": ["claim", "sheet", "claim", "sheet"], "value": ["x", "t.csv", "y", "t.csv"],
                          "template_id": [None] * 4})
    with pytest.raises(ValueError, match=r"no text has the field 'table'.*fields: claim, sheet.*table_key"):
        join_tables(texts, tmp_path, "tables", "table")
    one_named = texts.with_columns(key=pl.when(pl.col("sequence_id") == "a").then(pl.col("key"))
                                   .otherwise(pl.col("key").replace("sheet", "other")))
    (tmp_path / "t.csv").write_text("name,score\nann,1\n")
    ingest_table(tmp_path / "t.csv", tmp_path / "root", source="tables", delimiter=",")
    with caplog.at_level("WARNING"):
        join_tables(one_named, tmp_path / "root", "tables", "sheet")
    assert "1 of 2 texts have no 'sheet' field" in caplog.text


def test_each_table_row_gets_an_object_saying_what_of_its_text_it_names(tmp_path):
    """TVM-KA reads a table by columns, so the row relation comes as one more key: per row, how
    many things of the text it names and whether one sits under a header the text names
    (training.tasks.table_task.row_match_rows). The table
    encoders rebuild the table without it (they have their row-match ids)."""
    from seqenc.table_inputs import ROW_MATCH_KEY, table_of_objects
    from training.tasks.table_task import join_tables

    # a user's column named like the derived key is renamed, never merged with it
    (tmp_path / "t.csv").write_text("name,score,[row match]\nann,1,1\nbob,2,1\ncy,3,3\n")
    ingest_table(tmp_path / "t.csv", tmp_path / "root", source="tables", delimiter=",")
    texts = pl.LazyFrame({"sequence_id": ["a", "a"], "step": [0, 1], "ts": [None] * 2, "key": ["claim", "sheet"],
                          "value": ["the score of ann is 1", "t.csv"], "template_id": [None] * 2},
                         schema=storage.polars_schema(storage.OBJECTS_SCHEMA))
    objects = join_tables(texts, tmp_path / "root", "tables", "sheet").collect()
    derived = objects.filter(pl.col("key") == ROW_MATCH_KEY).sort("step")
    # ann's row names "ann" and "1" (its two 1s are one stretch; one sits under "score", which the
    # text names: "h"); bob's the rank 1 (not under a named header); cy's nothing
    assert derived["value"].to_list() == ["2h", "1", "0"]
    cells = objects.filter((pl.col("step") >= 0) & (pl.col("key") != ROW_MATCH_KEY))
    assert derived["step"].to_list() == sorted(set(cells["step"].to_list()))
    text, header, rows = table_of_objects(objects)
    assert (text, header) == ("the score of ann is 1", ["name", "score", "[row match] (column)"])
    assert rows == [["ann", "1", "1"], ["bob", "2", "1"], ["cy", "3", "3"]]
