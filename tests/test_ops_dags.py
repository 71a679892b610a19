"""The operations DAGs on tiny data, each run by Airflow's own runner (``dag.test``) against a
SQLite metadata DB in a temporary AIRFLOW_HOME, with a real MLflow store and registry:

seqenc_ingest (landing -> partitions) -> seqenc_nightly_training (train, promote on merit)
-> seqenc_batch_score (champion -> predictions partitioned by date), and each run twice over the
same interval: the second leaves the same rows, and a model that is no better stays a challenger.
Then the next day in the schedule's order (ingest, scoring, training): its scores are out of sample.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import mlflow
import polars as pl
import pytest
from airflow_run import DAGS, airflow_env, migrate, plant_stale_part, run_dag, run_python

from parsers import storage
from parsers.synthetic import generate_hdfs_logs, generate_session_events

DAY = "2025-03-01"
LOGICAL = "2025-03-02T00:00:00"  # the @daily run at midnight after DAY: its data interval is DAY
DAY2 = "2025-03-02"
SCORE_AT_DAY2 = "2025-03-03T01:00:00"  # seqenc_batch_score's scheduled run after DAY2: interval DAY2
GRAPHS = {
    "seqenc_ingest": {("find_files", "mine_file"), ("mine_file", "merge_templates"), ("merge_templates", "ingest_file"),
                      ("find_files", "finalize"), ("ingest_file", "finalize")},
    # mapped over the catalogue's tasks: a task added to the catalogue is trained and scored
    "seqenc_nightly_training": {("tasks", "train"), ("train", "promote")},
    "seqenc_batch_score": {("tasks", "score")},
}
SCORE_TASKS = {"tasks", "score"}


def _ok(result: dict, expected_skipped: set = frozenset()) -> None:
    bad = {t: s for t, s in result["states"].items()
           if s != ("skipped" if t in expected_skipped else "success")}
    assert not bad and result["run_state"] == "success", (
        f"task states: {result['states']}\n{result['_output'][-8000:]}")


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    """Everything runs once here; the tests below read what it left."""
    base = tmp_path_factory.mktemp("ops")
    home, workdir = base / "airflow", base / "work"
    landing = workdir / "landing"
    day_dir = {"hdfs": landing / "hdfs" / DAY, "sessions": landing / "sessions" / DAY}
    for d in day_dir.values():
        d.mkdir(parents=True)
    generate_hdfs_logs(day_dir["hdfs"] / "hdfs.log", day_dir["hdfs"] / "hdfs_labels.csv", n_blocks=200,
                       anomaly_rate=0.1, seed=0)
    generate_session_events(day_dir["sessions"] / "sessions.jsonl", day_dir["sessions"] / "sessions_labels.csv",
                            n_sessions=150, seed=0)
    (day_dir["hdfs"] / "README.txt.bak").write_text("not data")  # ignored, with a warning

    env = airflow_env(home, {"SEQENC_WORKDIR": str(workdir)})
    migrate(env)
    out: dict = {"workdir": workdir, "env": env}
    conf = {"workdir": str(workdir)}
    out["ingest1"] = run_dag("seqenc_ingest", conf, env, LOGICAL)
    out["objects1"] = {s: storage.read_objects(workdir / "data", s, DAY) for s in ("hdfs", "sessions")}
    out["stale"] = plant_stale_part(workdir / "data", "hdfs", DAY, "hdfs.log")  # the re-run must drop it
    out["ingest2"] = run_dag("seqenc_ingest", conf, env, LOGICAL)
    out["labels1"] = storage.read_labels(workdir / "data", "hdfs")  # before DAY2 lands

    nightly = {"workdir": str(workdir), "tasks": ["anomaly"], "size": "tiny", "window_days": 3, "date": DAY}
    out["nightly1"] = run_dag("seqenc_nightly_training", nightly, env, LOGICAL)
    out["nightly2"] = run_dag("seqenc_nightly_training", nightly, env, LOGICAL)

    score = {"workdir": str(workdir), "date": DAY}
    out["score1"] = run_dag("seqenc_batch_score", score, env, LOGICAL)
    out["pred1"] = pl.read_parquet(workdir / "predictions" / "anomaly" / f"date={DAY}" / "part-0.parquet")
    out["score2"] = run_dag("seqenc_batch_score", score, env, LOGICAL)

    # the next day in the schedule's order: ingest (00:00), then scoring (01:00) by its own data
    # interval with the champion the night of DAY trained, then that night's training (02:00)
    day2 = landing / "hdfs" / DAY2
    day2.mkdir(parents=True)
    generate_hdfs_logs(day2 / "hdfs.log", day2 / "hdfs_labels.csv", n_blocks=120, anomaly_rate=0.1, seed=1)
    out["ingest_day2"] = run_dag("seqenc_ingest", conf, env, "2025-03-03T00:00:00")
    out["score_day2"] = run_dag("seqenc_batch_score", {"workdir": str(workdir), "tasks": ["anomaly"]}, env,
                                SCORE_AT_DAY2)
    return out


def test_dagbag_loads_every_dag_with_the_expected_graph(tmp_path):
    result = run_python(f"""
        import json
        from airflow.dag_processing.dagbag import DagBag
        bag = DagBag(dag_folder={str(DAGS)!r})
        print("RESULT-JSON:" + json.dumps({{
            "errors": {{str(k): str(v) for k, v in bag.import_errors.items()}},
            "graphs": {{d: sorted([t.task_id, n] for t in dag.tasks for n in t.downstream_task_ids)
                        for d, dag in bag.dags.items()}},
            "tasks": {{d: sorted(dag.task_ids) for d, dag in bag.dags.items()}},
            "schedules": {{d: repr(dag.timetable) for d, dag in bag.dags.items()}},
            "crons": {{d: getattr(dag.timetable, "expression", None) for d, dag in bag.dags.items()}},
        }}))
    """, airflow_env(tmp_path), timeout=120)
    assert result["errors"] == {}
    for dag_id, edges in GRAPHS.items():
        assert {tuple(e) for e in result["graphs"][dag_id]} == edges, dag_id
    assert set(result["tasks"]["seqenc_batch_score"]) == SCORE_TASKS
    for dag_id in GRAPHS:  # scheduled, with real data intervals (not trigger points)
        assert "CronDataIntervalTimetable" in result["schedules"][dag_id]
    # a day is ingested, then scored by the champion the night before trained, then trained on:
    # a scheduled score is never in-sample (docs/operations.md)
    hours = {d: datetime.strptime(c, "%M %H * * *").hour for d, c in result["crons"].items() if d in GRAPHS}
    assert hours["seqenc_ingest"] < hours["seqenc_batch_score"] < hours["seqenc_nightly_training"], hours


@pytest.mark.parametrize("dag_file", sorted(p.name for p in DAGS.glob("seqenc_*.py")))
def test_dag_files_parse_fast_without_heavy_imports(dag_file, tmp_path):
    result = run_python(f"""
        import importlib.util, json, sys, time
        import airflow.sdk
        from airflow.sdk import dag, task, Param, Variable, get_current_context, CronDataIntervalTimetable  # noqa
        t0 = time.perf_counter()
        spec = importlib.util.spec_from_file_location("dag_under_test", {str(DAGS / dag_file)!r})
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        seconds = time.perf_counter() - t0
        # ours: the DAG's module of training.airflow (heavy imports inside its functions) and the
        # registries its params list (they import nothing, training.engine.modes)
        light = {{"training", "training.engine", "training.engine.modes", "training.engine.sizes"}}
        heavy = [m for m in ("torch", "polars", "mlflow", "numpy") if m in sys.modules] + sorted(
            m for m in sys.modules if m.split(".")[0] in ("training", "parsers", "seqenc") and m not in light
            and not m.startswith("training.airflow"))
        print("RESULT-JSON:" + json.dumps({{"seconds": seconds, "heavy": heavy}}))
    """, airflow_env(tmp_path), timeout=120)
    assert result["heavy"] == [], f"{dag_file} imported heavy modules: {result['heavy']}"
    assert result["seconds"] < 1.0, f"{dag_file} took {result['seconds']:.2f} s to import"


def test_ingest_maps_one_task_per_file_and_fills_the_interval_partition(ops):
    run = ops["ingest1"]
    _ok(run)
    assert run["interval"][0].startswith(DAY) and run["interval"][1].startswith("2025-03-02")
    mapped = sorted(t for t in run["states"] if t.startswith("ingest_file["))
    assert len(mapped) == 4  # hdfs log + labels, sessions events + labels; the .bak file is ignored
    kinds = sorted(x["kind"] for t, x in run["xcoms"].items() if t.startswith("ingest_file["))
    assert kinds == ["events", "labels", "labels", "logs"]
    # the parallel log ingest: every file through mine_file (only the log is mined), one merge
    assert sorted(t for t in run["states"] if t.startswith("mine_file[")) == \
        [f"mine_file[{i}]" for i in range(4)]
    assert run["states"]["merge_templates"] == "success"
    assert sorted(x.get("mined", False) for t, x in run["xcoms"].items() if t.startswith("mine_file[")) == \
        [False, False, False, True]
    log_report = next(x for t, x in run["xcoms"].items() if t.startswith("ingest_file[") and x["kind"] == "logs")
    assert log_report["templates"] > 0 and log_report["rejected"] == 0
    assert not list(storage.mined_dir(ops["workdir"] / "data", "hdfs").rglob("*.parquet"))  # cleared by finalize
    objects = ops["objects1"]
    assert objects["hdfs"].height > 0 and objects["sessions"].height > 0
    assert objects["hdfs"]["sequence_id"].n_unique() == 200
    assert ops["labels1"].height == 200
    manifest = json.loads((storage.objects_dir(ops["workdir"] / "data", "hdfs") / f"ingest_date={DAY}"
                           / "_manifest.json").read_text())
    assert manifest["parts"] == ["part-hdfs.log.parquet"]


def test_a_workdir_param_outside_the_work_root_is_refused(ops, tmp_path):
    """Whoever triggers a DAG sets its params; the stages replace and delete folders under the
    workdir they get, so a path outside the work root ($SEQENC_WORKDIR here) fails the run."""
    outside = tmp_path / "elsewhere"
    run = run_dag("seqenc_ingest", {"workdir": str(outside)}, ops["env"], LOGICAL)
    assert run["states"]["find_files"] == "failed" and run["run_state"] == "failed"
    assert not outside.exists()


def test_ingest_rerun_of_an_interval_replaces_its_partition(ops):
    _ok(ops["ingest2"])
    assert not ops["stale"].exists()
    assert str(ops["stale"]) in ops["ingest2"]["xcoms"]["finalize"]["removed"]
    for source, before in ops["objects1"].items():
        after = storage.read_objects(ops["workdir"] / "data", source, DAY)
        assert after.sort("sequence_id", "step", "key").equals(before.sort("sequence_id", "step", "key")), source
    assert ops["labels1"].height == 200  # not doubled


def test_nightly_training_registers_and_promotes_the_first_model(ops):
    run = ops["nightly1"]
    _ok(run)
    assert run["xcoms"]["tasks"] == ["anomaly"]  # the param narrows the catalogue's tasks
    trained, promoted = run["xcoms"]["train[0]"], run["xcoms"]["promote[0]"]
    assert trained["dates"] == [DAY] and trained["model_version"] == "1"
    assert promoted["promoted"] is True and "no champion yet" in promoted["reason"]
    assert promoted["metric"] == "average_precision" and 0.0 <= promoted["new"] <= 1.0
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{ops['workdir'] / 'mlflow.db'}")
    assert str(client.get_model_version_by_alias("seqenc-anomaly", "champion").version) == "1"
    run_info = client.get_run(trained["run_id"])
    assert run_info.data.tags["promotion"] == "champion"
    assert "promotion/dev_average_precision_new" in run_info.data.metrics
    # the split is fixed by sequence id: the same ids in the same split on every night
    splits = pl.read_parquet(Path(trained["night_dir"]) / "sequences" / "anomaly" / "splits.parquet")
    from training.tasks.data import fixed_split

    assert splits["split"].to_list() == fixed_split(splits["sequence_id"].to_list())


def test_nightly_training_keeps_the_champion_when_the_new_model_is_not_better(ops):
    run = ops["nightly2"]
    _ok(run)
    trained, decision = run["xcoms"]["train[0]"], run["xcoms"]["promote[0]"]
    assert trained["model_version"] == "2"
    # same data, same seed: the same model, so the same dev score -- not an improvement
    assert decision["promoted"] is False and decision["champion_version"] == "1"
    assert decision["new"] == pytest.approx(decision["champion"])
    assert "does not beat champion" in decision["reason"]
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{ops['workdir'] / 'mlflow.db'}")
    assert str(client.get_model_version_by_alias("seqenc-anomaly", "champion").version) == "1"
    version = client.get_model_version("seqenc-anomaly", "2")
    assert version.tags["promotion"] == "rejected" and version.tags["promotion_reason"] == decision["reason"]
    assert client.get_run(trained["run_id"]).data.tags["promotion_reason"] == decision["reason"]


def test_batch_score_writes_the_champions_predictions_by_date(ops):
    run = ops["score1"]
    assert run["xcoms"]["tasks"] == ["anomaly", "milestone", "next_item"]  # every catalogue task
    _ok(run, {"score[1]", "score[2]"})  # milestone, next_item: no champions yet, skipped with that reason
    assert "no version with alias 'champion'" in run["_output"]
    pred = ops["pred1"]
    assert pred.height == 200 and pred["sequence_id"].n_unique() == 200
    assert {"sequence_id", "score", "label", "model_version", "model_name"} <= set(pred.columns)
    assert set(pred["model_version"].to_list()) == {"1"} and pred["score"].is_between(0, 1).all()
    assert set(pred["label"].to_list()) <= {"Normal", "Anomaly"}
    summary = run["xcoms"]["score[0]"]["dates"][0]
    assert summary["sequences"] == 200 and sum(summary["label_count"].values()) == 200
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{ops['workdir'] / 'mlflow.db'}")
    scored = client.get_run(summary["mlflow_run_id"])
    assert scored.data.metrics["sequences"] == 200 and "score_p90" in scored.data.metrics
    assert "scoring/score_histogram.png" in {a.path for a in client.list_artifacts(scored.info.run_id, "scoring")}


def test_batch_score_rerun_leaves_the_same_rows(ops):
    _ok(ops["score2"], {"score[1]", "score[2]"})
    folder = ops["workdir"] / "predictions" / "anomaly"
    assert sorted(p.name for p in folder.iterdir()) == [f"date={DAY}", f"date={DAY2}"]  # one folder a day
    again = pl.read_parquet(folder / f"date={DAY}" / "part-0.parquet")
    assert again.equals(ops["pred1"])
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{ops['workdir'] / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("seqenc-scoring")
    runs = client.search_runs([experiment.experiment_id], f"tags.interval = '{DAY}'")
    assert len(runs) == 1  # the re-run replaced the day's scoring run


def test_the_scheduled_score_of_a_new_day_is_out_of_sample(ops):
    """By hand, DAY was scored after the night that trained on it: the run counts the blocks of its
    training split. The scheduled run after DAY2 scores DAY2 (its data interval) with that
    champion, whose window ended DAY: none in-sample, and nothing warns."""
    on_trained = ops["score1"]["xcoms"]["score[0]"]["dates"][0]
    assert 0 < on_trained["read_in_training"] < 200  # the training split only, not dev or test
    assert "in the model's training split" in ops["score1"]["_output"]
    run = ops["score_day2"]
    _ok(run)
    assert run["interval"][0].startswith(DAY2)
    day2 = run["xcoms"]["score[0]"]["dates"][0]
    assert day2["date"] == DAY2 and day2["sequences"] == 120
    assert day2["read_in_training"] == 0 and day2["read_in_training_share"] == 0.0
    assert "in the model's training split" not in run["_output"]
    pred = pl.read_parquet(ops["workdir"] / "predictions" / "anomaly" / f"date={DAY2}" / "part-0.parquet")
    assert pred.height == 120 and set(pred["model_version"].to_list()) == {"1"}


def test_score_cli_is_the_dags_code(ops, tmp_path):
    from training.cli.main import main

    workdir = ops["workdir"]
    assert main(["score", "--model", "models:/seqenc-anomaly@champion", "--input", str(workdir / "data"),
                 "--out", str(tmp_path / "registry"), "--date", DAY, "--tracking-dir", str(workdir),
                 "--no-progress"]) == 0
    got = pl.read_parquet(tmp_path / "registry" / f"date={DAY}" / "part-0.parquet")
    assert got.equals(ops["pred1"])
    # a bundle directory needs no tracking store; every ingest date of the model's source is scored
    bundle = Path(ops["nightly1"]["xcoms"]["train[0]"]["model_dir"])
    assert main(["score", "--model", str(bundle), "--input", str(workdir / "data"), "--out", str(tmp_path / "dir"),
                 "--no-progress"]) == 0
    local = pl.read_parquet(tmp_path / "dir" / f"date={DAY}" / "part-0.parquet")
    assert local["score"].to_list() == pytest.approx(got["score"].to_list(), abs=1e-6)
    assert local["model_version"].null_count() == local.height  # not from the registry
