"""Bring your own data through the CLI: a catalogue whose sources, keys and classes the code has
never seen (tests/byod_data.py), ingest -> tasks -> profile -> train -> score -> evaluate, with
labels (4 classes; binary with positive class ``fraud``) and without (an anomaly task over logs
in the user's own format); and the catalogue's validation messages."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from byod_data import STAGES, write_byod
from cli_error import printed_json

from parsers import storage
from seqenc.tokenizer import ValueTokenizer
from training.cli.main import main
from training.tasks.catalog import CatalogError, load_catalog


@pytest.fixture(scope="module")
def byod(tmp_path_factory):
    base = tmp_path_factory.mktemp("byod")
    return {"base": base, "work": base / "work", **write_byod(base)}


def test_ingest_with_labels_and_the_task_list(byod, capsys):
    root, catalog = str(byod["work"] / "data"), str(byod["catalog"])
    o, v = byod["orders"], byod["vault"]
    assert main(["ingest", "events", str(o["events"]), "--root", root, "--source", "orders", "--catalog", catalog,
                 "--labels", str(o["stage"]), "--label-id-column", "order_ref", "--label-column", "stage"]) == 0
    assert main(["ingest", "events", str(o["events"]), "--root", root, "--source", "orders_risk",
                 "--catalog", catalog, "--labels", str(o["risk"])]) == 0  # label columns from the catalogue
    assert main(["ingest", "logs", str(v["logs"]), "--root", root, "--source", "vault", "--catalog", catalog,
                 "--labels", str(v["labels"])]) == 0
    capsys.readouterr()
    assert storage.read_objects(root, "orders")["sequence_id"].n_unique() == 160  # grouped by order.id
    assert storage.read_objects(root, "vault")["sequence_id"].n_unique() == 120  # by the format's id pattern
    assert main(["tasks", "--catalog", catalog, "--root", root, "--json"]) == 0
    rows = {r["task"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"order_stage", "fraud_watch", "vault_watch"}
    assert rows["order_stage"]["per_class"] == dict.fromkeys(sorted(STAGES), 40)
    assert list(rows["fraud_watch"]["per_class"]) == ["legit", "fraud"]  # the model's order: negative, positive
    assert rows["vault_watch"]["labelled"] == 120 and rows["vault_watch"]["sequences"] == 120


def test_profile_flags_per_object_ids_and_writes_a_starter_task(byod, capsys, tmp_path):
    root = str(byod["work"] / "data")
    starter = tmp_path / "starter.toml"
    assert main(["profile", "--root", root, "--source", "orders", "--json", "--write-task", str(starter),
                 "--task-name", "first_try"]) == 0
    profile = printed_json(capsys)
    keys = {k["key"]: k for k in profile["keys"]}
    assert keys["request_id"]["unique_per_object"] and not keys["action"]["unique_per_object"]
    assert keys["amount"]["numeric"] and keys["order.channel"]["share"] == 1.0
    task = load_catalog(starter).task("first_try")
    assert task.kind == "multiclass" and "request_id" in task.exclude_keys and "action" not in task.exclude_keys
    with pytest.raises(SystemExit, match="already declared"):  # one line, no traceback
        main(["profile", "--root", root, "--source", "orders", "--write-task", str(starter), "--task-name",
              "first_try"])


@pytest.mark.parametrize("task", ["order_stage", "fraud_watch", "vault_watch"])
def test_train_score_evaluate_a_declared_task(byod, capsys, task):
    work, catalog = byod["work"], str(byod["catalog"])
    assert main(["train", "--catalog", catalog, "--task", task, "--workdir", str(work), "--no-progress"]) == 0
    result = printed_json(capsys)
    test = result["metrics"]["test"]
    if task == "order_stage":
        assert test["macro_f1"] > 0.5  # 4 classes, chance 0.25: the actions say the stage
    else:  # binary and anomaly tasks report the test split's f1, precision, recall ...
        assert {"f1", "precision", "recall"} <= set(test)
        # ... above the floor of flagging every test sequence (F1 = 2p / (1 + p) at positive share p):
        # with labels far above it (the country gives fraud away: F1 1.0 against 0.44 measured),
        # without labels above it (4 breaches in 24 test sessions; the ranking: the test below)
        split = pl.read_parquet(work / "sequences" / task / "splits.parquet").filter(pl.col("split") == "test")
        p = float((split["label"] == {"fraud_watch": "fraud", "vault_watch": "breach"}[task]).mean())
        assert test["f1"] > 2 * p / (1 + p) + (0.3 if task == "fraud_watch" else 0.0), (test, p)
    model, source = work / "models" / task / "bundle", load_catalog(catalog).task(task).source
    # the saved model is a version that is never rewritten; "bundle" names the newest
    assert model.is_symlink() and model.resolve() == Path(result["model_dir"]).resolve()
    assert main(["score", "--model", str(model), "--input", str(work / "data"), "--out", str(work / "pred" / task),
                 "--no-progress"]) == 0
    scored = pl.concat([pl.read_parquet(p) for p in sorted((work / "pred" / task).glob("date=*/part-0.parquet"))])
    assert scored.height == storage.read_objects(work / "data", source)["sequence_id"].n_unique()
    if task == "fraud_watch":  # the declared positive class is the score, whatever its name sorts like
        assert scored["score"].to_list() == pytest.approx(scored["prob_fraud"].to_list())
    if task == "vault_watch":  # the catalogue's contamination 0.1: the top tenth of the scored day
        assert set(scored["label"].to_list()) <= {"normal", "breach"}
        assert (scored["label"] == "breach").mean() == pytest.approx(0.1, abs=1.5 / scored.height)
    capsys.readouterr()
    assert main(["evaluate", "--workdir", str(work), "--task", task, "--catalog", catalog, "--no-progress"]) == 0
    evaluated = printed_json(capsys)
    assert evaluated["split"] == "test" and evaluated["sequences"] > 0
    for name, value in test.items():  # the same figures from the saved model as from the trainer
        if name in evaluated["metrics"]:
            assert evaluated["metrics"][name] == pytest.approx(value, abs=1e-6), name
    floor = evaluated["floor"]  # beside them the same floor as the trainer's: the model's train majority or flag-all
    assert floor["rule"] == ("train majority" if task == "order_stage" else "flag-all")
    for name, value in result["metrics"]["floor"]["test"].items():
        assert floor[name] == pytest.approx(value, abs=1e-6), name


def test_an_unlabelled_anomaly_task_finds_the_breaches(byod, capsys):
    """Trained without labels (the masked LM reads every train session); the labels only
    evaluate: over all 120 sessions, breaches rank well above their share."""
    work = byod["work"]
    stats = json.loads((work / "sequences" / "vault_watch" / "stats.json").read_text())
    assert stats["class_counts"]["breach"] > 0 and stats["unlabelled"] == 0
    [day] = storage.ingest_dates(work / "data", "vault")
    capsys.readouterr()
    assert main(["evaluate", "--workdir", str(work), "--task", "vault_watch", "--date", day, "--no-progress"]) == 0
    metrics = printed_json(capsys)["metrics"]
    share = stats["class_counts"]["breach"] / 120
    assert metrics["labelled"] == 120 and metrics["average_precision"] > 2 * share
    # an anomaly task's S(k) end with [END] (training.tasks.kinds (model_defaults)), in training and in
    # the saved model that scoring rebuilds them with
    assert ValueTokenizer.from_file(work / "sequences" / "vault_watch" / "tokenizer.json").value_end
    bundle = work / "models" / "vault_watch" / "bundle"
    assert ValueTokenizer.from_file(bundle / "tokenizer.json").value_end
    assert json.loads((bundle / "config.json").read_text())["value_end"] is True


CASES = {
    "kind": ('[sources.s]\nkind = "event"\n', "[sources.s] kind: 'event' is not allowed; allowed: 'logs', 'events', 'tables' or 'texts'"),
    "field": ('[sources.s]\nkind = "events"\nsesion_field = "x"\n', "unknown field 'sesion_field'; allowed fields:"),
    "source": ('[sources.s]\nkind = "events"\n[tasks.t]\nsource = "nope"\nkind = "anomaly"\n',
               "[tasks.t] source: 'nope' is not a declared source; declared: s"),
    "positive": ('[sources.s]\nkind = "events"\n[tasks.t]\nsource = "s"\nkind = "binary"\n',
                 "[tasks.t]: a binary task needs positive"),
    "policy": ('[sources.s]\nkind = "events"\n[tasks.t]\nsource = "s"\nkind = "anomaly"\n'
               'threshold = {policy = "median"}\n', "[tasks.t] threshold.policy: 'median' is not allowed"),
    "name": ('[sources."../x"]\nkind = "events"\n', "[sources.../x]: a name is 1-64 characters"),
    "toml": ('[sources.s\n', "not valid TOML"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_catalogue_errors_name_the_file_table_and_field(case, tmp_path):
    text, expected = CASES[case]
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(CatalogError) as err:
        load_catalog(path)
    assert str(path.resolve()) in str(err.value) and expected in str(err.value)


def test_ingest_reads_the_files_and_labels_the_catalogue_names(byod, tmp_path):
    """No FILE: the source's path (a glob, relative to the catalogue's folder) and labels."""
    catalog = byod["base"] / "paths.toml"
    catalog.write_text('[sources.shop]\nkind = "events"\npath = "raw/orders*.jsonl"\nsession_field = "order.id"\n'
                       'ts_field = "at"\nlabels = "raw/risk.csv"\nlabel_id_column = "order_ref"\n'
                       'label_column = "risk"\n')
    root = tmp_path / "data"
    assert main(["ingest", "events", "--root", str(root), "--source", "shop", "--catalog", str(catalog)]) == 0
    assert storage.read_objects(root, "shop")["sequence_id"].n_unique() == 160
    assert set(storage.read_labels(root, "shop")["label"].to_list()) == {"fraud", "legit"}


def test_a_time_split_trains_on_the_oldest_and_tests_on_the_newest():
    import datetime as dt

    import numpy as np

    from training.tasks.catalog import Task
    from training.tasks.task_data import assign_splits

    task = Task(source="s", kind="multiclass", split="time")
    ids = [f"s{i}" for i in range(20)]
    start = dt.datetime(2025, 3, 1)
    objects = pl.DataFrame({"sequence_id": ids[::-1], "step": list(range(20)),  # stored newest first
                            "ts": [start + dt.timedelta(hours=19 - i) for i in range(20)]})
    split = dict(zip(ids, assign_splits(ids, np.zeros(20, dtype=np.int64), "time", 0, task, objects)))
    assert [split[f"s{i}"] for i in range(20)] == ["train"] * 14 + ["dev"] * 3 + ["test"] * 3
    no_time = objects.with_columns(pl.lit(None, pl.Datetime("us")).alias("ts"))
    with pytest.raises(ValueError, match="needs timestamps"):
        assign_splits(ids, np.zeros(20, dtype=np.int64), "time", 0, task, no_time)
