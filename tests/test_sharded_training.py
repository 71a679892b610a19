"""Data parallelism that divides the work (training.engine.sharding, training.tasks.sequence_build):
with two CPU ranks (gloo, started as torchrun starts them) each rank builds the value sequences of
half the sequences, encodes half the distinct windows of every KR refresh and scores half the
sequences of the final surprise; rank 0 writes one rank's sequence files, every rank ends with the
whole cache, the metrics are one rank's, and the bundle rank 0 saves loads and scores."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import polars as pl
import pytest
import torch
from ranks import run_ranks

from training.pipeline.stages import stage_generate, stage_ingest

# the KA with the surprise combined (seqenc.surprise): a final phase whose cost is divided too
CONFIG = {"model": {"surprise_scoring": True}}


def _printed(out: str) -> dict:
    return json.loads(out[out.index("{\n"):out.index("\n}") + 2])


def test_two_ranks_divide_the_refresh_and_match_one_rank(tmp_path):
    """The same tiny job (hdfs ``anomaly``, size tiny, seed 0) on 1 rank (no DeepSpeed, the
    plain trainer: what every single-process run does) and on 2 ranks (DeepSpeed ZeRO-0, gloo).

    Work: each rank of the 2-rank run encodes ceil or floor of half the distinct windows of
    every refresh (the unit divided, training.engine.sharding; counted by the trainer: the
    windows it passed to the TVM, not the share it was assigned), the two shares add up to the
    windows and tokens the 1-rank run encoded, and each scores half the sequences' surprise.

    Metrics: the two runs are not bit-identical and are not meant to be. A rank's masked-LM
    loss is the mean over *its* half of the batch and DeepSpeed averages the halves' gradients,
    which weighs the masked tokens of the half with fewer of them a little more than one rank's
    mean over the whole batch (the data-parallel design of training.engine.engines, not the
    sharded refresh: test_the_ranks_shares_of_the_windows_give_the_whole_cache shows the
    divided refresh gives the whole cache to 1e-5). Measured on this job: the KR caches of the
    two runs differ by at most 0.033 (mean |KR| 0.86) already after the first round, the bundles'
    scores by 0.004 on average (one sequence of 40 by 0.09), and the average precision of the
    scored test split is equal (0.775). So the tolerances are: scores' mean absolute difference
    < 0.02; average precision within 0.05; micro F1 within 0.1 (two of the 20 test sequences
    changing side of the threshold, which the surprise's discrete tail scores make possible:
    measured 0.85 against 0.90); precision / recall / F1 within 0.2 (the tiny test split holds
    four anomalies, so one flagged sequence moves precision by 0.1 or more: measured 0.375
    against 0.5)."""
    one, two = tmp_path / "one", tmp_path / "two"
    raw = stage_generate(str(one), "tiny", 0)
    stage_ingest(str(one), "hdfs", raw["hdfs"]["path"], raw["hdfs"]["labels"])
    shutil.copytree(one / "data", two / "data")
    base = [sys.executable, "-m", "training.cli.main", "train", "--task", "anomaly", "--size", "tiny",
            "--no-progress", "--config", json.dumps(CONFIG)]
    [single] = run_ranks(base + ["--workdir", str(one)], tmp_path, world=1, env={"OMP_NUM_THREADS": "1"})
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 0}}))
    outputs = run_ranks(base + ["--workdir", str(two), "--deepspeed", str(ds)], tmp_path, world=2,
                        env={"OMP_NUM_THREADS": "1"})
    single = _printed(single)
    printed = [_printed(out) for out in outputs]

    alone = single["data_parallel"]
    assert alone["world"] == 1 and alone["work"]["refreshes"] == 3  # 2 rounds + the final model
    n_windows = alone["work"]["refresh_windows"] // 3  # distinct windows of one refresh
    per_rank = printed[0]["data_parallel"]["per_rank"]
    assert printed[1]["data_parallel"]["per_rank"] == per_rank  # every rank gathered the same counts
    assert [p["refreshes"] for p in per_rank] == [3, 3]
    assert [p["refresh_windows"] for p in per_rank] == [3 * -(-n_windows // 2), 3 * (n_windows // 2)]
    assert sum(p["refresh_tokens"] for p in per_rank) == alone["work"]["refresh_tokens"]
    n_seq = alone["work"]["surprise_sequences"]
    assert [p["surprise_sequences"] for p in per_rank] == [-(-n_seq // 2), n_seq // 2]
    assert sum(p["mlm_rows"] for p in per_rank) == alone["work"]["mlm_rows"]  # the same batches, split
    assert all(p["refresh_seconds"] > 0 and p["fit_seconds"] > 0 for p in per_rank)

    # the value sequences: each rank built half the sequences, and rank 0 wrote one rank's files
    seqs = {name: w / "sequences" / "anomaly" for name, w in (("one", one), ("two", two))}
    for name in ("windows.parquet", "splits.parquet"):
        assert pl.read_parquet(seqs["one"] / name).equals(pl.read_parquet(seqs["two"] / name)), name
    assert (seqs["one"] / "tokenizer.json").read_text() == (seqs["two"] / "tokenizer.json").read_text()
    built = json.loads((seqs["two"] / "stats.json").read_text())["build_ranks"]
    n_sequences = json.loads((seqs["one"] / "stats.json").read_text())["sequences"]
    assert [b["sequences"] for b in built] == [-(-n_sequences // 2), n_sequences // 2]

    # every rank holds the whole cache: both ranks' last caches are equal, and the single run's up to rounding
    job = two / "models" / "anomaly" / "job"
    from safetensors.torch import load_file

    caches = [load_file(str(job / f"kr_cache_v3.rank-{r}.safetensors"))["kr"] for r in (0, 1)]
    assert torch.equal(caches[0], caches[1])
    alone_cache = load_file(str(one / "models" / "anomaly" / "job" / "kr_cache_v3.safetensors"))["kr"]
    assert alone_cache.shape == caches[0].shape and (alone_cache - caches[0]).abs().max() < 0.05

    assert printed[0]["metrics"]["test"] == printed[1]["metrics"]["test"]  # one model on both ranks
    for split in ("dev", "test"):
        for name, value in single["metrics"][split].items():
            tolerance = 0.1 if name == "micro_f1" else 0.2
            assert printed[0]["metrics"][split][name] == pytest.approx(value, abs=tolerance), (split, name)

    # the bundle rank 0 saved loads the way ``seqenc score`` loads it, and scores as one rank's does
    from training.pipeline.stages import stage_score
    from training.serving.scoring import load_bundle

    model, tok, meta = load_bundle(printed[0]["model_dir"])
    assert meta["mode"] == "interleaved" and "surprise" in meta and tok.vocab_size > 0
    scored = {name: stage_score(str(workdir), "anomaly", progress=False) for name, workdir in
              (("one", one), ("two", two))}
    frames = {name: pl.read_parquet(s["predictions"]).sort("sequence_id") for name, s in scored.items()}
    assert frames["one"]["sequence_id"].to_list() == frames["two"]["sequence_id"].to_list()
    assert np.abs(frames["one"]["score"].to_numpy() - frames["two"]["score"].to_numpy()).mean() < 0.02
    assert scored["two"]["metrics"]["average_precision"] == pytest.approx(
        scored["one"]["metrics"]["average_precision"], abs=0.05)


def test_the_ranks_shares_of_the_windows_give_the_whole_cache():
    """The shares of two ranks, encoded apart and put together (the all-gather done by hand, in
    one process), pool to the KRs seqenc.inference.key_representations gives; one rank's path
    is key_representations exactly."""
    from seqenc.config import TVMKAConfig
    from seqenc.inference import key_representations
    from seqenc.model import TVMKA, pool_windows
    from seqenc.sequences import TokenizedSequences
    from training.engine.sharding import distinct_windows, encode_windows, sharded_key_representations, window_shares

    rng = np.random.default_rng(0)
    window_key = np.sort(rng.integers(0, 9, size=30))
    windows = [list(rng.integers(5, 50, size=rng.integers(3, 12))) for _ in window_key]
    windows[7] = windows[3] = windows[20]  # a window several keys share: encoded once
    data = TokenizedSequences(sequence_ids=["a", "b", "c"], keys=[f"k{i}" for i in range(9)],
                              key_seq=np.repeat([0, 1, 2], 3), window_key=window_key, windows=windows)
    torch.manual_seed(0)
    tvm = TVMKA(TVMKAConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, n_shared_heads=1, d_ff=32,
                            max_positions=16, n_classes=2)).tvm
    whole = key_representations(tvm, data, 0, progress=False)
    alone, counts = sharded_key_representations(tvm, data, 0, rank=0, world=1, progress=False)
    assert torch.equal(alone, whole) and counts["windows"] == 28

    window_unique, unique, lengths = distinct_windows(data)
    shares = window_shares(lengths, 2)
    assert sorted(np.concatenate(shares).tolist()) == list(range(28)) and [len(s) for s in shares] == [14, 14]
    cls = torch.empty(len(unique), 16)
    for share in shares:
        cls[torch.as_tensor(share)] = encode_windows(tvm, unique, lengths, share, 0, progress=False)
    kr = pool_windows(cls[torch.as_tensor(window_unique)], torch.as_tensor(window_key), 9)
    assert torch.allclose(kr, whole, atol=1e-5)
