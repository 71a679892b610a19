"""``seqenc bench score``: the JSON contract, the table, and batched scores == one-at-a-time scores."""

import functools
import json

import numpy as np
import polars as pl
import pytest

import training.bench.score as bench_score
from training.cli.main import main

TINY_MODEL = {"d_model": 32, "n_layers": 1, "n_heads": 2, "n_shared_heads": 1, "d_ff": 64, "max_positions": 64,
              "vocab_size": 512}


def test_bench_score_contract_and_batching_keeps_the_scores(tmp_path, monkeypatch, capsys):
    # the CLI fixes the model size (d_model 256, 4 layers); the test swaps in a tiny one
    monkeypatch.setattr(bench_score, "ScoreBenchSettings",
                        functools.partial(bench_score.ScoreBenchSettings, **TINY_MODEL))
    out, work = tmp_path / "score.json", tmp_path / "work"
    assert main(["bench", "score", "--json", str(out), "--sequences", "40", "--baseline-sequences", "12",
                 "--threads", "1", "--workdir", str(work), "--no-progress", "--chunk-sequences", "16",
                 "--small-chunk", "5"]) == 0
    r = json.loads(out.read_text())

    assert isinstance(r["sequences"], int) and isinstance(r["seconds"], float)
    assert isinstance(r["sequences_per_s"], float)
    assert r["sequences"] == 40 and r["seconds"] > 0
    assert r["sequences_per_s"] == pytest.approx(r["sequences"] / r["seconds"], rel=1e-2)
    b = r["baseline"]
    assert b["sequences"] == 12 and b["seconds"] > 0
    assert b["sequences_per_s"] == pytest.approx(b["sequences"] / b["seconds"], rel=1e-2)
    assert r["speedup"] == pytest.approx(r["sequences_per_s"] / b["sequences_per_s"], rel=2e-2)
    assert r["weights"] == "random init" and r["torch_threads"] == 1
    assert r["model"]["d_model"] == 32 and r["model"]["n_layers"] == 1
    assert r["data"]["sample_windows"] >= r["data"]["sample_keys"] > r["sequences"] and r["data"]["sample_tokens"] > 0
    assert r["data"]["sequences"] == 40 and r["data"]["rows"] > r["data"]["objects"] > 40
    assert r["peak_rss_mb"] > 0 and r["load_seconds"] > 0 and r["chunk_sequences"] == 16
    # every sequence scored again five at a time: chunking changes neither a score nor a prediction
    small = r["small_batches"]
    assert small["chunk_sequences"] == 5 and small["sequences"] == 40 and small["peak_rss_mb"] > 0
    assert small["max_abs_score_diff"] < 1e-5 and small["same_predictions"] is True
    assert pl.read_parquet(work / "predictions_small_batches.parquet").height == 40

    table = out.with_suffix(".md").read_text()
    assert table.startswith("| model |") and "| d32 L1 h2 p1 w64 | 1 | 40 | 16 |" in table
    assert "| d32 L1 h2 p1 w64 | 1 | 40 | 16 |" in capsys.readouterr().out

    # every scored sequence is there once, and batching changes speed, not results
    batched = pl.read_parquet(work / "predictions_batched.parquet")
    single = pl.read_parquet(work / "predictions_baseline.parquet")
    assert batched.height == 40 and batched["sequence_id"].n_unique() == 40
    assert single.height == 12
    joined = single.join(batched, on="sequence_id", how="inner", suffix="_batched")
    assert joined.height == 12
    assert np.allclose(joined["score"].to_numpy(), joined["score_batched"].to_numpy(), rtol=1e-5, atol=1e-6)
    assert joined["prediction"].to_list() == joined["prediction_batched"].to_list()
    assert r["max_abs_score_diff"] < 1e-5 and r["same_predictions"] is True
    assert len(set(batched["score"].to_list())) > 1  # a real model ran: the scores differ between sequences


def test_batch_scoring_in_chunks_gives_the_rows_of_one_pass(tmp_path):
    """``seqenc score`` reads a day lazily and scores it a chunk of sequences at a time: the same
    rows (every sequence once, sorted) as one chunk holding the whole day."""
    from training.serving.batch_score import score_partitions

    settings = bench_score.ScoreBenchSettings(sequences=30, **TINY_MODEL)
    root, bundle, stats = bench_score.prepare(settings, tmp_path / "work")
    one = score_partitions(str(bundle), root, tmp_path / "one", progress=False, chunk_sequences=10_000)
    chunked = score_partitions(str(bundle), root, tmp_path / "chunked", progress=False, chunk_sequences=7)
    a = pl.read_parquet(one["dates"][0]["predictions"])
    b = pl.read_parquet(chunked["dates"][0]["predictions"])
    assert a.height == b.height == stats["sequences"] == 30 and b["sequence_id"].is_sorted()
    assert a["sequence_id"].to_list() == b["sequence_id"].to_list()
    assert np.allclose(a["score"].to_numpy(), b["score"].to_numpy(), rtol=1e-5, atol=1e-6)
    assert a["label"].to_list() == b["label"].to_list()
    with pytest.raises(ValueError, match="chunk_sequences must be >= 1"):
        score_partitions(str(bundle), root, tmp_path / "zero", progress=False, chunk_sequences=0)
