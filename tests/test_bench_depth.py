"""seqenc bench depth on a few real TabFact tables over the offline MiniLM (tiny: a handful of
steps per cell): the JSON contract, the three inits, DT-Fixup's measured mu, curves and runs."""

import json

import mlflow
import pytest
from shared_data import DATA, require

from training import tracking
from training.cli import main


def test_bench_depth_writes_the_contract(tmp_path):
    data = require(DATA / "tabfact").parent
    out = tmp_path / "depth.json"
    assert main(["bench", "depth", "--json", str(out), "--data-dir", str(data), "--tasks", "tabfact",
                 "--tabfact-tables", "6", "--depths", "1,2", "--seeds", "0", "--steps", "4", "--warmup", "2",
                 "--no-progress"]) == 0
    r = json.loads(out.read_text())
    rows = r["rows"]
    assert {(x["depth"], x["init"]) for x in rows} == {(d, i) for d in (1, 2)
                                                       for i in ("default_warmup", "default", "dt_fixup")}
    for x in rows:
        assert {"task", "depth", "init", "seed", "metric", "final_train_loss"} <= set(x)
        assert x["task"] == "tabfact" and 0 <= x["metric"] <= 1 and x["final_train_loss"] > 0
        assert (x["fixup_mu"] > 1) == (x["init"] == "dt_fixup")  # measured on the data, DT-Fixup only
    assert (tmp_path / "depth-curves.png").is_file() and out.with_suffix(".md").is_file()
    mlflow.set_tracking_uri(tracking.tracking_uri(tmp_path / "depth"))
    runs = mlflow.search_runs(search_all_experiments=True)
    assert len(runs) == len(rows) + 1  # a run per cell, and the summary with the plot
    with pytest.raises(SystemExit, match="--inits: unknown fixup"):  # a user error: one line
        main(["bench", "depth", "--json", str(out), "--inits", "fixup"])
