"""The operations DAGs on a user's catalogue (tests/byod_data.py): sources and tasks the code has
never seen are ingested from the landing folder, trained and promoted each night, and scored --
adding a task to the catalogue schedules it, with no change to the DAG files. Run by Airflow's
own runner (``dag.test``) against a SQLite metadata DB in a temporary AIRFLOW_HOME."""

from __future__ import annotations

import polars as pl
import pytest
from airflow_run import airflow_env, migrate, run_dag
from byod_data import catalogue_text, table_catalogue_text, write_orders, write_shelves, write_vault_logs

from parsers import storage

DAY = "2025-03-01"
LOGICAL = "2025-03-02T00:00:00"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("byod-dags")
    workdir, landing = base / "work", base / "work" / "landing"
    orders = write_orders(landing / "orders_risk" / DAY, n_orders=120)
    orders["stage"].unlink()  # this source's labels are the risk column
    orders["risk"].rename(orders["risk"].with_name("risk_labels.csv"))
    vault = write_vault_logs(landing / "vault" / DAY)
    vault["labels"].rename(vault["labels"].with_name("breach_labels.csv"))
    vault["formats"].rename(base / "formats.json")  # the user's log format, out of the landing folder
    shelves = write_shelves(landing / "shelves" / DAY, landing / "claims" / DAY)  # tables and texts
    catalog = base / "seqenc.toml"
    catalog.write_text(catalogue_text(base / "formats.json") + table_catalogue_text())

    # the catalogue lies beside the work directory: the work root (training/airflow/workroot.py) holds both
    env = airflow_env(base / "airflow", {"SEQENC_WORKDIR": str(workdir), "SEQENC_WORK_ROOT": str(base)})
    migrate(env)
    conf = {"workdir": str(workdir), "catalog": str(catalog)}
    out = {"workdir": workdir, "shelves": shelves, "ingest": run_dag("seqenc_ingest", conf, env, LOGICAL)}
    out["nightly"] = run_dag("seqenc_nightly_training", {**conf, "date": DAY, "window_days": 2}, env, LOGICAL)
    out["score"] = run_dag("seqenc_batch_score", {**conf, "date": DAY}, env, LOGICAL)
    return out


def _states(run: dict) -> dict:
    assert run["run_state"] == "success", f"{run['states']}\n{run['_output'][-6000:]}"
    return run["states"]


def test_ingest_reads_each_sources_options_from_the_catalogue(runs):
    states = _states(runs["ingest"])
    assert sorted(s for t, s in states.items() if t.startswith("ingest_file[")) == ["success"] * (4 + 6 + 1)
    root = runs["workdir"] / "data"
    assert storage.read_objects(root, "orders_risk", DAY)["sequence_id"].n_unique() == 120  # by order.id
    assert storage.read_objects(root, "vault", DAY)["sequence_id"].n_unique() == 120  # the user's log format
    assert set(storage.read_labels(root, "orders_risk")["label"].to_list()) == {"fraud", "legit"}
    # a tables source: a table per file, its rows the objects; a texts source with its labels
    shelves = storage.read_objects(root, "shelves", DAY)
    assert sorted(shelves["sequence_id"].unique()) == [p.name for p in runs["shelves"]["tables"]]
    assert set(shelves["key"].unique()) == {"item", "count"} and shelves.height == 6 * 4 * 2
    assert storage.read_labels(root, "claims").height == runs["shelves"]["n_claims"]


def test_nightly_trains_every_declared_task_it_has_data_for(runs):
    run = runs["nightly"]
    states = _states(run)
    assert run["xcoms"]["tasks"] == ["order_stage", "fraud_watch", "vault_watch", "claim_check"]
    # order_stage's source was never landed: skipped with the reason; the other three train and promote
    assert states["train[0]"] == "skipped" and states["train[1]"] == states["train[2]"] == "success"
    assert states["train[3]"] == "success"  # a table task: claims joined to their tables
    assert [run["xcoms"][f"train[{i}]"]["registered_model"] for i in (1, 2, 3)] == [
        "seqenc-fraud_watch", "seqenc-vault_watch", "seqenc-claim_check"]
    promoted = [x for t, x in run["xcoms"].items() if t.startswith("promote[")]
    assert sorted(p["registered_model"] for p in promoted) == ["seqenc-claim_check", "seqenc-fraud_watch",
                                                                "seqenc-vault_watch"]
    assert all(p["promoted"] for p in promoted) and all(states[t] == "success" for t in states if "promote" in t)


def test_batch_score_scores_each_task_with_its_champion(runs):
    states = _states(runs["score"])
    assert states["score[0]"] == "skipped"  # order_stage has no champion
    for name, positive, n in (("fraud_watch", "fraud", 120), ("vault_watch", "breach", 120),
                              ("claim_check", "refuted", runs["shelves"]["n_claims"])):
        pred = pl.read_parquet(runs["workdir"] / "predictions" / name / f"date={DAY}" / "part-0.parquet")
        assert pred.height == n and f"prob_{positive}" in pred.columns
        assert pred["score"].to_list() == pytest.approx(pred[f"prob_{positive}"].to_list())
