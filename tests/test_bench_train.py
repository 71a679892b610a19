"""``seqenc bench train``: the JSON contract, the table and the plot, on the tiny size with 1 and
2 CPU ranks (gloo); the two ranks refresh the distinct windows the one rank does, each once,
about half the tokens each (training.engine.sharding.assign_owners balances tokens)."""

import json

import pytest

from training.cli.main import main


def test_bench_train_one_rank_against_two(tmp_path, capsys):
    out = tmp_path / "train.json"
    assert main(["bench", "train", "--json", str(out), "--size", "tiny", "--worlds", "1,2",
                 "--workdir", str(tmp_path / "work")]) == 0
    r = json.loads(out.read_text())
    assert r["settings"]["worlds"] == [1, 2] and r["settings"]["threads_per_rank"] == 1
    one, two = r["worlds"]
    assert (one["world"], len(one["ranks"]), two["world"], len(two["ranks"])) == (1, 1, 2, 2)
    windows = one["ranks"][0]["refresh_windows"]  # distinct windows, over the 3 refreshes of a tiny run
    assert sum(p["refresh_windows"] for p in two["ranks"]) == windows
    held = one["ranks"][0]["held_windows"]  # the one rank holds every window, the two a share each
    assert sum(p["held_windows"] for p in two["ranks"]) == held and all(0 < p["held_windows"] < held
                                                                        for p in two["ranks"])
    assert all(p["peak_rss_mb"] > 0 for w in (one, two) for p in w["ranks"])
    tokens = one["ranks"][0]["refresh_tokens"]
    assert sum(p["refresh_tokens"] for p in two["ranks"]) == tokens
    assert all(abs(p["refresh_tokens"] / tokens - 0.5) < 0.05 for p in two["ranks"]), two["ranks"]
    for w in (one, two):
        assert w["trainer_seconds"] > 0 and w["wall_seconds"] > w["trainer_seconds"] and w["refresh_seconds"] > 0
        assert w["trainer_seconds"] == w["ranks"][0]["fit_seconds"]
        assert set(w["metrics"]) == {"dev", "test"}
    ratio = r["ratios"]["2"]
    assert ratio["windows_share"] == pytest.approx(0.5, abs=0.01)
    assert ratio["trainer_seconds"] == pytest.approx(two["trainer_seconds"] / one["trainer_seconds"], rel=1e-2)
    assert ratio["refresh_seconds"] == pytest.approx(two["refresh_seconds"] / one["refresh_seconds"], rel=1e-2)

    table = out.with_suffix(".md").read_text()
    assert table.startswith("| world | rank |") and "| 2 | 1 |" in table and "2 ranks / 1 rank:" in table
    assert "| 2 | 1 |" in capsys.readouterr().out
    assert out.with_suffix(".png").stat().st_size > 0


def test_bench_train_needs_one_rank_to_compare_with(tmp_path):
    from cli_error import cli_error

    message = cli_error(["bench", "train", "--json", str(tmp_path / "t.json"), "--worlds", "2"])
    assert "--worlds 2 must include 1" in message
    assert not (tmp_path / "t.json").exists()
