"""The main job end to end on the tiny built-in size: files, MLflow store, idempotence."""

import json
from pathlib import Path

import mlflow
import polars as pl
import pytest
import torch

from parsers import storage
from seqenc.config import VALUE_COUNT_BUCKETS
from training.pipeline import stages as pipeline
from training.serving.scoring import load_bundle, score_objects
from training.tasks import task_data
from training.tasks.catalog import load_catalog
from training.tasks.spec import resolve_task


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
    assert set(summary["metrics"]["next_item"]) == {"recall_at_1", "recall_at_5", "recall_at_10", "mrr"}
    # next_item: beside counts LR, the ranking of each user's own items; the head reads that history
    assert set(summary["history_baselines"]) == {"next_item"}
    assert set(summary["history_baselines"]["next_item"]) == {"recall_at_1", "recall_at_5", "recall_at_10", "mrr",
                                                              "dev_recall_at_10"}
    config = json.loads((out / "models" / "next_item" / "bundle" / "config.json").read_text())
    assert config["item_history"] is True and config["value_end"] is False  # the kinds' model_defaults (training.tasks.kinds)
    # the multiclass head also reads the bag of values, the binary one does not (training.tasks.kinds)
    milestone = json.loads((out / "models" / "milestone" / "bundle" / "config.json").read_text())
    anomaly = json.loads((out / "models" / "anomaly" / "bundle" / "config.json").read_text())
    assert milestone["value_counts"] == VALUE_COUNT_BUCKETS and anomaly["value_counts"] == 0
    for values in summary["metrics"].values():
        assert all(0.0 <= v <= 1.0 for v in values.values())
    # beside them the floor: flag-all for the binary task (F1 = 2p / (1 + p)), the train majority for
    # the multiclass one, none for a ranking
    assert set(summary["floors"]) == {"anomaly", "milestone"}
    p = summary["floors"]["anomaly"]["precision"]
    assert summary["floors"]["anomaly"]["recall"] == 1.0 and summary["floors"]["anomaly"]["f1"] == pytest.approx(2 * p / (1 + p))
    splits = pl.read_parquet(out / "sequences" / "milestone" / "splits.parquet")
    top = splits.filter(pl.col("split") == "train")["label"].mode().sort()[0]  # ties: the first class name
    test = splits.filter(pl.col("split") == "test")["label"]
    assert summary["floors"]["milestone"]["micro_f1"] == pytest.approx(float((test == top).mean()))
    assert summary["mlflow_tracking_uri"] == f"sqlite:///{out / 'mlflow.db'}"
    assert len(summary["run_ids"]) == 3 and summary["seconds"] > 0
    assert [p.split("/")[-2:] for p in summary["predictions"]] == [[task, "test.parquet"] for task in TASKS]


def test_the_printed_summary_shows_each_floor_under_its_model(demo, capsys):
    from training.cli.main import _print_summary

    _, summary = demo
    _print_summary(summary)
    lines = capsys.readouterr().out.splitlines()
    floor = [line for line in lines if line.split()[:1] == ["floor"]]
    assert len(floor) == 2 and f"f1={summary['floors']['anomaly']['f1']:.3f}" in floor[0]
    assert lines[lines.index(floor[0]) - 1].startswith("anomaly")  # right under the task's TVM-KA row


TASKS = ("anomaly", "milestone", "next_item")


def test_predictions_cover_the_test_split_and_match_the_trainer(demo):
    out, summary = demo
    for task, path in zip(TASKS, summary["predictions"]):
        pred = pl.read_parquet(path)
        splits = pl.read_parquet(out / "sequences" / task / "splits.parquet")
        test_ids = set(splits.filter(pl.col("split") == "test")["sequence_id"].to_list())
        assert set(pred["sequence_id"].to_list()) == test_ids and pred.height == len(test_ids)
        assert {"sequence_id", "score", "prediction", "label", "mlflow_run_id"} <= set(pred.columns)
        classes = task_data.read_classes(out / "sequences" / task)
        assert set(pred["prediction"].to_list()) <= set(classes)
        assert pred["score"].is_between(0, 1).all()
        # scoring from the saved bundle reproduces the trainer's own test metrics exactly
        from_predictions = dict(summary["test_metrics_from_predictions"][task])
        trainer = dict(summary["metrics"][task])
        if task == "next_item":  # a file holds the 10 best items: recall@1/5/10 are exact, mrr is cut at 10
            assert from_predictions.pop("mrr_at_10") <= trainer.pop("mrr")
        assert from_predictions.pop("labelled") == len(test_ids)
        if task == "anomaly":  # scoring also reports the threshold-free average precision
            assert 0 < from_predictions.pop("average_precision") <= 1
        assert from_predictions == pytest.approx(trainer)


def test_next_item_predictions_rank_the_catalogue(demo):
    out, _ = demo
    pred = pl.read_parquet(out / "predictions" / "next_item" / "test.parquet")
    catalogue = task_data.read_classes(out / "sequences" / "next_item")
    assert catalogue == sorted(catalogue) and len(catalogue) == 40  # tiny size: 40 products
    assert not [c for c in pred.columns if c.startswith("prob_")]  # no column per catalogue item
    for row in pred.iter_rows(named=True):
        assert len(row["top_items"]) == 10 and len(set(row["top_items"])) == 10
        assert set(row["top_items"]) <= set(catalogue) and row["top_items"][0] == row["prediction"]
        assert row["top_scores"] == sorted(row["top_scores"], reverse=True)
        assert row["top_scores"][0] == pytest.approx(row["score"])


def test_mlflow_store_holds_runs_params_metrics_and_artifacts(demo):
    out, summary = demo
    client = mlflow.MlflowClient(tracking_uri=summary["mlflow_tracking_uri"])
    for run_id, task in zip(summary["run_ids"], TASKS):
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED"
        assert run.data.params["task"] == task and run.data.params["mode"] == "interleaved"
        assert run.data.params["model.n_shared_heads"] == "2"
        assert "train/mlm_loss" in run.data.metrics and "train/task_loss" in run.data.metrics
        headline = {"anomaly": "f1", "milestone": "macro_f1", "next_item": "recall_at_10"}[task]
        assert run.data.metrics[f"test/{headline}"] == pytest.approx(summary["metrics"][task][headline])
        artifacts = {a.path for a in client.list_artifacts(run_id, "plots")}
        evaluation = "plots/recall_at_k_test.png" if task == "next_item" else "plots/confusion_test.png"
        assert evaluation in artifacts and "plots/losses.png" in artifacts
        assert {"plots/metrics.json", "plots/train_config.json"} <= artifacts
        assert run.data.tags["git_commit"] and len(run.data.tags["dataset_fingerprint"]) == 16
        assert run.data.tags["torch_threads"] == str(torch.get_num_threads()) == str(summary["torch_threads"])
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
    first = pipeline.stage_ingest(str(out), "hdfs", str(raw / "hdfs.log"), str(raw / "hdfs_labels.csv"))
    assert storage.read_objects(out / "data", "hdfs").height == before  # same partition: replaced
    second = pipeline.stage_ingest(str(out), "hdfs", str(raw / "hdfs.log"), str(raw / "hdfs_labels.csv"),
                                   ingest_date="2030-01-02")
    assert second["ingest_date"] == "2030-01-02" != first["ingest_date"]
    assert storage.read_objects(out / "data", "hdfs").height == 2 * before  # two partitions exist
    seqs = pipeline.stage_sequences(str(out), resolve_task(None, "anomaly"), "tiny", 0, ingest_date="2030-01-02")
    assert seqs["stats"]["values"] == stats_before["values"]  # one interval's values, not doubled
    # the end-to-end modes read the objects of the same interval (same block ids on both dates)
    seq_dir = out / "sequences" / "anomaly"
    assert json.loads((seq_dir / "input.json").read_text())["ingest_dates"] == ["2030-01-02"]
    assert task_data.sequence_objects(seq_dir, out / "data", task_data.read_task(seq_dir)[0]).height == before


def test_pretrained_minilm_option_runs_end_to_end(tmp_path, monkeypatch_module):
    """--pretrained minilm: BERT vocabulary (+[VAL_SEP]), MiniLM weights, train, save, score; model
    overrides apply to it, but not ones that change the checkpoint's shape."""
    out = str(tmp_path)
    raw = pipeline.stage_generate(out, "tiny", seed=0)
    ingest = pipeline.stage_ingest(out, "hdfs", raw["hdfs"]["path"], raw["hdfs"]["labels"])
    seqs = pipeline.stage_sequences(out, resolve_task(None, "anomaly"), "tiny", ingest_date=ingest["ingest_date"], pretrained="minilm")
    assert seqs["stats"]["vocab_size"] == 30523 and seqs["stats"]["dropped_values"] == 0
    with pytest.raises(ValueError, match="the checkpoint sets d_model"):  # the checkpoint's shape is not ours to change
        pipeline.stage_train(out, "anomaly", "tiny", progress=False, pretrained="minilm", model_overrides={"d_model": 64})
    few_steps = {"pretrain_steps": 2, "rounds": 1, "tvm_steps_per_round": 4, "batch_tokens": 2048}  # runs, not learns
    trained = pipeline.stage_train(out, "anomaly", "tiny", progress=False, pretrained="minilm", pretrained_layers=1,
                                   model_overrides={"tvm_positions": "within_value"},  # other model fields apply
                                   train_overrides=few_steps)
    model, tok, _ = load_bundle(trained["model_dir"])
    assert (model.config.d_model, model.config.n_layers, model.config.n_heads) == (384, 1, 12)
    assert (model.config.tvm_positions, model.config.val_sep_token_id) == ("within_value", tok.val_sep_id)
    assert tok.vocab_size == 30523
    params = mlflow.MlflowClient(trained["tracking_uri"]).get_run(trained["run_id"]).data.params
    assert params["pretrained"] == "minilm"
    scored = pipeline.stage_score(out, "anomaly", progress=False, ingest_date=ingest["ingest_date"])
    assert scored["rows"] > 0 and set(scored["metrics"]) >= {"precision", "recall", "f1", "macro_f1", "micro_f1",
                                                              "labelled"}


def test_next_item_batch_scoring_and_promotion_metric(demo, tmp_path):
    """The ops path for next_item: batch scoring writes ranked items, the promotion metric is
    dev recall@10 read from them (two nights' catalogues may differ)."""
    from training.pipeline.nightly import dev_score
    from training.serving.batch_score import REPORTED_ITEMS, score_partitions
    from training.tasks.kinds import KINDS
    from training.tasks.metrics import ranking_metrics_of_lists

    out, summary = demo
    bundle_dir = out / "models" / "next_item" / "bundle"
    result = score_partitions(str(bundle_dir), out / "data", tmp_path / "scored", progress=False)
    assert result["source"] == "purchases" and len(result["dates"]) == 1
    day = result["dates"][0]
    scored = pl.read_parquet(day["predictions"])
    assert {"top_items", "top_scores", "label", "model_uri"} <= set(scored.columns)
    assert scored.height == day["sequences"] == storage.read_objects(out / "data", "purchases")["sequence_id"].n_unique()
    # counts for the most predicted items only, never one metric per catalogue item
    assert 0 < len(day["label_count"]) <= REPORTED_ITEMS
    top = scored.group_by("label").len().sort("len", descending=True)["len"][0]
    assert max(day["label_count"].values()) == top

    splits = pl.read_parquet(out / "sequences" / "next_item" / "splits.parquet")
    dev = splits.filter(pl.col("split") == "dev").select("sequence_id", "label")
    objects = storage.read_objects(out / "data", "purchases").join(dev, on="sequence_id", how="semi")
    assert KINDS["next_item"].promotion_metric == "recall_at_10"
    got = dev_score(load_bundle(bundle_dir), objects, dev, load_catalog().task("next_item"), [])
    on_dev = scored.join(dev, on="sequence_id", suffix="_true")
    assert got == pytest.approx(ranking_metrics_of_lists(on_dev["label_true"].to_list(),
                                                         on_dev["top_items"].to_list())["recall_at_10"])
    assert got == pytest.approx(json.loads((out / "plots" / "next_item" / "metrics.json").read_text())
                                ["dev"]["recall_at_10"])


def test_config_option_takes_inline_json_or_a_file(tmp_path):
    from training.cli.args import config_arg

    overrides = {"model": {"value_links": True}, "train": {"rounds": 2}}
    path = tmp_path / "overrides.json"
    path.write_text(json.dumps(overrides))
    assert config_arg(json.dumps(overrides)) == config_arg(str(path)) == overrides
    assert config_arg(None) == {}
    with pytest.raises(SystemExit, match="not valid JSON"):
        config_arg('{"model": ')
    path.write_text("[1, 2]")
    with pytest.raises(SystemExit, match="expected a JSON object"):
        config_arg(str(path))


def test_a_failed_sequences_stage_leaves_the_previous_outputs(prepared_task, tmp_path):
    """stage_sequences builds beside the task's folder and swaps it in: a run that fails (here:
    every key excluded) leaves the earlier files whole, and a good re-run replaces them."""
    import shutil

    work = tmp_path / "w"
    shutil.copytree(prepared_task("milestone"), work)
    seq_dir = pipeline.sequences_dir(work, "milestone")
    before = {p.name: p.read_bytes() for p in seq_dir.iterdir()}
    catalog = tmp_path / "c.toml"
    catalog.write_text('[sources.sessions]\nkind = "events"\n\n[tasks.milestone]\nsource = "sessions"\n'
                       'kind = "multiclass"\nkeep_keys = ["no_such_key"]\n')
    load_catalog(catalog)
    with pytest.raises(ValueError, match="every key"):
        pipeline.stage_sequences(str(work), resolve_task(catalog, "milestone"), "tiny", seed=0)
    assert {p.name: p.read_bytes() for p in seq_dir.iterdir()} == before
    assert not [p for p in seq_dir.parent.iterdir() if p.name.startswith(".")]  # no half-built folder left
    again = pipeline.stage_sequences(str(work), resolve_task(None, "milestone"), "tiny", seed=0)
    assert again["dir"] == str(seq_dir) and sorted(p.name for p in seq_dir.iterdir()) == sorted(before)
