"""``seqenc bench model``: the JSON contract and the three statuses, on tiny settings."""

import json

from seqenc.bench import ModelBenchSettings, bench_model, run_isolated, summarise
from seqenc.cli import main

TINY = ["--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--n-shared-heads", "1", "--window", "32",
        "--no-progress"]


def test_bench_model_writes_the_contracted_json_table_and_plot(tmp_path, capsys):
    out = tmp_path / "model.json"
    assert main(["bench", "model", "--json", str(out), "--n-objects", "5,20", "--n-keys", "2,3", *TINY]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert len(rows) == 2 * 2 * 2  # models x N x K
    for row in rows:
        assert {"model", "n_objects", "n_keys", "tokens", "seconds", "peak_mb", "status"} <= set(row)
        assert row["status"] == "ok" and row["seconds"] > 0 and row["peak_mb"] > row["baseline_mb"] > 0
    by = {(r["model"], r["n_objects"], r["n_keys"]): r for r in rows}
    # the same content: N x K values of 3 tokens + one key token each (+ markers)
    assert by[("flattened", 20, 3)]["tokens"] == 1 + 20 * (3 * 4 + 1)
    assert by[("tvmka", 20, 3)]["inputs"] > 3  # S(k) of 20 values does not fit one 32-token window
    assert {r["model"] for r in rows} == {"tvmka", "flattened"}
    assert out.with_suffix(".md").read_text().startswith("| model |")
    assert out.with_suffix(".png").stat().st_size > 0
    assert "| tvmka | 20 | 3 |" in capsys.readouterr().out


def test_memory_and_time_limits_give_oom_and_over_limit(tmp_path):
    s = ModelBenchSettings(n_objects=(5, 10), n_keys=(2,), models=("tvmka",), d_model=32, n_layers=1, n_heads=2,
                           n_shared_heads=1, window=32, max_mb=50)  # python + torch alone exceed 50 MB
    rows = bench_model(s, progress=False)["rows"]
    assert [r["status"] for r in rows] == ["oom", "oom"]
    assert rows[0]["predicted"] is False and rows[1]["predicted"] is True  # a larger N is not tried
    status, _, _ = run_isolated(["python", "-c", "import time; time.sleep(30)"], max_mb=10**6, max_seconds=0.5)
    assert status == "over_limit"


def test_summary_reports_the_linearity_ratio_and_first_failure():
    rows = [{"model": "tvmka", "n_objects": n, "n_keys": 25, "tokens": n * 100, "seconds": n / 100, "peak_mb": 500,
             "status": "ok"} for n in (1000, 3000)]
    rows += [{"model": "flattened", "n_objects": 1000, "n_keys": 25, "tokens": 100001, "seconds": 999.0,
              "peak_mb": None, "status": "over_limit"}]
    summary = summarise(rows)
    assert summary["tvmka_seconds_ratio_n3000_over_n1000_k25"] == 3.0
    assert summary["flattened_first_failure"] == {"n_objects": 1000, "n_keys": 25, "tokens": 100001,
                                                  "status": "over_limit"}


def test_prediction_is_quadratic_for_flattened_and_linear_for_tvmka():
    from seqenc.bench import _predict

    done = [{"status": "ok", "tokens": 1000, "seconds": 1.0, "peak_mb": 400.0, "baseline_mb": 300.0},
            {"status": "oom", "tokens": 2000, "seconds": None, "peak_mb": None, "baseline_mb": None}]
    assert _predict("flattened", 3000, done, "eager") == (9.0, 1200.0)
    assert _predict("flattened", 3000, done, "sdpa") == (9.0, 600.0)
    assert _predict("tvmka", 3000, done) == (3.0, 600.0)
    assert _predict("tvmka", 3000, done[1:]) is None
