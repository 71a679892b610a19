"""``seqenc ui``: a real MLflow UI server on a work directory's SQLite store."""

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import mlflow
import pytest

from training.cli.main import main
from training.serving import tracking

SEQENC = str(Path(sys.executable).with_name("seqenc"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def _post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _make_store(workdir: Path) -> tuple[str, str]:
    """A store laid out as seqenc's tracking writes it: ``mlflow.db`` and ``mlartifacts/`` in the
    work directory (experiment ``seqenc``); one finished run with a param, a metric and an artifact."""
    workdir.mkdir(parents=True)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{(workdir / 'mlflow.db').resolve()}")
    experiment_id = client.create_experiment(tracking.EXPERIMENT,
                                             artifact_location=(workdir / "mlartifacts").resolve().as_uri())
    run = client.create_run(experiment_id, run_name="anomaly-interleaved")
    client.log_param(run.info.run_id, "mode", "interleaved")
    client.log_metric(run.info.run_id, "test/f1", 0.75, step=3)
    note = workdir / "metrics.json"
    note.write_text('{"f1": 0.75}')
    client.log_artifact(run.info.run_id, str(note), "plots")
    client.set_terminated(run.info.run_id)
    return experiment_id, run.info.run_id


def _lines(stream) -> queue.Queue:
    """The process's stdout lines, read on a thread (so a silent process cannot block the test)."""
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in stream:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to ``seqenc ui`` (which passes it on to mlflow), then kill whatever of its process
    group is left."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def test_ui_serves_the_workdir_store_and_its_artifacts(tmp_path):
    workdir = tmp_path / "work"
    experiment_id, run_id = _make_store(workdir)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "SEQENC_WORKDIR")}
    stderr = (tmp_path / "ui.stderr").open("w")
    proc = subprocess.Popen([SEQENC, "ui", "--workdir", str(workdir), "--port", str(port)], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True)
    try:
        lines = _lines(proc.stdout)
        first = lines.get(timeout=60)
        assert first.strip() == f"MLflow UI: http://127.0.0.1:{port}"
        url = first.split()[-1]

        deadline, healthy = time.monotonic() + 60, False
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                healthy = _get(f"{url}/health", timeout=2) == b"OK"
            except OSError:
                pass
            if healthy:
                break
            time.sleep(0.5)
        assert healthy, f"no answer from {url} (exit {proc.poll()}):\n{(tmp_path / 'ui.stderr').read_text()}"

        assert b"<title>MLflow</title>" in _get(f"{url}/")  # the UI itself, not only the REST API
        experiments = json.loads(_get(f"{url}/api/2.0/mlflow/experiments/search?max_results=10"))["experiments"]
        assert {e["name"]: e["experiment_id"] for e in experiments}[tracking.EXPERIMENT] == experiment_id
        runs = _post_json(f"{url}/api/2.0/mlflow/runs/search", {"experiment_ids": [experiment_id]})["runs"]
        assert [r["info"]["run_id"] for r in runs] == [run_id]
        assert {"key": "mode", "value": "interleaved"} in runs[0]["data"]["params"]
        assert runs[0]["data"]["metrics"][0]["key"] == "test/f1"
        # the run's artifacts are served from the workdir's mlartifacts folder
        listed = json.loads(_get(f"{url}/api/2.0/mlflow/artifacts/list?run_id={run_id}&path=plots"))
        assert [f["path"] for f in listed["files"]] == ["plots/metrics.json"]
        assert listed["root_uri"].startswith((workdir / "mlartifacts").resolve().as_uri())
        assert json.loads(_get(f"{url}/get-artifact?path=plots/metrics.json&run_uuid={run_id}")) == {"f1": 0.75}
        # nothing was created in the directory the UI was started from
        assert not {"mlruns", "mlartifacts", "mlflow.db"} & {p.name for p in tmp_path.iterdir()}
    finally:
        _stop_group(proc)
        stderr.close()
    assert proc.returncode == 0


def test_ui_without_a_store_says_which_command_makes_it(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "_USER_URI", None)
    with pytest.raises(SystemExit) as exc:
        main(["ui", "--workdir", str(tmp_path / "nothing-here")])
    message = str(exc.value)
    assert str(tmp_path / "nothing-here" / "mlflow.db") in message
    assert "seqenc demo --out" in message and "seqenc train --workdir" in message
    assert not (tmp_path / "nothing-here").exists()


def test_ui_with_a_tracking_server_only_prints_its_url(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tracking, "_USER_URI", "http://mlflow.example:5000")
    assert main(["ui", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "MLflow UI: http://mlflow.example:5000"
    assert "nothing is started" in out
