"""The main job end to end on the tiny built-in size: files, MLflow store, idempotence."""

import json
from pathlib import Path

import mlflow
import polars as pl
import pytest

from parsers import storage
from training import pipeline
from training.scoring import load_bundle, score_objects


@pytest.fixture(scope="module")
def demo(tmp_path_factory, monkeypatch_module):
    out = tmp_path_factory.mktemp("demo")
    summary = pipeline.run_demo(str(out), size="tiny", seed=0, progress=False)
    return out, summary


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        yield mp


def test_summary_has_the_documented_fields(demo):
    out, summary = demo
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert set(summary["metrics"]["anomaly"]) == {"precision", "recall", "f1", "macro_f1", "micro_f1"}
    assert set(summary["metrics"]["milestone"]) == {"micro_f1", "macro_f1"}
    for values in summary["metrics"].values():
        assert all(0.0 <= v <= 1.0 for v in values.values())
    assert summary["mlflow_tracking_uri"] == f"sqlite:///{out / 'mlflow.db'}"
    assert len(summary["run_ids"]) == 2 and summary["seconds"] > 0
    assert [p.split("/")[-2:] for p in summary["predictions"]] == [["anomaly", "test.parquet"],
                                                                   ["milestone", "test.parquet"]]


def test_predictions_cover_the_test_split_and_match_the_trainer(demo):
    out, summary = demo
    for task, path in zip(("anomaly", "milestone"), summary["predictions"]):
        pred = pl.read_parquet(path)
        splits = pl.read_parquet(out / "sequences" / task / "splits.parquet")
        test_ids = set(splits.filter(pl.col("split") == "test")["sequence_id"].to_list())
        assert set(pred["sequence_id"].to_list()) == test_ids and pred.height == len(test_ids)
        assert {"sequence_id", "score", "prediction", "label", "mlflow_run_id"} <= set(pred.columns)
        classes = pipeline.TASKS[task].class_names
        assert set(pred["prediction"].to_list()) <= set(classes)
        assert pred["score"].is_between(0, 1).all()
        # scoring from the saved bundle reproduces the trainer's own test metrics exactly
        assert summary["test_metrics_from_predictions"][task] == pytest.approx(summary["metrics"][task])


def test_mlflow_store_holds_runs_params_metrics_and_artifacts(demo):
    out, summary = demo
    client = mlflow.MlflowClient(tracking_uri=summary["mlflow_tracking_uri"])
    for run_id, task in zip(summary["run_ids"], ("anomaly", "milestone")):
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED"
        assert run.data.params["task"] == task and run.data.params["mode"] == "interleaved"
        assert run.data.params["model.n_shared_heads"] == "2"
        assert "train/mlm_loss" in run.data.metrics and "train/task_loss" in run.data.metrics
        headline = "f1" if task == "anomaly" else "macro_f1"
        assert run.data.metrics[f"test/{headline}"] == pytest.approx(summary["metrics"][task][headline])
        artifacts = {a.path for a in client.list_artifacts(run_id, "plots")}
        assert "plots/confusion_test.png" in artifacts and "plots/losses.png" in artifacts
        assert {"plots/metrics.json", "plots/train_config.json"} <= artifacts
        assert run.data.tags["git_commit"] and len(run.data.tags["dataset_fingerprint"]) == 16
        # artifacts live beside the store, not in the current directory
        assert str(out) in run.info.artifact_uri
        versions = client.search_model_versions(f"name = 'seqenc-{task}'")
        assert [v.run_id for v in versions] == [run_id]


def test_registered_pyfunc_scores_like_the_bundle_and_holds_no_pickles(demo):
    out, summary = demo
    mlflow.set_tracking_uri(summary["mlflow_tracking_uri"])
    local = Path(mlflow.artifacts.download_artifacts("models:/seqenc-anomaly/1", dst_path=str(out / "dl")))
    files = {p.name for p in local.rglob("*") if p.is_file()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "metadata.json", "MLmodel"} <= files
    assert not [f for f in files if f.endswith((".pkl", ".pickle", ".bin", ".pt"))], files
    objects = storage.read_objects(out / "data", "hdfs")
    some = objects.filter(pl.col("sequence_id").is_in(objects["sequence_id"].unique().sort()[:20].implode()))
    pyfunc = mlflow.pyfunc.load_model("models:/seqenc-anomaly/1")
    got = pl.from_pandas(pyfunc.predict(some.to_pandas())).sort("sequence_id")
    expected = score_objects(out / "models" / "anomaly" / "bundle", some, progress=False).sort("sequence_id")
    assert got["sequence_id"].to_list() == expected["sequence_id"].to_list()
    assert got["score"].to_list() == pytest.approx(expected["score"].to_list(), abs=1e-6)
    model, tok, meta = load_bundle(out / "models" / "anomaly" / "bundle")
    assert meta["mlflow_run_id"] == summary["run_ids"][0] and 0 <= meta["threshold"] <= 1


def test_rerun_replaces_outputs_and_new_dates_do_not_double_values(demo):
    out, _ = demo
    before = storage.read_objects(out / "data", "hdfs").height
    stats_before = json.loads((out / "sequences" / "anomaly" / "stats.json").read_text())
    raw = out / "raw"
    first = pipeline.stage_ingest_logs(str(out), str(raw / "hdfs.log"), str(raw / "hdfs_labels.csv"))
    assert storage.read_objects(out / "data", "hdfs").height == before  # same partition: replaced
    second = pipeline.stage_ingest_logs(str(out), str(raw / "hdfs.log"), str(raw / "hdfs_labels.csv"),
                                        ingest_date="2030-01-02")
    assert second["ingest_date"] == "2030-01-02" != first["ingest_date"]
    assert storage.read_objects(out / "data", "hdfs").height == 2 * before  # two partitions exist
    seqs = pipeline.stage_sequences(str(out), "anomaly", "tiny", 0, ingest_date="2030-01-02")
    assert seqs["stats"]["values"] == stats_before["values"]  # one interval's values, not doubled


def test_pretrained_minilm_option_runs_end_to_end(tmp_path, monkeypatch_module):
    """--pretrained minilm: BERT vocabulary (+[VAL_SEP]), MiniLM weights, train, save, score."""
    out = str(tmp_path)
    raw = pipeline.stage_generate(out, "tiny", seed=0)
    ingest = pipeline.stage_ingest_logs(out, raw["hdfs_log"], raw["hdfs_labels"])
    seqs = pipeline.stage_sequences(out, "anomaly", "tiny", ingest_date=ingest["ingest_date"], pretrained="minilm")
    assert seqs["stats"]["vocab_size"] == 30523 and seqs["stats"]["dropped_values"] == 0
    trained = pipeline.stage_train(out, "anomaly", "tiny", progress=False, pretrained="minilm", pretrained_layers=1)
    model, tok, _ = load_bundle(trained["model_dir"])
    assert (model.config.d_model, model.config.n_layers, model.config.n_heads) == (384, 1, 12)
    assert tok.vocab_size == 30523
    params = mlflow.MlflowClient(trained["tracking_uri"]).get_run(trained["run_id"]).data.params
    assert params["pretrained"] == "minilm"
    scored = pipeline.stage_score(out, "anomaly", progress=False, ingest_date=ingest["ingest_date"])
    assert scored["rows"] > 0 and set(scored["metrics"]) == {"precision", "recall", "f1", "macro_f1", "micro_f1"}
