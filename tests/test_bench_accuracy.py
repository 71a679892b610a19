"""`seqenc bench accuracy` writes the contracted JSON (+ table, plot, dataset descriptions)."""

import json
import subprocess
import sys

import pytest
from shared_data import require

from training.cli.main import main
from training.tasks.thresholds import DEFAULT_RULE, THRESHOLD_RULES

FIELDS = {"precision", "recall", "f1", "macro_f1", "micro_f1", "seconds"}
DEV_FIELD = {"hdfs": "dev_f1", "milestone": "dev_macro_f1"}  # each row's dev figure: dev_<headline metric>


def test_bench_accuracy_cli_contract(tmp_path):
    data = require()
    out = tmp_path / "acc.json"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"train": {"pretrain_steps": 4, "rounds": 1, "tvm_steps_per_round": 4}}))
    cmd = [sys.executable, "-m", "training.cli.main", "bench", "accuracy", "--data", str(data), "--json", str(out),
           "--size", "tiny", "--datasets", "hdfs,milestone", "--modes", "interleaved,flattened",
           "--limit", "hdfs=100", "--limit", "milestone=60", "--config", str(config), "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    # same seed, another process (new hash seeds, new vocabulary training): the same figures
    again = tmp_path / "again.json"
    redo = [*cmd[:cmd.index("--json") + 1], str(again), *cmd[cmd.index("--json") + 2:]]
    redo[redo.index("--datasets") + 1] = "milestone"
    done = subprocess.run(redo, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    for mode, metrics in json.loads(again.read_text())["milestone"].items():
        assert {k: v for k, v in metrics.items() if k != "seconds"} == \
            {k: v for k, v in result["milestone"][mode].items() if k != "seconds"}, mode
    assert set(result) == {"hdfs", "milestone"}
    # binary: + loglizer's unsupervised PCA and the floor
    assert set(result["hdfs"]) == {"interleaved", "flattened", "count_lr", "count_lr_values", "count_pca",
                                   "iforest", "lof", "ocsvm", "always_positive"}
    assert set(result["milestone"]) == {"interleaved", "flattened", "count_lr", "count_lr_values"}
    for name, modes in result.items():
        for mode, metrics in modes.items():
            binary = {"average_precision", "dev_average_precision", "dev_log_loss"} if name == "hdfs" else set()
            if mode in ("iforest", "lof", "ocsvm"):  # the peers: the library's threshold and the rule's
                binary |= {"f1_default", "dev_f1_default", "roc_auc", "threshold_policy"}
            if name == "hdfs" and mode in ("interleaved", "flattened", "count_lr", "count_lr_values"):
                # every binary threshold rule (training.tasks.thresholds): its dev figure and its test F1
                binary |= {f"{kind}{rule}" for rule in THRESHOLD_RULES for kind in ("f1_", "dev_cv_f1_")}
                assert 0 <= metrics["dev_cv_f1_one_se"] <= 1 and 0 <= metrics["f1_half"] <= 1
                assert metrics["f1"] == metrics[f"f1_{DEFAULT_RULE}"]  # the row's F1 is the default rule's
            assert set(metrics) == FIELDS | {DEV_FIELD[name]} | binary
            assert 0 <= metrics["macro_f1"] <= 1 and metrics["seconds"] >= 0 and 0 <= metrics[DEV_FIELD[name]] <= 1
    assert all(result["milestone"][m]["f1"] is None for m in result["milestone"])  # C-way: no binary F1
    # 100 blocks a file: 40 test blocks whose event sequences train never holds (at 40 a file, 16
    # test blocks, one miss moved F1 to 0.67); counts LR reaches 1.0 on this seed
    assert result["hdfs"]["count_lr"]["f1"] > 0.8
    # the threshold-free figures (finer than F1 at the ceiling): a trained row and counts LR have
    # them; the floor's constant score ranks nothing, so its average precision is the positive share
    for mode in ("interleaved", "count_lr"):
        row = result["hdfs"][mode]
        assert 0 < row["average_precision"] <= 1 and 0 < row["dev_average_precision"] <= 1 and row["dev_log_loss"] > 0
    floor = result["hdfs"]["always_positive"]
    assert floor["recall"] == 1.0 and floor["precision"] == floor["micro_f1"]
    assert floor["average_precision"] == pytest.approx(floor["precision"])
    described = json.loads(out.with_suffix(".datasets.json").read_text())
    hdfs = described["hdfs"]
    assert hdfs["split"] == "by_content" and "Split by_content" in hdfs["description"]
    assert hdfs["duplicates_across_splits"] == 0 and hdfs["settings"]["train"]["rounds"] == 1
    assert described["milestone"]["split"] == "stratified"
    assert isinstance(described["milestone"]["duplicates_across_splits"], int)
    assert out.with_suffix(".md").read_text().startswith("| dataset | mode |") and out.with_suffix(".png").stat().st_size
    # --split by_line: the earlier split, labelled as such, with test blocks that repeat train ones
    by_line = tmp_path / "by_line.json"
    redo = [*cmd[:cmd.index("--json") + 1], str(by_line), *cmd[cmd.index("--json") + 2:], "--split", "by_line"]
    redo[redo.index("--datasets") + 1] = "hdfs"
    redo[redo.index("--modes") + 1] = "interleaved"
    done = subprocess.run(redo, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    hdfs = json.loads(by_line.with_suffix(".datasets.json").read_text())["hdfs"]
    assert hdfs["split"] == "by_line" and "floor(0.6n) train" in hdfs["description"]
    assert hdfs["bag_duplicates_across_splits"] >= hdfs["duplicates_across_splits"] > 0  # a repeat is a bag repeat


def test_by_line_split_is_refused_for_datasets_without_one(tmp_path):
    with pytest.raises(SystemExit, match="dataset 'bgl' has no split 'by_line'"):
        main(["bench", "accuracy", "--data", str(tmp_path), "--json", str(tmp_path / "x.json"),
              "--datasets", "hdfs,bgl", "--split", "by_line"])
    assert not (tmp_path / "x.json").exists()


def test_bench_accuracy_over_seeds_reports_mean_std_and_each_seed(tmp_path):
    """``--seeds 0,1``: each row is the mean over the seeds, each seed's row is what a run with
    that seed alone gives, and the table shows the spread."""
    import numpy as np

    from training.bench.accuracy import accuracy_table, bench_accuracy, write_accuracy_outputs

    data = require()
    args = {"datasets": ["milestone"], "modes": ["interleaved"], "size": "tiny", "limits": {"milestone": 60},
            "config": {"train": {"pretrain_steps": 4, "rounds": 1, "tvm_steps_per_round": 4}}, "progress": False}
    both, described = bench_accuracy(data, tmp_path / "both", seeds=[0, 1], **args)
    alone, _ = bench_accuracy(data, tmp_path / "alone", seeds=[1], **args)
    assert described["milestone"]["seeds"] == [0, 1]
    for mode in ("interleaved", "count_lr"):
        row = both["milestone"][mode]
        assert set(row["per_seed"]) == {"0", "1"}
        per_seed = [row["per_seed"][s] for s in ("0", "1")]
        for field in ("macro_f1", "micro_f1"):
            assert row[field] == np.mean([r[field] for r in per_seed])
            assert row["std"][field] == np.std([r[field] for r in per_seed], ddof=1)
        assert row["f1"] is None and row["std"]["f1"] is None  # C-way: no binary F1 in any seed
        assert {k: v for k, v in row["per_seed"]["1"].items() if k != "seconds"} == \
            {k: v for k, v in alone["milestone"][mode].items() if k != "seconds"}
        assert "std" not in alone["milestone"][mode]  # one seed: the plain contracted row
    assert " ± " in accuracy_table(both)
    paths = write_accuracy_outputs(both, described, tmp_path / "out.json")
    assert json.loads(paths[0].read_text())["milestone"]["interleaved"]["per_seed"]["0"]["macro_f1"] is not None


def test_bench_scores_one_training_with_and_without_the_surprise(tmp_path, caplog):
    """``--modes interleaved,interleaved+surprise`` trains once: the plain row is the one a
    separate ``interleaved`` training gives (same seed), and only one run folder is made; both
    rows are logged as each seed ends (a long run stopped early keeps them)."""
    import logging

    from training.bench.accuracy import bench_accuracy

    caplog.set_level(logging.INFO, logger="training.bench.accuracy")

    data = require()
    args = {"datasets": ["hdfs"], "size": "tiny", "limits": {"hdfs": 40}, "progress": False,
            "config": {"train": {"pretrain_steps": 4, "rounds": 1, "tvm_steps_per_round": 4}}}
    both, _ = bench_accuracy(data, tmp_path / "both", modes=["interleaved", "interleaved+surprise"], **args)
    logged = [r.getMessage().split(":")[0] for r in caplog.records if r.name == "training.bench.accuracy"]
    assert "hdfs interleaved" in logged and "hdfs interleaved+surprise" in logged
    plain, _ = bench_accuracy(data, tmp_path / "plain", modes=["interleaved"], **args)
    assert list(both["hdfs"]) == ["interleaved", "interleaved+surprise", "count_lr", "count_lr_values", "count_pca",
                                  "iforest", "lof", "ocsvm", "always_positive"]
    assert {k: v for k, v in both["hdfs"]["interleaved"].items() if k != "seconds"} == \
        {k: v for k, v in plain["hdfs"]["interleaved"].items() if k != "seconds"}
    assert both["hdfs"]["interleaved"]["seconds"] == both["hdfs"]["interleaved+surprise"]["seconds"]
    assert sorted(p.name for p in (tmp_path / "both" / "runs" / "hdfs").iterdir()) == ["interleaved+surprise"]
