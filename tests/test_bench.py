"""``seqenc bench model``: the JSON contract and the three statuses, on tiny settings."""

import json

from training.bench.model import ModelBenchSettings, bench_model, expected_tokens, run_isolated, summarise, table
from training.cli.main import main

TINY = ["--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--n-shared-heads", "1", "--window", "32",
        "--no-progress"]


def test_bench_model_writes_the_contracted_json_table_and_plot(tmp_path, capsys):
    out = tmp_path / "model.json"
    assert main(["bench", "model", "--json", str(out), "--n-objects", "5,20", "--n-keys", "3", *TINY]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert len(rows) == 3 * 2 * 1  # models x N x K
    for row in rows:
        assert {"model", "n_objects", "n_keys", "tokens", "seconds", "peak_mb", "status", "predicted"} <= set(row)
        assert row["status"] == "ok" and row["seconds"] > 0 and row["peak_mb"] > row["baseline_mb"] > 0
        assert row["predicted"] is False  # every row here was run
    by = {(r["model"], r["n_objects"], r["n_keys"]): r for r in rows}
    # the same content: N x K values of 3 tokens + one key token each (+ markers)
    assert by[("flattened_full", 20, 3)]["tokens"] == 1 + 20 * (3 * 4 + 1)
    assert by[("flattened_full", 20, 3)]["objects_kept"] == 20 and not by[("flattened_full", 20, 3)]["truncated"]
    assert by[("tvmka", 20, 3)]["inputs"] > 3  # S(k) of 20 values does not fit one 32-token window
    assert {r["model"] for r in rows} == {"tvmka", "flattened_truncated", "flattened_full"}
    assert out.with_suffix(".md").read_text().startswith("| model |")
    assert out.with_suffix(".png").stat().st_size > 0
    assert "| tvmka | 20 | 3 |" in capsys.readouterr().out


def test_truncated_flattened_baseline_keeps_the_most_recent_objects_within_the_window(tmp_path):
    s = ModelBenchSettings(n_objects=(2, 20), n_keys=(3,), models=("flattened_truncated",), d_model=32,
                           n_layers=1, n_heads=2, n_shared_heads=1, window=32, repeat=1)
    rows = bench_model(s, progress=False)["rows"]
    for row in rows:
        assert row["status"] == "ok" and row["truncated"] is True and row["max_tokens"] == 32
        assert row["tokens"] <= 32  # never past the window, as in training
        assert row["tokens"] == expected_tokens("flattened_truncated", row["n_objects"], 3, s)
    small, big = rows
    assert small["objects_kept"] == 2  # 1 + 2 x 13 tokens fit
    assert big["objects_kept"] == 2 and big["tokens"] == 1 + 2 * 13  # 18 older objects left out


def test_memory_and_time_limits_give_oom_and_over_limit(tmp_path):
    s = ModelBenchSettings(n_objects=(5, 10), n_keys=(2,), models=("tvmka",), d_model=32, n_layers=1, n_heads=2,
                           n_shared_heads=1, window=32, max_mb=50)  # python + torch alone exceed 50 MB
    result = bench_model(s, progress=False)
    rows = result["rows"]
    assert [r["status"] for r in rows] == ["oom", "oom"]
    assert rows[0]["predicted"] is False and rows[1]["predicted"] is True  # a larger N is not tried
    assert result["summary"]["tvmka_first_failure"]["predicted"] is False  # N=5 was run and killed
    md = table(result).splitlines()
    assert md[2].endswith("| oom |") and md[3].endswith("| oom (pred.) |")
    status, _, _ = run_isolated(["python", "-c", "import time; time.sleep(30)"], max_mb=10**6, max_seconds=0.5)
    assert status == "over_limit"


def test_summary_reports_the_linearity_ratio_and_first_failure():
    rows = [{"model": "tvmka", "n_objects": n, "n_keys": 25, "tokens": n * 100, "seconds": n / 100, "peak_mb": 500,
             "status": "ok"} for n in (1000, 3000)]
    rows += [{"model": "flattened_full", "n_objects": 1000, "n_keys": 25, "tokens": 100001, "seconds": 999.0,
              "peak_mb": None, "status": "over_limit", "predicted": True}]
    summary = summarise(rows)
    assert summary["tvmka_seconds_ratio_n3000_over_n1000_k25"] == 3.0
    assert summary["flattened_full_first_failure"] == {"n_objects": 1000, "n_keys": 25, "tokens": 100001,
                                                       "status": "over_limit", "predicted": True}


def test_prediction_is_quadratic_for_flattened_and_linear_for_tvmka():
    from training.bench.model import _predict

    done = [{"status": "ok", "tokens": 1000, "seconds": 1.0, "peak_mb": 400.0, "baseline_mb": 300.0},
            {"status": "oom", "tokens": 2000, "seconds": None, "peak_mb": None, "baseline_mb": None}]
    assert _predict("flattened_full", 3000, done, "eager") == (9.0, 1200.0)
    assert _predict("flattened_full", 3000, done, "sdpa") == (9.0, 600.0)
    assert _predict("tvmka", 3000, done) == (3.0, 600.0)
    assert _predict("tvmka", 3000, done[1:]) is None
