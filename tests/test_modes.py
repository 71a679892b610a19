"""Every training mode from one command (stage_train): same phases, same metric names in MLflow,
a saved model of the right architecture; an end-to-end mode resumes exactly."""

import json
import shutil

import mlflow
import pytest

from seqenc.baselines import FlattenedEncoder, JointTVMKA, RecordViewEncoder
from seqenc.model import TVMKA
from training.pipeline import stages as pipeline

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


def train_until_killed(workdir, overrides: dict, at_step: int):
    """A flattened-mode training of ``workdir`` that dies when it logs ``at_step``; its job dir."""

    class Stop(Exception):
        pass

    def stop(metrics, step):
        if step == at_step:
            raise Stop

    log = pipeline.tracking.log_metrics
    pipeline.tracking.log_metrics = stop
    try:
        with pytest.raises(Stop):
            pipeline.stage_train(str(workdir), "anomaly", "tiny", progress=False, mode="flattened",
                                 train_overrides=overrides)
    finally:
        pipeline.tracking.log_metrics = log
    return pipeline.job_dir(workdir, "anomaly")


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
    job = train_until_killed(killed, overrides, at_step=7)
    assert (job / "checkpoints" / "latest").read_text() == "step-000000006"
    resumed = pipeline.resume_train(job, progress=False)
    assert resumed["metrics"]["test"] == expected["metrics"]["test"]
    assert resumed["metrics"]["dev"] == expected["metrics"]["dev"]


def test_keep_best_scores_and_saves_the_best_dev_evaluation_and_resumes_exactly(prepared_task, tmp_path):
    """keep_best (TrainConfig; the default of a scratch table encoder): the final model is the
    weights of the dev evaluation with the best headline metric -- its final_dev equals that
    evaluation's, the saved bundle scores as it does -- and the copy survives a resume. (The
    paper's S(k), on which this tiny run's evaluations differ as the checks below need.)"""
    prepared = prepared_task("anomaly", paper=True)
    straight, killed = tmp_path / "a", tmp_path / "b"
    shutil.copytree(prepared, straight)
    shutil.copytree(prepared, killed)
    # the best dev F1's threshold (not the default one_se, which keeps 0.5 here and ties the last
    # evaluation's F1 with the best's): evaluations that differ, so the choice shows
    overrides = {**STEPS, "task_steps": 12, "rounds": 3, "eval_every": 1, "keep_best": True, "checkpoint_every": 3,
                 "lr_task": 3e-3, "threshold_rule": "best_f1"}
    result = pipeline.stage_train(str(straight), "anomaly", "tiny", progress=False, mode="flattened",
                                  train_overrides=overrides)
    mlflow.set_tracking_uri(f"sqlite:///{straight / 'mlflow.db'}")
    history = [(m.step, m.value) for m in mlflow.MlflowClient().get_metric_history(result["run_id"], "dev/f1")]
    best_step, best = max(history, key=lambda p: (p[1], -p[0]))  # the first of the best
    assert len({v for _, v in history}) > 1, history  # the evaluations differ, so the choice is a real one
    assert result["metrics"]["best_step"] == best_step < max(history)[0]  # not the last evaluation here
    assert result["metrics"]["dev"]["f1"] == pytest.approx(best) != max(history)[1]
    # the saved bundle is that model: scoring the dev split with it gives the same dev f1
    scored = pipeline.stage_score(str(straight), "anomaly", split="dev", progress=False)
    assert scored["metrics"]["f1"] == pytest.approx(best)
    # stopped after the first checkpoint, resumed: the same best, the same final model
    job = train_until_killed(killed, overrides, at_step=4)
    resumed = pipeline.resume_train(job, progress=False)
    assert resumed["metrics"]["best_step"] == best_step
    assert resumed["metrics"]["test"] == result["metrics"]["test"]


def test_the_weight_average_is_the_final_model_and_leaves_training_alone(prepared, tmp_path, monkeypatch):
    """ema_decay (TrainConfig): the saved model is the exponential moving average of the weights
    after each task update, computed here from those weights; training itself follows the raw
    weights (the same last raw weights as without it); a resumed run ends on the same average."""
    import torch

    from training.engine.end_to_end import EndToEndTrainer

    runs = {name: tmp_path / name for name in ("plain", "averaged", "killed")}
    for work in runs.values():
        shutil.copytree(prepared, work)
    overrides = {**STEPS, "lr_task": 3e-3, "checkpoint_every": 3}
    plain = pipeline.stage_train(str(runs["plain"]), "anomaly", "tiny", progress=False, mode="flattened",
                                 train_overrides=overrides)
    seen, update_ema = [], EndToEndTrainer.update_ema

    def record(self):  # the raw weights after each task update, then the average's own step
        seen.append({k: v.detach().clone() for k, v in self.model.state_dict().items()})
        update_ema(self)

    monkeypatch.setattr(EndToEndTrainer, "update_ema", record)
    averaged = {**overrides, "ema_decay": 0.5}
    result = pipeline.stage_train(str(runs["averaged"]), "anomaly", "tiny", progress=False, mode="flattened",
                                  train_overrides=averaged)
    assert len(seen) == STEPS["task_steps"]
    expected = dict(seen[0])
    for weights in seen[1:]:
        expected = {k: 0.5 * expected[k] + 0.5 * v if v.is_floating_point() else v for k, v in weights.items()}
    saved = FlattenedEncoder.from_pretrained(result["model_dir"]).state_dict()
    assert all(torch.allclose(saved[k].float(), v.float(), atol=1e-6) for k, v in expected.items())
    last_raw = FlattenedEncoder.from_pretrained(plain["model_dir"]).state_dict()  # no average: the last update's
    assert all(torch.equal(last_raw[k], v) for k, v in seen[-1].items())  # evaluations left the raw weights be
    assert any(not torch.allclose(saved[k], v) for k, v in seen[-1].items() if v.is_floating_point())
    assert result["metrics"]["test"] != plain["metrics"]["test"] or result["metrics"]["dev"] != plain["metrics"]["dev"]

    monkeypatch.setattr(EndToEndTrainer, "update_ema", update_ema)
    resumed = pipeline.resume_train(train_until_killed(runs["killed"], averaged, at_step=7), progress=False)
    assert resumed["metrics"]["test"] == result["metrics"]["test"]
    assert resumed["metrics"]["dev"] == result["metrics"]["dev"]


def test_keep_best_is_refused_where_caches_would_not_match_the_weights():
    from training.engine.trainer import TrainConfig

    with pytest.raises(ValueError, match="keep_best is for the end-to-end modes"):
        TrainConfig(mode="interleaved", keep_best=True)
    with pytest.raises(ValueError, match="ema_decay=0.9 must be in"):
        TrainConfig(mode="interleaved", ema_decay=0.9)
    with pytest.raises(ValueError, match="ema_decay=1.0 must be in"):
        TrainConfig(mode="flattened", ema_decay=1.0)
