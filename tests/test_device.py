"""Batches, caches and masks follow the model: device and dtype are decided in one place.

Every tensor that reaches a network's forward is checked by a forward pre-hook against the
network's own parameters (device and floating dtype). On a CPU-only machine the device part is
trivially met, so the model is also run in float64: a batch built on the side (float32 KRs
from the cache, float32 class weights) would then reach the network in the wrong dtype, which
the hooks catch -- the same path that moves it to a GPU. With CUDA present the same training
and scoring run on the GPU (``test_training_and_scoring_on_cuda``), including a bundle loaded
onto it for batch scoring.
"""

import dataclasses
import json

import numpy as np
import polars as pl
import pytest
import torch
from test_trainer import build, toy_objects

from seqenc.inference import model_device, model_dtype, predict_proba, to_model
from seqenc.model import TVMKA
from training.engine.end_to_end import EndToEndTrainer
from training.engine.engines import training_device
from training.engine.modes import MODES
from training.engine.trainer import InterleavedTrainer
from training.serving.scoring import load_bundle, save_bundle, score_objects


def watch_inputs(network: torch.nn.Module) -> list[int]:
    """Assert on every forward call of ``network`` (and its direct sub-networks) that each
    tensor argument sits on the network's device, floating ones in its dtype; returns a list
    that grows by one per checked call."""
    calls: list[int] = []

    def check(module, args, kwargs):
        device, dtype = model_device(module), model_dtype(module)
        for x in (*args, *kwargs.values()):
            if isinstance(x, torch.Tensor):
                assert x.device == device, f"{type(module).__name__}: input on {x.device}, model on {device}"
                if x.is_floating_point():
                    assert x.dtype == dtype, f"{type(module).__name__}: input {x.dtype}, model {dtype}"
        calls.append(1)

    for module in (network, *network.children()):
        if any(True for _ in module.parameters()):
            module.register_forward_pre_hook(check, with_kwargs=True)
    return calls


def test_to_model_moves_tensors_and_casts_floats_only():
    net = torch.nn.Linear(2, 2).double()
    ids, x, n = to_model((torch.ones(2, dtype=torch.long), torch.ones(2), 3), net)
    assert ids.dtype == torch.long and x.dtype == torch.float64 and n == 3
    assert to_model([None, torch.zeros(1)], net)[0] is None
    assert model_device(torch.nn.Module()) == torch.device("cpu")


def test_training_device_is_decided_in_one_place():
    assert training_device("cpu") == torch.device("cpu")
    assert training_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="not a torch device"):
        training_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            training_device("cuda")


def test_interleaved_batches_follow_the_model(tmp_path):
    """TVM MLM steps, KR refreshes, KA steps, the surprise and evaluation, in float64."""
    model, tok, data, y, splits, cfg = build(pretrain_steps=4, rounds=1, tvm_steps_per_round=4, device="cpu",
                                             mlm_sequences="normal")
    model.config.surprise_scoring = True
    model.double()
    calls = {"tvm": watch_inputs(model.tvm), "ka": watch_inputs(model.ka)}
    result = InterleavedTrainer(model, tok, data, y, splits, cfg, tmp_path, progress=False).fit()
    assert np.isfinite(result["probs"]).all() and result["probs"].shape == (data.n_sequences, 2)
    assert len(calls["tvm"]) > 8 and len(calls["ka"]) > 2
    assert model_dtype(model) == torch.float64  # nothing cast the model back
    probs = predict_proba(model, data, tok.pad_id, progress=False)  # the scoring path
    assert probs.shape == (data.n_sequences, 2)


@pytest.mark.parametrize("mode", ["joint", "flattened", "record_view"])
def test_end_to_end_batches_follow_the_model(tmp_path, mode):
    model, tok, data, y, splits, cfg = build(rounds=1, mode=mode, task_steps=3, batch_size=8, device="cpu")
    objects, _ = toy_objects()
    e2e, inputs = MODES[mode].build_model(model.config, data, tok, objects)
    e2e.double()
    calls = watch_inputs(e2e)
    trainer = EndToEndTrainer(e2e, inputs, y, splits, cfg, tmp_path, "binary", 2, progress=False)
    result = trainer.fit()
    assert len(calls) >= 3
    # a forward pass per example: evaluation scores the dev and test rows only, the same as a full pass
    evaluated = np.concatenate([splits["dev"], splits["test"]])
    assert np.isfinite(result["probs"][evaluated]).all()
    assert np.isnan(result["probs"][np.setdiff1d(splits["train"], evaluated)]).all()
    np.testing.assert_allclose(trainer.probabilities()[evaluated], result["probs"][evaluated], atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")
def test_training_and_scoring_on_cuda(tmp_path):
    model, tok, data, y, splits, cfg = build(pretrain_steps=4, rounds=1, tvm_steps_per_round=4, device="cuda")
    calls = {"tvm": watch_inputs(model.tvm), "ka": watch_inputs(model.ka)}
    result = InterleavedTrainer(model, tok, data, y, splits, cfg, tmp_path, progress=False).fit()
    assert model_device(model).type == "cuda" and len(calls["tvm"]) > 8 and len(calls["ka"]) > 2
    on_gpu = predict_proba(model, data, tok.pad_id, progress=False)
    np.testing.assert_allclose(on_gpu, result["probs"], atol=1e-5)
    on_cpu = predict_proba(model.cpu(), data, tok.pad_id, progress=False)
    np.testing.assert_allclose(on_cpu, on_gpu, atol=1e-3)
    # a bundle scored on the GPU gives what the CPU gives
    save_bundle(model, tok, {"task": "binary", "threshold": 0.5}, tmp_path / "bundle")
    objects, _ = toy_objects()
    gpu = load_bundle(tmp_path / "bundle", "cuda")
    assert model_device(gpu.model).type == "cuda"
    scored = {d: score_objects(load_bundle(tmp_path / "bundle", d), objects, progress=False) for d in ("cuda", "cpu")}
    np.testing.assert_allclose(scored["cuda"]["score"].to_numpy(), scored["cpu"]["score"].to_numpy(), atol=1e-3)



def train_on(device: str, tmp_path) -> InterleavedTrainer:
    """The toy training on ``device`` with nothing drawn on the device: dropout is off in the toy
    config and the model is rebuilt here without DropHead (both draw from the device's generator;
    the masks and batch orders come from seeded CPU generators)."""
    model, tok, data, y, splits, cfg = build(pretrain_steps=10, rounds=1, tvm_steps_per_round=6, device=device)
    torch.manual_seed(0)
    model = TVMKA(dataclasses.replace(model.config, drophead=0.0))
    trainer = InterleavedTrainer(model, tok, data, y, splits, cfg, tmp_path / device, progress=False)
    trainer.fit()
    return trainer


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")
def test_cuda_computes_the_cpu_training(tmp_path):
    """Same weights, masks and batches: the GPU's training is the CPU's up to float32 rounding
    (on an H100 the demo-size hdfs run's first 15 masked-LM losses agreed to 1e-6; docker/README)."""
    runs = {d: train_on(d, tmp_path) for d in ("cpu", "cuda")}
    for key in ("train/mlm_loss", "train/task_loss"):
        cpu, gpu = ([v for _, v in runs[d].history[key]] for d in ("cpu", "cuda"))
        assert len(cpu) == len(gpu) > 0
        np.testing.assert_allclose(gpu, cpu, atol=1e-3, err_msg=key)
    weights = {d: runs[d].model.state_dict() for d in runs}
    for name, w in weights["cpu"].items():
        if w.is_floating_point():
            torch.testing.assert_close(weights["cuda"][name].cpu(), w, atol=1e-3, rtol=1e-3, msg=name)


def test_a_bundle_loads_where_it_is_asked_to(tmp_path):
    """Scoring places the model with the same rule as training; batches follow it (the float64
    model below would reject float32 inputs built on the side)."""
    model, tok, *_ = build(pretrain_steps=2, rounds=1, tvm_steps_per_round=2)
    save_bundle(model, tok, {"task": "binary", "threshold": 0.5}, tmp_path / "bundle")
    bundle = load_bundle(tmp_path / "bundle", "cpu")
    assert model_device(bundle.model) == torch.device("cpu")
    objects, _ = toy_objects()
    expected = score_objects(bundle, objects, progress=False)
    bundle.model.double()
    calls = {"tvm": watch_inputs(bundle.model.tvm), "ka": watch_inputs(bundle.model.ka)}
    np.testing.assert_allclose(score_objects(bundle, objects, progress=False)["score"].to_numpy(),
                               expected["score"].to_numpy(), atol=1e-5)
    assert len(calls["tvm"]) >= 1 and len(calls["ka"]) >= 1
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            load_bundle(tmp_path / "bundle", "cuda")


def test_seqenc_score_device_flag(tmp_path):
    """``seqenc score --device`` reaches the loader; a device that is not one is one line."""
    from parsers import storage
    from training.cli.main import main

    model, tok, *_ = build(pretrain_steps=2, rounds=1, tvm_steps_per_round=2)
    save_bundle(model, tok, {"task": "binary", "threshold": 0.5, "source": "toy"}, tmp_path / "bundle")
    objects, _ = toy_objects(n=12)
    objects = objects.with_columns(pl.lit(None, pl.Datetime("us")).alias("ts"), pl.lit(None, pl.Int64).alias("template_id"))
    path = storage.objects_path(tmp_path / "data", "toy", "2024-01-01", "toy.jsonl")
    storage.write_parquet_atomic(objects.select(storage.OBJECTS_SCHEMA.names), path, storage.OBJECTS_SCHEMA)
    args = ["score", "--model", str(tmp_path / "bundle"), "--input", str(tmp_path / "data"),
            "--out", str(tmp_path / "scored"), "--no-progress"]
    with pytest.raises(SystemExit) as err:
        main([*args, "--device", "gpu0"])
    assert "'gpu0' is not a torch device" in str(err.value) and "\n" not in str(err.value)
    assert main([*args, "--device", "cpu"]) == 0
    assert len(pl.read_parquet(tmp_path / "scored" / "date=2024-01-01" / "part-0.parquet")) == 12


def test_a_checkpoint_resumes_on_another_device_but_not_with_another_config():
    from dataclasses import asdict

    from training.engine.phased import same_run
    from training.engine.trainer import TrainConfig

    cfg = TrainConfig(device="cpu")
    saved = asdict(TrainConfig(device="cuda"))
    assert same_run(saved, cfg)  # where it ran is not what it computes
    older = {k: v for k, v in saved.items() if k != "device"}  # written before the field existed
    assert same_run(older, cfg)
    assert not same_run(saved | {"lr_ka": 1.0}, cfg)
    assert not same_run(saved | {"unknown_field": 1}, cfg)


def test_seqenc_train_device_flag(prepared_task, tmp_path):
    """``--device`` reaches the trainer; a device that is not one is a one-line user error."""
    import shutil

    from training.cli.main import main

    work = tmp_path / "w"
    shutil.copytree(prepared_task("anomaly"), work)
    args = ["train", "--workdir", str(work), "--task", "anomaly", "--size", "tiny", "--no-progress"]
    with pytest.raises(SystemExit) as err:
        main([*args, "--device", "gpu0"])
    assert "'gpu0' is not a torch device" in str(err.value) and "\n" not in str(err.value)
    assert main([*args, "--device", "cpu"]) == 0
    job = json.loads((work / "models" / "anomaly" / "job" / "job.json").read_text())
    assert job["train_overrides"]["device"] == "cpu"
