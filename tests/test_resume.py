"""A training process killed mid-round (SIGKILL) and resumed ends where an uninterrupted run
ends: same metrics, the same MLflow run, no metric step logged twice."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest

from training.pipeline import stages as pipeline

TRAIN = {"pretrain_steps": 30, "rounds": 2, "tvm_steps_per_round": 24, "checkpoint_every": 4, "log_every": 1,
         "eval_every": 4, "warmup_steps": 2}


@pytest.fixture
def prepared(prepared_task):
    return prepared_task("milestone")


def metric_steps(workdir: Path, run_id: str) -> dict[str, list[int]]:
    mlflow.set_tracking_uri(f"sqlite:///{workdir / 'mlflow.db'}")
    client = mlflow.MlflowClient()
    return {k: [m.step for m in client.get_metric_history(run_id, k)] for k in client.get_run(run_id).data.metrics}


def latest_step(job: Path) -> int:
    pointer = job / "checkpoints" / "latest"
    return int(pointer.read_text().split("-")[1]) if pointer.exists() else -1


def test_sigkill_mid_round_then_resume_matches_an_uninterrupted_run(prepared, tmp_path):
    straight_dir, killed_dir = tmp_path / "straight", tmp_path / "killed"
    shutil.copytree(prepared, straight_dir)
    shutil.copytree(prepared, killed_dir)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"train": TRAIN}))
    straight = pipeline.stage_train(str(straight_dir), "milestone", "tiny", progress=False, train_overrides=TRAIN)

    # the same job in a child process, killed once it has checkpointed inside round 1's TVM steps
    job = pipeline.job_dir(killed_dir, "milestone")
    args = {"workdir": str(killed_dir), "task_name": "milestone", "size": "tiny", "train_overrides": TRAIN,
            "progress": False}
    child = subprocess.Popen([sys.executable, "-c", "import json, sys; from training.pipeline.stages import stage_train; "
                              "stage_train(**json.loads(sys.argv[1]))", json.dumps(args)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while latest_step(job) < 36 and child.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    killed_at = latest_step(job)
    assert child.returncode == -signal.SIGKILL and 36 <= killed_at < 30 + 24 + 12, killed_at
    assert not (killed_dir / "models" / "milestone" / "bundle").exists()  # it never finished

    out = subprocess.run([sys.executable, "-m", "training.cli.main", "train", "--resume", str(job), "--no-progress"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    resumed = json.loads(out.stdout[: out.stdout.rindex("}") + 1])

    assert resumed["run_id"] != straight["run_id"]
    for split in ("dev", "test"):
        for k, v in straight["metrics"][split].items():
            assert resumed["metrics"][split][k] == pytest.approx(v, abs=1e-6), (split, k)
    steps = metric_steps(killed_dir, resumed["run_id"])
    assert steps == metric_steps(straight_dir, straight["run_id"])  # every step once, none missing
    assert all(len(s) == len(set(s)) for s in steps.values())
    mlflow.set_tracking_uri(f"sqlite:///{killed_dir / 'mlflow.db'}")
    parents = [r for r in mlflow.search_runs(search_all_experiments=True, output_format="list")
               if "mlflow.parentRunId" not in r.data.tags]
    assert [r.info.run_id for r in parents] == [resumed["run_id"]]  # one job, one run
