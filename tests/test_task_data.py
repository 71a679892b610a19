"""training.tasks.task_data.task_sequences: lazy reads, labelled filter, the max_sequences sample."""

import polars as pl
import pytest

from parsers import storage
from parsers.log_ingest import ingest_logs
from parsers.logs import ingest_labels
from parsers.synthetic import generate_hdfs_logs
from training.tasks.catalog import Task
from training.tasks.spec import TaskSpec
from training.tasks.task_data import task_sequences


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("td")
    for day, seed in (("2025-01-01", 0), ("2025-01-02", 1)):
        generate_hdfs_logs(tmp / f"{day}.log", tmp / f"{day}.csv", n_blocks=60, anomaly_rate=0.1, seed=seed)
        ingest_logs(tmp / f"{day}.log", tmp / "root", source="h", ingest_date=day)
    ingest_labels(tmp / "2025-01-01.csv", tmp / "root", "h")  # the first day's blocks only
    return tmp / "root"


def test_every_object_of_the_window_as_read_objects_gives_it(root):
    objects, labels, classes = task_sequences(TaskSpec("t", Task(source="h", kind="anomaly")), root)
    assert objects.equals(storage.read_objects(root, "h"))
    one_day, _, _ = task_sequences(TaskSpec("t", Task(source="h", kind="anomaly")), root, "2025-01-02")
    assert one_day.equals(storage.read_objects(root, "h", "2025-01-02"))


def test_a_labelled_task_reads_only_labelled_sequences(root):
    task = Task(source="h", kind="binary", positive="Anomaly")
    objects, labels, _ = task_sequences(TaskSpec("t", task), root)
    labelled = set(storage.read_labels(root, "h")["sequence_id"])
    assert set(objects["sequence_id"]) <= labelled and set(labels["sequence_id"]) == set(objects["sequence_id"])
    want = storage.read_objects(root, "h").filter(pl.col("sequence_id").is_in(sorted(labelled)))
    assert objects.equals(want)


def test_max_sequences_keeps_a_stable_sample_whole(root):
    full, _, _ = task_sequences(TaskSpec("t", Task(source="h", kind="anomaly")), root)
    task = Task(source="h", kind="anomaly", max_sequences=25)
    sample, _, _ = task_sequences(TaskSpec("t", task), root)
    kept = sample["sequence_id"].unique()
    assert kept.len() == 25
    # every object of a kept sequence, in the order read_objects gives them
    assert sample.equals(full.filter(pl.col("sequence_id").is_in(kept.implode())))
    again, _, _ = task_sequences(TaskSpec("t", task), root)
    assert again.equals(sample)
    # another window (here one day of the two): a kept sequence that it holds is kept there too
    day2_sample, _, _ = task_sequences(TaskSpec("t", task), root, "2025-01-02")
    day2_all = set(storage.read_objects(root, "h", "2025-01-02")["sequence_id"])
    assert set(kept) & day2_all <= set(day2_sample["sequence_id"])
    with pytest.raises(ValueError):
        Task(source="h", kind="anomaly", max_sequences=0)


def test_grouped_and_fixed_splits_keep_a_group_in_one_split():
    import numpy as np

    from training.tasks.task_data import assign_splits

    ids = [f"s{i}" for i in range(200)]
    groups = pl.DataFrame({"sequence_id": ids, "group": [f"t{i % 23}" for i in range(200)]})
    task = Task(source="h", kind="binary", positive="1", table_source="tables")
    group_of = dict(zip(groups["sequence_id"], groups["group"]))
    for split in ("grouped", "fixed"):
        got = assign_splits(ids, np.zeros(200, dtype=np.int64), split, 0, task, groups=groups)
        per_group: dict[str, set[str]] = {}
        for s, name in zip(ids, got):
            per_group.setdefault(group_of[s], set()).add(name)
        assert all(len(v) == 1 for v in per_group.values()), split
        assert {"train", "dev", "test"} <= set(got), split
    again = assign_splits(ids, np.zeros(200, dtype=np.int64), "grouped", 0, task, groups=groups)
    other = assign_splits(ids, np.zeros(200, dtype=np.int64), "grouped", 1, task, groups=groups)
    assert again == assign_splits(ids, np.zeros(200, dtype=np.int64), "grouped", 0, task, groups=groups)
    assert again != other  # seeded
    with pytest.raises(ValueError, match="group"):
        assign_splits(ids, np.zeros(200, dtype=np.int64), "grouped", 0, task)


def test_too_few_sequences_to_split_get_a_clear_error():
    """A log cut into one window (Android_2k spans 150 s; window = 600) stopped on scikit-learn's
    words about n_samples=1; now the error says what to change. Three split fine."""
    import numpy as np

    from training.tasks.task_data import MIN_SPLIT_SEQUENCES, assign_splits

    task = Task(source="app1", kind="anomaly")
    for n in range(1, MIN_SPLIT_SEQUENCES):
        with pytest.raises(ValueError, match=f"holds {n} sequence.*shorter `window`"):
            assign_splits([f"s{i}" for i in range(n)], np.zeros(n, dtype=np.int64), "stratified", 0, task)
    got = assign_splits(["a", "b", "c"], np.zeros(3, dtype=np.int64), "stratified", 0, task)
    assert sorted(got) == ["dev", "test", "train"]


def test_the_profile_notes_a_source_cut_into_few_sequences():
    import datetime as dt

    from parsers.profile import FEW_SEQUENCES, SUGGESTED_WINDOWS, few_sequences_note

    start = dt.datetime(2026, 1, 1)
    logs = pl.DataFrame({"ts": [start, start + dt.timedelta(seconds=1000)]})
    note = few_sequences_note({"kind": "logs", "sequences": 1}, logs)
    assert "only 1 sequence" in note and f"window = {round(1000 / SUGGESTED_WINDOWS)} " in note
    assert "window =" not in few_sequences_note({"kind": "events", "sequences": 1}, logs)  # events: no window
    assert few_sequences_note({"kind": "logs", "sequences": FEW_SEQUENCES}, logs) is None
    # the note counts the windows its suggestion makes of these very timestamps
    every_second = pl.DataFrame({"ts": [start + dt.timedelta(seconds=s) for s in range(1001)]})
    note = few_sequences_note({"kind": "logs", "sequences": 1}, every_second)
    assert "window = 5 in the source's catalogue entry makes 201 windows)" in note
    # a 31 s log: a window under a second, and its count honest where the stamps are whole seconds
    fine = pl.DataFrame({"ts": [start + dt.timedelta(milliseconds=15 * i) for i in range(2001)]})
    assert "window = 0.15 in the source's catalogue entry makes 201 windows)" in \
        few_sequences_note({"kind": "logs", "sequences": 1}, fine)
    coarse = pl.DataFrame({"ts": [start + dt.timedelta(seconds=i // 64) for i in range(2001)]})
    note = few_sequences_note({"kind": "logs", "sequences": 1}, coarse)
    assert f"window = 1 in the source's catalogue entry makes 32 windows, still under {FEW_SEQUENCES}: the lines' " \
        "timestamps are too coarse" in note  # stamped to the second: no fraction of a second suggested
    assert "session_field" in note


def test_the_profile_leaves_a_log_headers_date_and_time_out(tmp_path):
    """A header "2026-04-01 00:00:03,250 INFO ..." detected from the file splits into a date and a
    time field. The time is unique per line, the date one value a day (no id to the uniqueness
    test), yet every later day brings a date the model never saw: both are flagged ``clock`` and
    left out of the starter task; the level and the message's values are not."""
    import datetime as dt
    import random

    from parsers.profile import profile_source, profile_table
    from training.cli.main import main
    from training.tasks.starter import starter_task

    rng = random.Random(0)
    root, catalog = tmp_path / "data", tmp_path / "seqenc.toml"
    catalog.write_text('[sources.jobs]\nkind = "logs"\nauto_header = true\nwindow = 600\n')
    for day in ("2026-04-01", "2026-04-02"):
        t, lines = dt.datetime.fromisoformat(day), []
        for _ in range(600):
            t += dt.timedelta(milliseconds=rng.randint(500, 9000))
            lines.append(f"{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d} {rng.choice(['INFO', 'WARN'])} "
                         f"worker w{rng.randint(1, 6)} finished job in {rng.randint(20, 400)} ms")
        (tmp_path / f"{day}.log").write_text("\n".join(lines) + "\n")
        assert main(["ingest", "logs", str(tmp_path / f"{day}.log"), "--root", str(root), "--source", "jobs",
                     "--catalog", str(catalog), "--date", day]) == 0
    profile = profile_source(root, "jobs", "2026-04-01")  # one day, as a user's first
    keys = {k["key"]: k for k in profile["keys"]}
    clocks = {k for k, v in keys.items() if v["clock"]}
    assert len(clocks) == 2 and all(v["examples"][0][:2] in ("20", "00", "01", "02") for k, v in keys.items()
                                    if k in clocks), keys
    date = next(k for k in clocks if keys[k]["distinct"] == 1)  # no id: one value on the day
    assert not keys[date]["unique_per_object"]
    assert not any(v["clock"] for k, v in keys.items() if k not in clocks)  # the level, the worker, the ms
    assert clocks <= set(starter_task(profile)["exclude_keys"])
    assert "clock" in profile_table(profile)
    # a compact header date (HDFS's 081109) is a number to the values' test; its name gives it away
    from parsers.profile import CLOCK_NAME

    assert CLOCK_NAME.search("date") and CLOCK_NAME.search("Timestamp2") and not CLOCK_NAME.search("update")
    assert CLOCK_NAME.search("created_at") and not CLOCK_NAME.search("response_time")  # a duration
    # dates, and what only looks like them: a dotted version (Hadoop's jetty-6.1.26), an address
    from parsers.profile import CLOCK

    dates = ["2026-04-01", "2005.06.03", "04/01/2026", "4/1/26", "06.01.26", "1.12.2024", "17-06-09 x", "Jun"]
    assert all(CLOCK.search(v) for v in dates) and pl.Series(dates).str.contains(CLOCK.pattern).all()
    others = ["6.1.26", "1.2.3", "10.0.10.1", "12.11.10.1", "3.14", "1.2.2024.5"]
    assert not any(CLOCK.search(v) for v in others) and not pl.Series(others).str.contains(CLOCK.pattern).any()
