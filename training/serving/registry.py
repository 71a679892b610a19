"""The MLflow Model Registry side of seqenc: find a model bundle by URI, read and move aliases.

Every training job registers its model as a new version of ``seqenc-<task>``
(training.pipeline.stages.stage_train). The registry alias ``champion`` names the version that batch
scoring uses; seqenc_nightly_training moves it only when a new version beats it on dev
(training.pipeline.nightly).

``resolve_model`` accepts what a user types after ``--model``:

* a bundle directory of any training mode (``config.json`` + ``model.safetensors`` +
  ``architecture.json`` + ``tokenizer.json`` + ``metadata.json``, training.serving.scoring; plus
  ``numeric_bins.json`` when the model uses numeric bins -- a URI downloads the whole
  ``artifacts/bundle`` folder, so it comes along);
* ``models:/<name>@<alias>``, ``models:/<name>/<version>`` or ``runs:/<run_id>/model``.

Choice: for URIs only the bundle's files (safetensors + JSON) are downloaded, from the logged
model's ``artifacts/bundle`` folder; the pyfunc's Python code that MLflow stored with the model
is never run, so scoring executes nothing that came out of the tracking store.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import mlflow

log = logging.getLogger(__name__)

CHAMPION = "champion"
BUNDLE_FILES = ("config.json", "model.safetensors", "architecture.json", "tokenizer.json", "metadata.json")


class NoChampionError(FileNotFoundError):
    """The registered model has no version under the alias (nothing promoted yet)."""


@dataclass(frozen=True)
class ResolvedModel:
    bundle: Path  # a bundle directory on local disk
    uri: str  # what was asked for
    name: str | None = None  # registered model name (None for a plain directory)
    version: str | None = None  # registered version (None for a plain directory or a run URI)
    run_id: str | None = None


def registered_model_name(task_name: str) -> str:
    """Model Registry name of a task's models (every mode registers a version of it)."""
    return f"seqenc-{task_name}"


def is_model_uri(model: str) -> bool:
    return str(model).startswith(("models:/", "runs:/"))


def model_uri(name: str, alias: str = CHAMPION) -> str:
    return f"models:/{name}@{alias}"


def version_by_alias(client: mlflow.MlflowClient, name: str, alias: str = CHAMPION):
    """The ModelVersion under ``alias``, or None when the model or the alias does not exist."""
    try:
        return client.get_model_version_by_alias(name, alias)
    except mlflow.exceptions.MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise


def resolve_model(model: str | Path, download_dir: str | Path | None = None) -> ResolvedModel:
    """A bundle directory for ``model`` (a directory or a ``models:/`` / ``runs:/`` URI).

    URIs are resolved against the current MLflow tracking URI (set it first, e.g. with
    training.serving.tracking.use_store). ``download_dir`` receives the bundle (default: a new temporary
    folder); an alias that names no version raises :class:`NoChampionError`."""
    text = str(model)
    if not is_model_uri(text):
        path = Path(text)
        missing = [f for f in BUNDLE_FILES if not (path / f).is_file()]
        if missing:
            raise FileNotFoundError(f"{path} is neither a model URI (models:/NAME@ALIAS, models:/NAME/VERSION, "
                                    f"runs:/RUN_ID/model) nor a seqenc model bundle (missing {', '.join(missing)})")
        return ResolvedModel(bundle=path, uri=text)
    try:
        return _fetch(text, download_dir)
    except mlflow.exceptions.MlflowException as exc:  # no such model, version, run or artifact
        raise FileNotFoundError(f"model URI {text} cannot be read from the tracking store "
                                f"{mlflow.get_tracking_uri()}: {str(exc).splitlines()[0][:200]}") from exc


def _fetch(text: str, download_dir) -> ResolvedModel:
    """:func:`resolve_model` of a ``models:/`` or ``runs:/`` URI."""
    client = mlflow.MlflowClient()
    name = version = run_id = None
    if text.startswith("models:/"):
        ref = text[len("models:/"):]
        if "@" in ref:
            name, alias = ref.split("@", 1)
            mv = version_by_alias(client, name, alias)
            if mv is None:
                raise NoChampionError(f"registered model {name!r} has no version with alias {alias!r} "
                                      f"(tracking URI {mlflow.get_tracking_uri()})")
        else:
            name, _, version = ref.partition("/")
            mv = client.get_model_version(name, version)
        name, version, run_id = mv.name, str(mv.version), mv.run_id
        text_to_fetch = f"models:/{name}/{version}"  # pin the version the alias named right now
    else:
        run_id = text[len("runs:/"):].split("/", 1)[0]
        text_to_fetch = text
    dst = Path(download_dir) if download_dir else Path(tempfile.mkdtemp(prefix="seqenc-model-"))
    dst.mkdir(parents=True, exist_ok=True)
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"{text_to_fetch.rstrip('/')}/artifacts/bundle",
                                                     dst_path=str(dst)))
    missing = [f for f in BUNDLE_FILES if not (local / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{text} holds no seqenc bundle (missing {', '.join(missing)} under artifacts/bundle)")
    log.info("model %s -> %s (version %s)", text, local, version)
    return ResolvedModel(bundle=local, uri=text, name=name, version=version, run_id=run_id)
