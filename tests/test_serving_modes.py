"""Every training mode's registered model can be served (issue 21): for interleaved,
no_interleave, joint, flattened and record_view (and interleaved with the TVM reading S(k) as a
bag of values, ``tvm_positions="within_value"``), a tiny model is trained through the real
pipeline into one real MLflow SQLite store, loaded by its ``models:/`` URI and scored with
``seqenc score``'s code and with the MLflow pyfunc. Both give, for the test sequences, the
probabilities the trainer itself computed from its training-time inputs -- so serving builds
the inputs training built. Champion promotion compares an end-to-end model with a TVM-KA."""

from __future__ import annotations

import json
import shutil

import mlflow
import numpy as np
import polars as pl
import pytest
from safetensors.torch import load_file

from parsers import storage
from seqenc.baselines import FlattenedEncoder, JointTVMKA, RecordViewEncoder
from seqenc.inference import ka_probabilities
from seqenc.model import TVMKA
from seqenc.sequences import TokenizedSequences, with_event_key
from seqenc.tokenizer import ValueTokenizer
from training.bench.accuracy import VARIANTS  # "<mode>+<variant>": the mode trained with these TVMKAConfig fields
from training.engine.end_to_end import EndToEndTrainer
from training.engine.modes import MODES
from training.engine.trainer import TrainConfig
from training.pipeline import stages as pipeline
from training.pipeline.nightly import promote_if_better, promotion_score
from training.serving.batch_score import score_partitions
from training.serving.registry import CHAMPION, resolve_model
from training.serving.scoring import load_bundle
from training.tasks.catalog import load_catalog
from training.tasks.data import label_array
from training.tasks.metrics import task_metrics

TASK, SOURCE, CLASSES = "anomaly", "hdfs", ["Normal", "Anomaly"]
ARCH = {"interleaved": TVMKA, "no_interleave": TVMKA, "joint": JointTVMKA, "flattened": FlattenedEncoder,
        "record_view": RecordViewEncoder, "interleaved+bag": TVMKA}
STEPS = {"pretrain_steps": 4, "rounds": 1, "tvm_steps_per_round": 3, "task_steps": 6, "batch_size": 8,
         "log_every": 2, "warmup_steps": 1}


@pytest.fixture(scope="module")
def root(prepared_task, tmp_path_factory):
    """A work directory with the tiny anomaly data ingested and its value sequences; its
    ``mlflow.db`` is the one store every mode registers into."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        work = tmp_path_factory.mktemp("serving") / "root"
        shutil.copytree(prepared_task(TASK), work)
        mlflow.set_tracking_uri(f"sqlite:///{work / 'mlflow.db'}")
        yield work


@pytest.fixture(scope="module")
def trained(root):
    """``trained(mode)``: stage_train's result for ``mode`` (trained once, in its own directory,
    on the shared data and store), with the night fields training.pipeline.nightly.promote_if_better reads."""
    done = {}

    def train(mode: str) -> dict:
        if mode not in done:
            work = root / "modes" / mode
            shutil.copytree(root / "sequences", work / "sequences")
            base, _, variant = mode.partition("+")
            # the KA's own scores (no surprise unless the variant asks): what trainer_probabilities recomputes
            model = {"surprise_scoring": False, **VARIANTS.get(variant, {})}
            result = pipeline.stage_train(str(work), TASK, "tiny", progress=False, mode=base, train_overrides=STEPS,
                                          model_overrides=model, data_root=str(root / "data"),
                                          tracking_dir=str(root))
            done[mode] = {**result, "work": work, "data_root": root / "data", "task_name": TASK,
                          "night_dir": str(work),
                          "dates": storage.ingest_dates(root / "data", SOURCE)}
        return done[mode]

    return train


def split_of(work) -> tuple[TokenizedSequences, dict[str, np.ndarray]]:
    data = TokenizedSequences.read_parquet(work / "sequences" / TASK / "windows.parquet")
    splits = pl.read_parquet(work / "sequences" / TASK / "splits.parquet")
    which = dict(zip(splits["sequence_id"].to_list(), splits["split"].to_list()))
    return data, {name: np.array([i for i, s in enumerate(data.sequence_ids) if which[s] == name])
                  for name in ("train", "dev", "test")}


def trainer_probabilities(result: dict, mode: str) -> tuple[list[str], np.ndarray]:
    """Every sequence's probabilities as the trainer computed them in its final evaluation, from
    its own training-time inputs: the final KR cache for interleaved / no_interleave, the
    end-to-end trainer's inputs for the others (with the trained weights of the bundle)."""
    work = result["work"]
    model, tok, _ = load_bundle(result["model_dir"])
    data, splits = split_of(work)
    if mode.partition("+")[0] in ("interleaved", "no_interleave"):
        job = pipeline.job_dir(work, TASK)
        final_cache = max(job.glob("kr_cache_v*.safetensors"), key=lambda p: int(p.stem.split("_v")[1]))
        return data.sequence_ids, ka_probabilities(model.ka, load_file(str(final_cache))["kr"], data)
    spec = load_catalog().task(TASK)
    tok = ValueTokenizer.from_file(work / "sequences" / TASK / "tokenizer.json")
    objects = with_event_key(storage.read_objects(result["data_root"], SOURCE))
    _, inputs = MODES[mode].build_model(model.config, data, tok, objects, tuple(spec.exclude_keys))
    y = label_array(data.sequence_ids, pl.read_parquet(work / "sequences" / TASK / "splits.parquet"), CLASSES)
    trainer = EndToEndTrainer(model, inputs, y, splits, TrainConfig(mode=mode, **STEPS), work / "check", "binary",
                              len(CLASSES), progress=False)
    return data.sequence_ids, trainer.probabilities()


def assert_probabilities(frame: pl.DataFrame, expected_ids: set[str]) -> np.ndarray:
    assert set(frame["sequence_id"].to_list()) == expected_ids and frame.height == len(expected_ids)
    probs = frame.select([f"prob_{c}" for c in CLASSES]).to_numpy()
    assert ((probs >= 0) & (probs <= 1)).all()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-6)
    return probs


@pytest.mark.parametrize("mode", list(ARCH))
def test_every_mode_is_served_by_uri_with_the_training_inputs(root, trained, tmp_path, mode):
    result = trained(mode)
    uri = f"models:/seqenc-{TASK}/{result['model_version']}"
    resolved = resolve_model(uri, tmp_path / "download")
    model = load_bundle(resolved.bundle).model
    assert type(model) is ARCH[mode]
    for field, value in VARIANTS.get(mode.partition("+")[2], {}).items():  # the bundle rebuilds the variant
        assert getattr(model.config, field) == value

    # seqenc score (the CLI's code): every sequence of the day
    scored = score_partitions(uri, root / "data", tmp_path / "scored", tracking_dir=root, progress=False)
    objects = storage.read_objects(root / "data", SOURCE)
    by_cli = pl.read_parquet(scored["dates"][0]["predictions"])
    assert scored["model_version"] == result["model_version"]
    cli_probs = assert_probabilities(by_cli, set(objects["sequence_id"].to_list()))

    # the MLflow pyfunc, on the test sequences' objects only
    ids, expected = trainer_probabilities(result, mode)
    _, splits = split_of(result["work"])
    test_ids = [ids[i] for i in splits["test"]]
    test_objects = objects.join(pl.DataFrame({"sequence_id": test_ids}), on="sequence_id", how="semi")
    pyfunc = mlflow.pyfunc.load_model(uri, model_config={"device": "cpu"})  # the loader places it (default cpu)
    with pytest.raises(Exception, match="'gpu0' is not a torch device"):  # model_config reaches load_bundle
        mlflow.pyfunc.load_model(uri, model_config={"device": "gpu0"})
    by_pyfunc = pl.from_pandas(pyfunc.predict(test_objects.to_pandas()))
    pyfunc_probs = assert_probabilities(by_pyfunc, set(test_ids))

    # both equal the trainer's own test-split probabilities
    want = expected[splits["test"]]
    row = {s: i for i, s in enumerate(by_cli["sequence_id"].to_list())}
    np.testing.assert_allclose(cli_probs[[row[s] for s in test_ids]], want, atol=1e-5)
    row = {s: i for i, s in enumerate(by_pyfunc["sequence_id"].to_list())}
    np.testing.assert_allclose(pyfunc_probs[[row[s] for s in test_ids]], want, atol=1e-5)
    # ... so its labels (the bundle's threshold) give the trainer's test metrics
    truth = pl.read_parquet(result["work"] / "sequences" / TASK / "splits.parquet")
    on_test = by_cli.join(truth, on="sequence_id", suffix="_true").filter(pl.col("split") == "test")
    y, pred = (np.array([CLASSES.index(v) for v in on_test[c].to_list()]) for c in ("label_true", "label"))
    assert task_metrics(y, pred, "binary") == pytest.approx(result["metrics"]["test"])


def test_promotion_compares_end_to_end_and_tvmka_models_on_the_same_dev_sequences(root, trained):
    """The champion an end-to-end model, the challenger a TVM-KA, then the other way round; each
    side's dev score is the promotion metric of the trainer's own dev probabilities."""
    client = mlflow.MlflowClient()
    name = f"seqenc-{TASK}"

    def dev_metric(mode: str) -> float:
        result = trained(mode)
        ids, probs = trainer_probabilities(result, mode)
        _, splits = split_of(result["work"])
        dev = splits["dev"]
        y = label_array(ids, pl.read_parquet(result["work"] / "sequences" / TASK / "splits.parquet"), CLASSES)
        return promotion_score("binary", y[dev], probs[dev])

    for champion_mode, challenger_mode in (("flattened", "interleaved"), ("no_interleave", "record_view")):
        champion, challenger = trained(champion_mode), trained(challenger_mode)
        client.set_registered_model_alias(name, CHAMPION, champion["model_version"])
        decision = promote_if_better(str(root), challenger)
        assert decision["champion_version"] == champion["model_version"]
        assert decision["new"] == pytest.approx(dev_metric(challenger_mode), abs=1e-6)
        assert decision["champion"] == pytest.approx(dev_metric(champion_mode), abs=1e-6)
        assert decision["promoted"] == (decision["new"] > decision["champion"])
        now = str(client.get_model_version_by_alias(name, CHAMPION).version)
        assert now == (challenger if decision["promoted"] else champion)["model_version"]


def test_a_bundle_says_what_it_holds_and_an_unknown_architecture_is_refused(trained, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(trained("flattened")["model_dir"], bundle)
    assert json.loads((bundle / "architecture.json").read_text()) == {
        "class": "FlattenedEncoder", "options": {}}
    assert type(load_bundle(bundle).model) is FlattenedEncoder
    (bundle / "architecture.json").write_text(json.dumps({"class": "Pickled", "options": {}}))
    with pytest.raises(ValueError, match=r"architecture\.json names architecture 'Pickled'"):
        load_bundle(bundle)
    (bundle / "architecture.json").write_text(json.dumps({"class": "RecordViewEncoder", "options": {}}))
    with pytest.raises(ValueError, match="metadata.json says mode 'flattened'"):
        load_bundle(bundle)
    (bundle / "architecture.json").unlink()
    with pytest.raises(FileNotFoundError, match="architecture.json is missing"):
        load_bundle(bundle)


def test_logging_and_loading_a_model_prints_no_mlflow_advice(root, trained, tmp_path):
    """Every `seqenc train` printed two of MLflow's UserWarnings (give an input example; add type
    hints to `predict`) although the logged signature is explicit. In a fresh interpreter, with
    every warning shown, logging a bundle and loading it back prints neither."""
    import subprocess
    import sys

    bundle = resolve_model(f"models:/seqenc-{TASK}/{trained('interleaved')['model_version']}",
                           tmp_path / "download").bundle
    script = ("import mlflow, sys\n"
              "from training.serving.tracking import log_bundle_model\n"
              "mlflow.set_tracking_uri(sys.argv[2])\n"
              "version = log_bundle_model(sys.argv[1], 'advice-check')\n"
              "mlflow.pyfunc.load_model(f'models:/advice-check/{version}')\n"
              "print('version', version)\n")
    done = subprocess.run([sys.executable, "-W", "always", "-c", script, str(bundle),
                           f"sqlite:///{tmp_path / 'advice.db'}"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "version 1" in done.stdout
    for advice in ("input example was not provided", "Add type hints to the `predict` method"):
        assert advice not in done.stderr
