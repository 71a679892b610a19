"""seqenc bench depth on a few real TabFact tables over the offline MiniLM (tiny: a handful of
steps per cell): the JSON contract, the three inits, DT-Fixup's measured mu, curves and runs."""

import json

import mlflow
import pytest
from shared_data import DATA, require

from training.cli.main import main
from training.serving import tracking


def test_bench_depth_writes_the_contract(tmp_path):
    data = require(DATA / "tabfact").parent
    out = tmp_path / "depth.json"
    assert main(["bench", "depth", "--json", str(out), "--data-dir", str(data), "--tasks", "tabfact",
                 "--tabfact-tables", "6", "--depths", "1,2", "--seeds", "0", "--steps", "4", "--warmup", "2",
                 "--no-progress"]) == 0
    r = json.loads(out.read_text())
    floors = [x for x in r["rows"] if x["depth"] is None]  # beside the cells: the floor and the counts
    rows = [x for x in r["rows"] if x["depth"] is not None]
    assert [x["init"] for x in floors] == ["majority", "count_lr_values"]
    for x in floors:
        assert x["task"] == "tabfact" and 0 <= x["metric"] <= 1 and 0 <= x["dev_metric"] <= 1
    assert floors[0]["metric"] >= 0.3  # the train majority class's share of test (labels near balanced)
    assert {(x["depth"], x["init"]) for x in rows} == {(d, i) for d in (1, 2)
                                                       for i in ("default_warmup", "default", "dt_fixup")}
    for x in rows:
        assert {"task", "depth", "init", "seed", "metric", "final_train_loss"} <= set(x)
        assert x["task"] == "tabfact" and 0 <= x["metric"] <= 1 and 0 <= x["dev_metric"] <= 1
        assert x["final_train_loss"] > 0 and x["dev_loss"] > 0 and x["diverged"] is False
        assert (x["fixup_mu"] > 1) == (x["init"] == "dt_fixup")  # measured on the data, DT-Fixup only
    assert (tmp_path / "depth-curves.png").is_file() and out.with_suffix(".md").is_file()
    mlflow.set_tracking_uri(tracking.tracking_uri(tmp_path / "depth"))
    runs = mlflow.search_runs(search_all_experiments=True)
    assert len(runs) == len(rows) + 1  # a run per cell, and the summary with the plot
    assert "| tabfact | - | majority |" in out.with_suffix(".md").read_text()
    with pytest.raises(SystemExit, match="--inits: unknown fixup"):  # a user error: one line
        main(["bench", "depth", "--json", str(out), "--inits", "fixup"])


def test_a_diverged_cell_is_a_row_without_metrics_not_a_crash():
    """A learning rate far too large for the depth turns the loss non-finite: the cell stops
    there and says so (``diverged``, null metrics), the table still renders, the JSON stays valid."""
    import numpy as np
    import polars as pl
    import torch

    from seqenc.sequences import collect_value_sequences, tokenize_value_sequences
    from seqenc.tokenizer import ValueTokenizer
    from training.bench.depth import DepthBenchSettings, TaskKRs, depth_table, train_cell

    rows = [(f"s{i:02d}", step, key, f"{key}{(i + step) % 3}") for i in range(40) for step in range(3)
            for key in ("a", "b")]
    objects = pl.DataFrame(rows, schema=["sequence_id", "step", "key", "value"], orient="row")
    data = tokenize_value_sequences(collect_value_sequences(objects), ValueTokenizer.from_bert("minilm"), max_len=16)
    torch.manual_seed(0)
    kr = torch.randn(len(data.keys), 384) * 5
    y = np.arange(len(data.sequence_ids)) % 2
    splits = {"train": np.arange(24), "dev": np.arange(24, 32), "test": np.arange(32, 40)}
    t = TaskKRs("toy", "f1", kr, data, y, splits, ["normal", "anomaly"])
    row, losses = train_cell(t, 2, "default", 0, DepthBenchSettings(data_dir="", steps=30, lr=1e4, batch_size=8))
    assert row["diverged"] is True and len(losses) < 30 and np.isfinite(losses).all()
    assert row["metric"] is None and row["dev_metric"] is None and row["dev_loss"] is None
    assert row["final_train_loss"] is None
    sane, _ = train_cell(t, 2, "default", 0, DepthBenchSettings(data_dir="", steps=5, lr=1e-4, batch_size=8))
    assert sane["diverged"] is False and sane["metric"] is not None
    table = depth_table({"rows": [row, sane]})
    assert "| toy | 2 | default |" in table and table.splitlines()[-1].endswith("| 2 | 1 |")  # 2 seeds, 1 diverged
    json.loads(json.dumps({"rows": [row], "curves": {"x": losses}}, allow_nan=False))


def test_hdfs_blocks_are_a_depth_task_with_one_kr_per_block(tmp_path):
    """``hdfs``: real HDFS blocks, split by content (no test block's event sequence in train),
    one key (``event``) per block, scored by F1 of the anomaly class; a cell trains on its KRs."""
    import numpy as np

    from training.bench.depth import DepthBenchSettings, task_krs, train_cell

    data = require(DATA / "hdfs_deeplog").parent
    s = DepthBenchSettings(data_dir=str(data), tasks=("hdfs",), hdfs_lines=60, steps=6, warmup=2, batch_size=8)
    t = task_krs("hdfs", s, tmp_path, progress=False)
    assert t.metric == "f1" and t.class_names == ["Normal", "Anomaly"]
    assert len(t.data.keys) == len(t.y) and set(t.data.keys) == {"event"}  # one KR per block
    assert set(np.unique(t.y)) == {0, 1} and all(len(t.splits[p]) for p in ("train", "dev", "test"))
    windows = {}
    for w, row in zip(t.data.windows, t.data.window_key):  # key row = block: its S(k), in windows
        windows.setdefault(int(row), []).append(tuple(w))
    content = [tuple(windows[i]) for i in range(len(t.y))]
    assert not {content[i] for i in t.splits["train"]} & {content[i] for i in t.splits["test"]}
    row, losses = train_cell(t, 2, "dt_fixup", 0, s)
    assert row["task"] == "hdfs" and row["diverged"] is False and 0 <= row["metric"] <= 1 and len(losses) == 6
    # the floor (flag every block) and the counts, on the same split
    floor, counts = t.floors
    assert (floor["init"], counts["init"]) == ("always_positive", "count_lr_values")
    positives = t.y[t.splits["test"]].mean()
    assert floor["metric"] == np.float64(2 * positives / (1 + positives)) or abs(
        floor["metric"] - 2 * positives / (1 + positives)) < 1e-9
    assert 0 <= counts["metric"] <= 1 and counts["dev_metric"] is not None
