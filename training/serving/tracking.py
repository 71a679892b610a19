"""MLflow tracking: where runs go and how they are logged.

The tracking store is ``MLFLOW_TRACKING_URI`` when set (a server such as
``http://127.0.0.1:5000``), else a SQLite file under the job's output directory. With a local
store, artifacts go beside it in ``<out>/mlartifacts`` (set on the experiment, so they never land
in whatever directory the process happens to run in).

Artifacts on an object store: ``SEQENC_ARTIFACT_ROOT=s3://bucket/prefix`` gives each experiment
created from then on the artifact location ``<prefix>/<experiment name>`` (with a local store or a
server); MLflow's S3 artifact repository writes there through boto3, with the standard AWS
environment (``AWS_ENDPOINT_URL`` or ``MLFLOW_S3_ENDPOINT_URL`` for an S3-compatible store). A
tracking server started with ``--default-artifact-root s3://...`` does the same for experiments
it creates. An experiment keeps the location it was created with.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path

import mlflow
import torch

log = logging.getLogger(__name__)

EXPERIMENT = "seqenc"


# The user's choice, read once: ``mlflow.set_tracking_uri`` writes MLFLOW_TRACKING_URI into
# os.environ itself, so reading it later would send every later job (and every child process)
# to the first job's SQLite file.
_USER_URI = os.environ.get("MLFLOW_TRACKING_URI")


def tracking_uri(out_dir: str | Path) -> str:
    if _USER_URI:
        return _USER_URI
    return f"sqlite:///{(Path(out_dir) / 'mlflow.db').resolve()}"


def _use(uri: str) -> None:
    """Point MLflow at ``uri`` without leaking it into the environment of child processes."""
    mlflow.set_tracking_uri(uri)
    if _USER_URI is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = _USER_URI


def use_store(out_dir: str | Path) -> str:
    """Point MLflow (tracking and registry) at the job's store -- MLFLOW_TRACKING_URI when set,
    else ``<out_dir>/mlflow.db`` -- and return its URI."""
    uri = tracking_uri(out_dir)
    _use(uri)
    return uri


def experiment_id(out_dir: str | Path, name: str = EXPERIMENT) -> str:
    """The id of experiment ``name`` in the current store, created (artifacts beside a local
    store) when missing."""
    return _experiment_id(Path(out_dir), name)


def ui_command(uri: str) -> str:
    """What to run (or open) to see the runs of store ``uri``: a server's URL, ``seqenc ui`` for a
    work directory's SQLite store, else the plain ``mlflow ui`` command."""
    if is_server_uri(uri):
        return uri
    if uri.startswith("sqlite:"):
        return f"seqenc ui --workdir {sqlite_path(uri).parent}"
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"


def is_server_uri(uri: str) -> bool:
    """A tracking server (``http(s)://...``) rather than a store the UI could open itself."""
    return uri.startswith(("http://", "https://"))


def ui_store(out_dir: str | Path, backend_store_uri: str | None = None) -> tuple[str, Path | None]:
    """The store ``seqenc ui`` opens and the folder its artifacts are served from.

    ``backend_store_uri`` when given, else :func:`tracking_uri` (``MLFLOW_TRACKING_URI`` when set,
    else ``<out_dir>/mlflow.db``). The artifact folder is the ``mlartifacts`` folder runs of that
    store write to (see :func:`_experiment_id`): ``<out_dir>/mlartifacts``, or the one beside an
    explicitly given SQLite file; None for a server or a non-SQLite store."""
    uri = backend_store_uri or tracking_uri(out_dir)
    if not uri.startswith("sqlite:"):
        return uri, None
    if backend_store_uri:
        return uri, sqlite_path(uri).parent / "mlartifacts"
    return uri, (Path(out_dir) / "mlartifacts").resolve()


def sqlite_path(uri: str) -> Path:
    """The database file of a ``sqlite:///...`` URI (``sqlite:////abs`` or ``sqlite:///rel``)."""
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0]).resolve()


def ui_server_command(uri: str, artifacts: Path | None, host: str = "127.0.0.1", port: int = 5000,
                      workers: int = 1) -> list[str]:
    """``mlflow ui`` (in MLflow 3 the same server as ``mlflow server``) on ``uri``, run with this
    interpreter. ``--artifacts-destination`` roots proxied artifacts (``mlflow-artifacts:/``, the
    default of experiments created from the UI) in the store's own ``mlartifacts`` folder instead
    of ``./mlartifacts`` of the current directory; runs logged by seqenc keep their absolute
    ``file://`` locations, which the server reads directly."""
    import sys

    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host,
           "--port", str(port), "--workers", str(workers)]
    if artifacts is not None:
        cmd += ["--artifacts-destination", Path(artifacts).resolve().as_uri()]
    return cmd


def _experiment_id(out_dir: Path, name: str) -> str:
    existing = mlflow.get_experiment_by_name(name)
    if existing is not None:
        return existing.experiment_id
    artifacts = None
    remote = os.environ.get("SEQENC_ARTIFACT_ROOT")
    if remote:
        artifacts = f"{remote.rstrip('/')}/{name}"
    elif mlflow.get_tracking_uri().startswith("sqlite:"):
        artifacts = (out_dir / "mlartifacts").resolve().as_uri()
    return mlflow.create_experiment(name, artifact_location=artifacts)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@contextmanager
def run(out_dir: str | Path, run_name: str, params: dict, tags: dict | None = None,
        experiment: str = EXPERIMENT, run_id: str | None = None):
    """Start an MLflow run with params and tags; yields the active run.

    ``run_id`` continues an existing run (a resumed job): params and tags are not logged again,
    and :func:`log_metrics` skips every (metric, step) the run already holds, so the steps a
    killed process logged after its last checkpoint are not duplicated when they are redone."""
    out_dir = Path(out_dir)
    _use(tracking_uri(out_dir))
    _logged.clear()
    if run_id is not None:
        client = mlflow.MlflowClient()
        for key in client.get_run(run_id).data.metrics:
            _logged[key] = max(m.step for m in client.get_metric_history(run_id, key))
        with mlflow.start_run(run_id=run_id) as active:
            yield active
        return
    experiment_id = _experiment_id(out_dir, experiment)
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name) as active:
        # torch's thread count is part of a run's identity: the same seed gives bit-identical
        # weights on the same count, and float sums in another order on another (docs/training.md)
        mlflow.set_tags({"git_commit": git_commit(), "torch_threads": str(torch.get_num_threads()), **(tags or {})})
        mlflow.log_params({mlflow_key(k): str(v)[:500] for k, v in flatten(params).items()})
        yield active


_logged: dict[str, int] = {}  # metric -> last step the resumed run already holds


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, name + "."))
        else:
            out[name] = v
    return out


_METRIC_UNSAFE = re.compile(r"[^A-Za-z0-9_\-. /]")


def mlflow_key(name: str) -> str:
    """A metric or parameter name MLflow accepts (letters, digits, ``_ - . /`` and spaces): any
    other character -- a class named ``R&D``, ``can't``, ``a,b`` -- becomes ``_``. Metric and
    parameter names carry class names (``label_count/<class>``, ``data.class_counts.<class>``)."""
    return _METRIC_UNSAFE.sub("_", str(name))


def log_metrics(metrics: dict, step: int) -> None:
    named = {mlflow_key(k): v for k, v in metrics.items()}
    numeric = {k: float(v) for k, v in named.items() if isinstance(v, (int, float)) and step > _logged.get(k, -1)}
    if numeric:
        mlflow.log_metrics(numeric, step=step)


def log_phase_run(index: int, kind: str, round_no: int, summary: dict) -> None:
    """A nested child run for one finished training phase (its kind, round, steps, seconds and
    last losses / dev metrics). Idempotent: a resumed job that redoes a phase does not add a
    second child run for it (tag ``phase_index``)."""
    parent = mlflow.active_run()
    client = mlflow.MlflowClient()
    existing = client.search_runs(
        [parent.info.experiment_id],
        f"tags.mlflow.parentRunId = '{parent.info.run_id}' and tags.phase_index = '{index}'")
    if existing:
        return
    name = f"{index:02d}-{kind}" + (f"-round{round_no}" if round_no else "")
    # the parent's experiment, explicitly: a nested run otherwise goes to the active experiment
    with mlflow.start_run(run_name=name, nested=True, experiment_id=parent.info.experiment_id):
        mlflow.set_tags({"phase_index": str(index), "phase": kind, "round": str(round_no)})
        mlflow.log_params({"phase": kind, "round": round_no, "steps": summary.get("steps", 0)})
        mlflow.log_metrics({k: float(v) for k, v in summary.items() if isinstance(v, (int, float))})


def seqenc_requirement() -> str:
    """The pip requirement a logged model names: the installed seqenc's version, else (run from a
    source checkout on PYTHONPATH, as on a machine where nothing is installed) its pyproject's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"seqenc=={version('seqenc')}"
    except PackageNotFoundError:
        import tomllib

        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        return f"seqenc=={tomllib.loads(pyproject.read_text())['project']['version']}"


def log_bundle_model(bundle: str | Path, registered_name: str) -> str:
    """Log a model bundle as an MLflow pyfunc (training/serving/mlflow_model.py, models from code; the
    bundle's safetensors + JSON are its artifacts) and register it; returns the model version."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    inputs = Schema([ColSpec("string", "sequence_id"), ColSpec("long", "step"), ColSpec("string", "key"),
                     ColSpec("string", "value"), ColSpec("long", "template_id", required=False)])
    outputs = Schema([ColSpec("string", "sequence_id"), ColSpec("double", "score"), ColSpec("string", "prediction")])
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():  # the artifact is named after the folder
        # the signature is explicit; an input example would make MLflow load and run the model while
        # logging it, so its advice to give one is not printed on every training
        warnings.filterwarnings("ignore", message=r".*An input example was not provided", category=UserWarning)
        named = Path(tmp) / "bundle"
        shutil.copytree(Path(bundle).resolve(), named)  # the saved version (MLflow refuses links out of it)
        info = mlflow.pyfunc.log_model(
            name="model", python_model=str(Path(__file__).with_name("mlflow_model.py")),
            artifacts={"bundle": str(named)}, registered_model_name=registered_name,
            model_config={"device": "cpu"},  # where it serves; a loader may override: load_model(..., model_config=)
            signature=ModelSignature(inputs, outputs), pip_requirements=[seqenc_requirement()])
    return str(info.registered_model_version)


def dataset_fingerprint(*files: str | Path) -> str:
    """A short content hash of the files a model was trained from (sha256, 16 hex digits)."""
    import hashlib

    digest = hashlib.sha256()
    for path in files:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:16]
