"""training.tasks.baselines: the count LR on event counts and on the counts of every key=value pair."""

import polars as pl

from training.bench.data import LabelledDataset, _as_objects, stratified_split
from training.tasks.baselines import COUNT_KEY, count_baseline, count_vectors, value_count_dataset


def plan_dataset(n: int = 90) -> LabelledDataset:
    """Sequences of three events each; the label lives only in the value of ``plan``
    (``pro`` -> "upgrade"), never in the events; ``pid`` is unique per sequence and excluded."""
    rows, labels = [], []
    for i in range(n):
        sid = f"s{i:03d}"
        label = ("none", "upgrade")[i % 2]
        for step, event in enumerate(("login", "view", "logout")):
            rows.append((sid, step, "event", event))
            rows.append((sid, step, "plan", "pro" if label == "upgrade" else "free"))
            rows.append((sid, step, "pid", str(1000 + i)))
        labels.append((sid, label))
    objects = pl.DataFrame(rows, schema=["sequence_id", "step", "key", "value"], orient="row").with_columns(
        pl.lit(None, dtype=pl.Datetime("us")).alias("ts"), pl.lit(None, dtype=pl.Int64).alias("template_id"))
    labels = pl.DataFrame(labels, schema=["sequence_id", "label"], orient="row")
    return LabelledDataset("plans", "binary", ("none", "upgrade"), _as_objects(objects), labels,
                        stratified_split(labels, 0), "event", ("pid",), "a value-only label")


def test_value_counts_count_every_kept_key_value_pair():
    ds = value_count_dataset(plan_dataset())
    assert ds.event_key == COUNT_KEY and ds.exclude_keys == ()
    assert set(ds.objects["key"].unique()) == {COUNT_KEY}
    assert not ds.objects["value"].str.starts_with("pid=").any()  # the excluded key stays out
    ids, X, vocab = count_vectors(ds)
    assert vocab == ["event=login", "event=logout", "event=view", "plan=free", "plan=pro"]
    row = X[ids.index("s001")].toarray()[0]  # an "upgrade" sequence: three events, plan=pro three times
    assert dict(zip(vocab, row)) == {"event=login": 1, "event=logout": 1, "event=view": 1, "plan=free": 0,
                                     "plan=pro": 3}


def test_value_count_lr_reads_what_event_counts_cannot():
    ds = plan_dataset()
    on_events, on_values = count_baseline(ds), count_baseline(value_count_dataset(ds))
    assert on_events["vocab"] == 3 and on_values["vocab"] == 5
    assert on_values["f1"] == 1.0  # the plan's value gives the label away
    assert on_events["f1"] < 0.75  # every sequence has the same events: the best is to flag all


def test_bench_accuracy_modes_none_runs_the_baselines_only(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "base.json"
    done = subprocess.run([sys.executable, "-c", "import sys; from training.cli.main import main; sys.exit(main())",
                           "bench", "accuracy", "--data", str(tmp_path / "no-shared-data-needed"), "--json", str(out),
                           "--datasets", "milestone", "--modes", "none", "--limit", "milestone=60", "--size", "tiny",
                           "--no-progress"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["milestone"]
    assert list(rows) == ["count_lr", "count_lr_values"]
    assert all(0 <= row["macro_f1"] <= 1 for row in rows.values())
