"""``seqenc train`` against a real MLflow tracking server (MLFLOW_TRACKING_URI=http://...):
params, tags, metrics, artifacts and the registered model all go through the server, and the
artifacts land in the server's own artifact folder (nothing is written to a local store)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import pytest

from training.pipeline import stages as pipeline

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "SEQENC_WORKDIR")}
    return env | extra


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``mlflow server`` on a SQLite store with proxied artifacts in its own folder; yields
    (url, server directory). Its whole process group is stopped at the end."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    # MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false: no job runner and its seven huey consumer
    # processes (GenAI jobs), which would cost the 2-core CI tens of CPU-seconds.
    cmd = [str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
           "--artifacts-destination", (root / "artifacts").as_uri(), "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1"]
    log = (root / "server.log").open("w")
    proc = subprocess.Popen(cmd, cwd=root, env=_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"mlflow server exited {proc.returncode}:\n{(root / 'server.log').read_text()}"
            assert time.monotonic() < deadline, f"mlflow server not healthy:\n{(root / 'server.log').read_text()}"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.read() == b"OK":
                        break
            except OSError:
                time.sleep(0.5)
        yield url, root
    finally:
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        log.close()


@pytest.fixture(scope="module")
def trained(server, tmp_path_factory):
    """Tiny built-in HDFS data generated and ingested here (no MLflow), then ``seqenc train`` in a
    subprocess whose only MLflow setting is MLFLOW_TRACKING_URI=<server>."""
    url, _ = server
    base = tmp_path_factory.mktemp("train-against-server")
    workdir, cwd = base / "work", base / "cwd"
    cwd.mkdir()
    raw = pipeline.stage_generate(str(workdir), "tiny", 0)
    pipeline.stage_ingest(str(workdir), "hdfs", raw["hdfs"]["path"], raw["hdfs"]["labels"])
    done = subprocess.run([str(BIN / "seqenc"), "train", "--workdir", str(workdir), "--task", "anomaly",
                           "--size", "tiny", "--no-progress"], cwd=cwd, env=_env(MLFLOW_TRACKING_URI=url),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    start = next(i for i, line in enumerate(done.stdout.splitlines()) if line.startswith("{"))
    result, _ = json.JSONDecoder().raw_decode("\n".join(done.stdout.splitlines()[start:]))
    return result, workdir, cwd


def test_run_params_tags_and_metrics_are_on_the_server(server, trained):
    url, _ = server
    result, _, _ = trained
    client = mlflow.MlflowClient(tracking_uri=url)
    run = client.get_run(result["run_id"])
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "seqenc"
    assert run.data.params["mode"] == "interleaved" and run.data.params["task"] == "anomaly"
    assert run.data.params["size"] == "tiny"
    assert run.data.tags["git_commit"] and len(run.data.tags["dataset_fingerprint"]) == 16
    assert run.data.tags["mode"] == "interleaved"
    # test/<metric> is logged once by the trainer's final phase (training/engine/phased.py)
    for name, value in result["metrics"]["test"].items():
        assert run.data.metrics[f"test/{name}"] == pytest.approx(value)
    assert {"final_dev/f1", "train/mlm_loss", "train/task_loss"} <= set(run.data.metrics)
    assert len(client.get_metric_history(run.info.run_id, "train/task_loss")) >= 2
    # one nested child run per training phase (tracking.log_phase_run); searched in every
    # experiment: start_run(nested=True) without experiment_id puts them in "Default", not "seqenc"
    experiments = [e.experiment_id for e in client.search_experiments()]
    phases = client.search_runs(experiments, f"tags.mlflow.parentRunId = '{run.info.run_id}'")
    assert {p.data.tags["phase"] for p in phases} == {"tvm", "refresh", "ka", "eval", "final"}


def test_artifacts_and_registered_model_go_through_the_server(server, trained, tmp_path, monkeypatch):
    url, root = server
    monkeypatch.chdir(tmp_path)  # a client call that missed the server would create ./mlflow.db here
    result, workdir, cwd = trained
    run_id = result["run_id"]
    client = mlflow.MlflowClient(tracking_uri=url)
    run = client.get_run(run_id)
    assert run.info.artifact_uri.startswith("mlflow-artifacts:/")  # proxied, not a local path
    plots = {a.path for a in client.list_artifacts(run_id, "plots")}
    assert {"plots/confusion_test.png", "plots/losses.png", "plots/pr_curve_test.png",
            "plots/metrics.json", "plots/train_config.json"} <= plots

    versions = client.search_model_versions("name = 'seqenc-anomaly'")
    assert [v.run_id for v in versions] == [run_id]
    # not download_artifacts("models:/seqenc-anomaly/N", tracking_uri=url, registry_uri=url): MLflow
    # 3.17 resolves a models:/ URI in the global registry (./mlflow.db by default), ignoring both
    source = client.get_model_version_download_uri("seqenc-anomaly", versions[0].version)
    assert source.startswith("mlflow-artifacts:/")
    model = Path(mlflow.artifacts.download_artifacts(source, dst_path=str(tmp_path / "dl"), tracking_uri=url))
    files = {p.name for p in model.rglob("*") if p.is_file()}
    assert {"MLmodel", "model.safetensors", "tokenizer.json", "metadata.json"} <= files

    # MLflow 3: the model is a LoggedModel of the run, stored under <experiment>/models/<model_id>/,
    # not among the run's own artifacts (those hold plots/ only). The version's source names it
    # (models:/m-...); its model_id field comes back empty through the REST API.
    logged = [m for m in client.search_logged_models([run.info.experiment_id]) if m.source_run_id == run_id]
    assert [(m.name, m.model_uri) for m in logged] == [("model", versions[0].source)]
    logged = logged[0]

    # the bytes are in the server's --artifacts-destination ...
    experiment = root / "artifacts" / run.info.experiment_id
    stored = {p.name for p in (experiment / run_id / "artifacts" / "plots").iterdir()}
    assert {"confusion_test.png", "losses.png", "pr_curve_test.png", "metrics.json"} <= stored
    stored = {p.name for p in (experiment / "models" / logged.model_id / "artifacts").rglob("*") if p.is_file()}
    assert {"MLmodel", "model.safetensors", "tokenizer.json"} <= stored
    # ... and nothing went to a local store beside the job or where it ran
    for place in (workdir, cwd, tmp_path):
        assert not {"mlruns", "mlartifacts", "mlflow.db"} & {p.name for p in place.iterdir()}


def test_a_logged_model_names_the_seqenc_version_installed_or_checked_out(monkeypatch):
    """The model's pip requirement pins seqenc: the installed version, else (a source checkout on
    PYTHONPATH, nothing installed) the pyproject's; measured on a GPU machine without an install,
    where ``importlib.metadata`` found no seqenc and the model logging crashed after training."""
    import importlib.metadata
    import tomllib

    from training.serving.tracking import seqenc_requirement

    expected = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["version"]
    assert seqenc_requirement() == f"seqenc=={importlib.metadata.version('seqenc')}"

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert seqenc_requirement() == f"seqenc=={expected}"
