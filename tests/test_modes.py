"""Every training mode from one command (stage_train): same phases, same metric names in MLflow,
a saved model of the right architecture; an end-to-end mode resumes exactly."""

import json
import shutil

import mlflow
import pytest

from seqenc.baselines import FlattenedEncoder, JointTVMKA, RecordViewEncoder
from seqenc.model import TVMKA
from training import pipeline

STEPS = {"pretrain_steps": 6, "rounds": 2, "tvm_steps_per_round": 4, "task_steps": 8, "batch_size": 8,
         "log_every": 1, "warmup_steps": 1}
ARCH = {"interleaved": TVMKA, "no_interleave": TVMKA, "joint": JointTVMKA, "flattened": FlattenedEncoder,
        "record_view": RecordViewEncoder}


@pytest.fixture
def prepared(prepared_task):
    return prepared_task("anomaly")


def metric_names(workdir, run_id) -> set[str]:
    mlflow.set_tracking_uri(f"sqlite:///{workdir / 'mlflow.db'}")
    return set(mlflow.MlflowClient().get_run(run_id).data.metrics)


@pytest.mark.parametrize("mode", list(ARCH))
def test_every_mode_trains_logs_the_same_names_and_saves_its_model(prepared, tmp_path, mode):
    work = tmp_path / "w"
    shutil.copytree(prepared, work)
    result = pipeline.stage_train(str(work), "anomaly", "tiny", progress=False, mode=mode, train_overrides=STEPS)
    assert set(result["metrics"]["test"]) >= {"precision", "recall", "f1"}
    names = metric_names(work, result["run_id"])
    common = {"train/task_loss", "round", "dev/f1", "final_dev/f1", "test/f1"}
    assert common <= names
    assert ("train/mlm_loss" in names) == (mode in ("interleaved", "no_interleave"))
    bundle = pipeline.Path(result["model_dir"])
    assert json.loads((bundle / "metadata.json").read_text())["mode"] == mode
    assert isinstance(ARCH[mode].from_pretrained(bundle), ARCH[mode])
    children = mlflow.search_runs(search_all_experiments=True, output_format="list",
                                  filter_string=f"tags.mlflow.parentRunId = '{result['run_id']}'")
    phases = {r.data.tags["phase"] for r in children}
    assert phases == ({"task", "eval", "final"} if mode in ("joint", "flattened", "record_view")
                      else {"tvm", "refresh", "ka", "eval", "final"})


def test_an_end_to_end_mode_resumes_exactly(prepared, tmp_path):
    straight, killed = tmp_path / "a", tmp_path / "b"
    shutil.copytree(prepared, straight)
    shutil.copytree(prepared, killed)
    overrides = {**STEPS, "checkpoint_every": 3}
    expected = pipeline.stage_train(str(straight), "anomaly", "tiny", progress=False, mode="flattened",
                                    train_overrides=overrides)
    job = pipeline.job_dir(killed, "anomaly")

    class Stop(Exception):
        pass

    def stop_at_step_7(metrics, step):
        if step == 7:
            raise Stop

    log = pipeline.tracking.log_metrics
    pipeline.tracking.log_metrics = stop_at_step_7
    try:
        with pytest.raises(Stop):
            pipeline.stage_train(str(killed), "anomaly", "tiny", progress=False, mode="flattened",
                                 train_overrides=overrides)
    finally:
        pipeline.tracking.log_metrics = log
    assert (job / "checkpoints" / "latest").read_text() == "step-000000006"
    resumed = pipeline.resume_train(job, progress=False)
    assert resumed["metrics"]["test"] == expected["metrics"]["test"]
    assert resumed["metrics"]["dev"] == expected["metrics"]["dev"]
