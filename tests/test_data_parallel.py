"""``seqenc train --deepspeed`` with two data-parallel ranks, started the way torchrun starts them
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), on CPU with gloo: rank 0 writes
the value sequences (both build their halves), logs to MLflow and saves the model; both ranks train on their halves of
every batch and end with the same weights."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlflow
import torch
from ranks import run_ranks
from safetensors.torch import load_file

from training.pipeline.stages import stage_generate, stage_ingest


def test_two_ranks_train_one_model_and_log_one_run(tmp_path):
    workdir = tmp_path / "work"
    raw = stage_generate(str(workdir), "tiny", 0)
    stage_ingest(str(workdir), "hdfs", raw["hdfs"]["path"], raw["hdfs"]["labels"])
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 1},
                              "optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}))
    cmd = [sys.executable, "-m", "training.cli.main", "train", "--workdir", str(workdir), "--task", "anomaly",
           "--size", "tiny", "--deepspeed", str(ds), "--no-progress"]
    outputs = run_ranks(cmd, tmp_path, world=2, env={"OMP_NUM_THREADS": "1"})

    printed = [json.loads(out[out.index("{\n"):out.index("\n}") + 2]) for out in outputs]
    assert printed[0]["run_id"] and printed[0]["model_dir"]
    assert printed[1]["run_id"] is None and printed[1]["model_dir"] is None  # rank 1 logs and saves nothing
    assert printed[0]["metrics"]["test"] == printed[1]["metrics"]["test"]  # the same model on both ranks

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, "tags.mlflow.parentRunId IS NULL")
    assert [r.info.run_id for r in runs] == [printed[0]["run_id"]]
    assert len(client.search_model_versions("name = 'seqenc-anomaly'")) == 1

    job = workdir / "models" / "anomaly" / "job"
    last = {r: sorted((job / "checkpoints" / f"rank-{r}").glob("step-*"))[-1] for r in (0, 1)}
    assert last[0].name == last[1].name
    # logged losses are the mean over both ranks' halves: both ranks hold the same history
    from training.engine.checkpoint import join_tensors

    histories = [join_tensors(json.loads((last[r] / "state.json").read_text()),
                              load_file(str(last[r] / "tensors.safetensors")))["history"] for r in (0, 1)]
    assert histories[0] == histories[1] and histories[0]["train/mlm_loss"]
    logged = client.get_metric_history(printed[0]["run_id"], "train/mlm_loss")
    assert {m.step: m.value for m in logged} == {s: v for s, v in histories[0]["train/mlm_loss"] if s in
                                                 {m.step for m in logged}}
    weights = [load_file(str(last[r] / "weights.safetensors")) for r in (0, 1)]
    for name, tensor in weights[0].items():
        assert torch.allclose(tensor, weights[1][name], atol=1e-6), name
    assert sorted(p.name for p in job.glob("kr_cache_*")) == [
        f"kr_cache_v{v}.rank-{r}.safetensors" for v in sorted({int(p.name.split("_v")[1].split(".")[0])
                                                              for p in job.glob("kr_cache_*")}) for r in (0, 1)]

    # the model trained under ZeRO-1 (its weights were views into DeepSpeed's flat buffer) saved and loads
    from training.serving.scoring import load_bundle

    model, _, meta = load_bundle(printed[0]["model_dir"])
    saved = load_file(str(Path(printed[0]["model_dir"]) / "model.safetensors"))
    assert meta["mode"] == "interleaved" and len(saved) < len(model.state_dict())  # shared heads stored once


def test_each_rank_keeps_its_rows_of_a_batch():
    from training.engine.engines import data_parallel, shard

    batch = (torch.arange(10).reshape(5, 2), torch.arange(5))
    halves = [shard(batch, r, 2) for r in (0, 1)]
    assert halves[0][1].tolist() == [0, 2, 4] and halves[1][1].tolist() == [1, 3]
    assert torch.equal(halves[1][0], batch[0][1::2])
    assert shard(torch.arange(1), 1, 2).tolist() == [0]  # fewer rows than ranks: everyone takes all
    assert data_parallel(None) == (0, 1)
