"""A data root on S3 (issue 52): a real S3-compatible server (moto's, in a subprocess), the real
readers and writers (boto3, polars' own s3:// reader), ingest -> train -> score against it and
the same on local disk: the objects, labels, Drain3 templates and predictions must be equal.
Also: keys land under ``<root>/objects/source=<s>/...``, a re-run replaces its part, the lease
that replaces flock on S3, MLflow artifacts on S3, and the CLI's one-line errors."""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import polars as pl
import pytest

from parsers import objectstore, storage
from tests.cli_error import cli_error
from training.cli.main import main
from training.pipeline import stages as pipeline
from training.tasks.spec import resolve_task

BUCKET = "seqenc-test"
DAY = "2026-03-01"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server on a free port, the AWS environment pointing at it, one bucket."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")  # moto accepts any key
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert time.time() < deadline and server.poll() is None, "moto server did not start"
                time.sleep(0.1)
        objectstore.client().create_bucket(Bucket=BUCKET)
        try:
            yield mp
        finally:
            server.terminate()
            server.wait(10)


def _keys(prefix: str) -> list[str]:
    pages = objectstore.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _run(work, root: str, predictions: str, raw: dict) -> dict:
    """ingest -> value sequences -> train -> score of the anomaly task (HDFS-like logs)."""
    pipeline.stage_ingest(str(work), "hdfs", raw["path"], raw["labels"], ingest_date=DAY, data_root=root)
    task = resolve_task(None, "anomaly")
    pipeline.stage_sequences(str(work), task, "tiny", seed=0, ingest_date=DAY, data_root=root, progress=False)
    trained = pipeline.stage_train(str(work), "anomaly", "tiny", seed=0, progress=False, data_root=root)
    scored = pipeline.stage_score(str(work), "anomaly", progress=False, ingest_date=DAY, data_root=root,
                                  predictions_root=predictions)
    return {"trained": trained, "scored": scored}


@pytest.fixture(scope="module")
def runs(s3, tmp_path_factory):
    base = tmp_path_factory.mktemp("objectstore")
    raw = pipeline.stage_generate(str(base / "gen"), "tiny", seed=0)["hdfs"]
    local = _run(base / "local", str(base / "local" / "data"), str(base / "local" / "predictions"), raw)
    s3.setenv("SEQENC_ARTIFACT_ROOT", f"s3://{BUCKET}/mlflow")  # the S3 run's MLflow artifacts go to the bucket
    try:
        remote = _run(base / "remote", f"s3://{BUCKET}/data", f"s3://{BUCKET}/predictions", raw)
    finally:
        s3.delenv("SEQENC_ARTIFACT_ROOT")
    return {"base": base, "raw": raw, "local": local, "remote": remote,
            "local_root": str(base / "local" / "data"), "remote_root": f"s3://{BUCKET}/data"}


def test_objects_labels_and_templates_equal_the_local_run(runs):
    local, remote = runs["local_root"], runs["remote_root"]
    assert storage.read_objects(remote, "hdfs").equals(storage.read_objects(local, "hdfs"))
    assert storage.read_objects(remote, "hdfs").height > 0
    assert storage.scan_objects(remote, "hdfs", DAY).collect().equals(storage.scan_objects(local, "hdfs", DAY).collect())
    assert storage.read_labels(remote, "hdfs").equals(storage.read_labels(local, "hdfs"))
    assert storage.read_rejects(remote, "hdfs").equals(storage.read_rejects(local, "hdfs"))
    assert storage.ingest_dates(remote, "hdfs") == storage.ingest_dates(local, "hdfs") == [DAY]
    state = storage.drain_state_path(remote, "hdfs")
    assert isinstance(state, objectstore.S3Path)
    assert json.loads(state.read_bytes()) == json.loads(storage.drain_state_path(local, "hdfs").read_bytes())


def test_keys_are_the_disk_layout(runs):
    keys = _keys("data/")
    assert f"data/objects/source=hdfs/ingest_date={DAY}/part-hdfs.log.parquet" in keys
    assert "data/labels/source=hdfs/part-hdfs_labels.csv.parquet" in keys
    assert "data/state/drain3-hdfs.json" in keys
    assert "data/state/hdfs.lease" not in keys  # the ingest's lease was released
    assert not [k for k in keys if k.endswith(".tmp") or "/." in k]  # no temp object was ever uploaded
    local = runs["base"] / "local" / "data"
    on_disk = sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file() and not p.name.endswith(".lock"))
    assert [k.removeprefix("data/") for k in keys] == on_disk


def test_predictions_equal_the_local_run(runs):
    local, remote = runs["local"]["scored"], runs["remote"]["scored"]
    assert remote["predictions"] == f"s3://{BUCKET}/predictions/anomaly/test.parquet"
    a = pl.read_parquet(local["predictions"]).drop("mlflow_run_id")
    b = pl.read_parquet(remote["predictions"]).drop("mlflow_run_id")  # polars reads s3:// itself
    assert b.height > 0 and a.columns == b.columns
    assert a.drop("score").equals(b.drop("score"))
    assert (a["score"] - b["score"]).abs().max() < 1e-6
    assert remote["metrics"] == pytest.approx(local["metrics"])


def test_mlflow_artifacts_on_s3(runs):
    keys = _keys("mlflow/")
    assert any(k.endswith("/plots/metrics.json") for k in keys), keys[:20]
    assert any(k.endswith("model.safetensors") or "/bundle/" in k for k in keys)
    assert not (runs["base"] / "remote" / "mlartifacts").exists()  # nothing written beside the local store


def test_rerun_replaces_its_part(runs, s3):
    root = runs["remote_root"]
    before = storage.read_objects(root, "hdfs")
    keys = _keys("data/objects/")
    assert main(["ingest", "logs", runs["raw"]["path"], "--root", root, "--source", "hdfs", "--preset", "hdfs",
                 "--date", DAY]) == 0
    assert _keys("data/objects/") == keys  # the same part, replaced: no second copy
    assert storage.read_objects(root, "hdfs").drop("template_id").equals(before.drop("template_id"))


def test_lease_excludes_waits_and_takes_over_an_expired_one(s3):
    key = objectstore.S3Path(f"s3://{BUCKET}/leases/src.lease")
    with objectstore.lease(key, ttl_s=1.5):
        with pytest.raises(TimeoutError):  # held, and renewed beyond its 1.5 s TTL while held
            with objectstore.lease(key, ttl_s=1.5, poll_s=0.1, timeout_s=2.5):
                pass
    assert not key.exists()  # released
    # a killed holder: its lease is left behind, expired -- the next one takes it over
    key.write_bytes(json.dumps({"holder": "dead:1", "expires": time.time() - 1}).encode())
    with objectstore.lease(key, ttl_s=5, poll_s=0.1, timeout_s=5) as held:
        assert json.loads(key.read_bytes())["holder"] == held["holder"]
    # several contenders: never two inside at once
    inside, overlaps, done = [0], [], []

    def work():
        with objectstore.lease(key, ttl_s=10, poll_s=0.05, timeout_s=60):
            inside[0] += 1
            overlaps.append(inside[0])
            time.sleep(0.1)
            inside[0] -= 1
        done.append(1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(done) == 4 and max(overlaps) == 1


def test_cli_errors_for_an_unusable_store(s3, tmp_path):
    log = tmp_path / "x.log"
    log.write_text("081109 203615 148 INFO dfs.DataNode$PacketResponder: PacketResponder 1 for block blk_38 "
                   "terminating\n")
    argv = ["ingest", "logs", str(log), "--source", "hdfs", "--preset", "hdfs", "--root"]
    assert "bucket 'no-such-bucket' does not exist" in cli_error([*argv, "s3://no-such-bucket/data"])
    s3.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
        assert "no S3 endpoint answers at http://127.0.0.1:" in cli_error([*argv, f"s3://{BUCKET}/data"])
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            mp.delenv(name)
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        mp.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        assert "no AWS credentials" in cli_error([*argv, f"s3://{BUCKET}/data"])
    assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"


def test_parallel_ingest_on_s3_equals_disk(runs, tmp_path):
    """Mine in worker processes, merge under the lease, write in parallel: as on disk."""
    lines = open(runs["raw"]["path"]).read().splitlines(keepends=True)
    files = [tmp_path / "a.log", tmp_path / "b.log"]
    files[0].write_text("".join(lines[: len(lines) // 2]))
    files[1].write_text("".join(lines[len(lines) // 2:]))
    roots = [str(tmp_path / "disk"), f"s3://{BUCKET}/parallel"]
    for root in roots:
        assert main(["ingest", "logs", *map(str, files), "--root", root, "--source", "hdfs", "--preset", "hdfs",
                     "--date", DAY, "--workers", "2"]) == 0
    assert storage.read_objects(roots[1], "hdfs").equals(storage.read_objects(roots[0], "hdfs"))
    assert json.loads(storage.drain_state_path(roots[1], "hdfs").read_bytes()) == \
        json.loads(storage.drain_state_path(roots[0], "hdfs").read_bytes())
    keys = _keys("parallel/")
    assert not [k for k in keys if "/mined/" in k or k.endswith(".lease")]  # cleared and released
    assert f"parallel/objects/source=hdfs/ingest_date={DAY}/part-a.log.parquet" in keys


def test_an_s3_dag_param_must_lie_under_the_object_root(monkeypatch):
    from training.airflow.workroot import OutsideWorkRoot, confine_uri

    monkeypatch.setenv("SEQENC_OBJECT_ROOT", f"s3://{BUCKET}/seqenc")
    assert confine_uri(f"s3://{BUCKET}/seqenc/data/", "data_root") == f"s3://{BUCKET}/seqenc/data"
    for bad in (f"s3://{BUCKET}/other", f"s3://{BUCKET}/seqenc/../x", f"s3://{BUCKET}/seqencx", "s3://x//y"):
        with pytest.raises(OutsideWorkRoot):
            confine_uri(bad, "data_root")
    monkeypatch.delenv("SEQENC_OBJECT_ROOT")
    with pytest.raises(OutsideWorkRoot, match="SEQENC_OBJECT_ROOT"):
        confine_uri(f"s3://{BUCKET}/seqenc", "data_root")


def test_cli_score_reads_and_writes_s3(runs, tmp_path):
    bundle = runs["remote"]["trained"]["model_dir"]
    local_out = tmp_path / "scored"
    for root, out in ((runs["remote_root"], f"s3://{BUCKET}/scored"), (runs["local_root"], str(local_out))):
        assert main(["score", "--model", bundle, "--input", root, "--out", out, "--date", DAY, "--device", "cpu",
                     "--no-progress"]) == 0
    assert _keys("scored/") == [f"scored/date={DAY}/part-0.parquet"]
    remote = pl.read_parquet(f"s3://{BUCKET}/scored/date={DAY}/part-0.parquet")
    assert remote.height > 0 and remote.equals(pl.read_parquet(local_out / f"date={DAY}" / "part-0.parquet"))


def test_the_dags_run_on_an_s3_data_root(s3, tmp_path):
    """seqenc_ingest -> seqenc_nightly_training -> seqenc_batch_score (``dag.test`` in a fresh
    interpreter, SQLite) with the DAG param ``data_root = s3://...`` under ``$SEQENC_OBJECT_ROOT``,
    and the same three DAGs with the default local root on a copy of the landing directory: the
    objects, labels and Drain3 state on the bucket equal the local ones, nothing of the data or the
    predictions lands in the S3 run's workdir, and the two runs' predictions are equal."""
    from airflow_run import airflow_env, migrate, run_dag

    from parsers.synthetic import generate_hdfs_logs

    day, logical, remote = "2025-03-01", "2025-03-02T00:00:00", f"s3://{BUCKET}/dags/data"
    results, works = {}, {"s3": tmp_path / "s3-work", "local": tmp_path / "local-work"}
    landing = works["s3"] / "landing" / "hdfs" / day
    landing.mkdir(parents=True)
    generate_hdfs_logs(landing / "hdfs-0.log", landing / "hdfs-0_labels.csv", n_blocks=120, anomaly_rate=0.1, seed=0)
    shutil.copytree(works["s3"] / "landing", works["local"] / "landing")
    for name, work in works.items():
        root = {"data_root": remote} if name == "s3" else {}
        env = airflow_env(tmp_path / f"{name}-airflow", {"SEQENC_WORKDIR": str(work), "OMP_NUM_THREADS": "1",
                                                         "SEQENC_OBJECT_ROOT": f"s3://{BUCKET}/dags"})
        migrate(env)
        confs = {"seqenc_ingest": {"workdir": str(work), "date": day, **root},
                 "seqenc_nightly_training": {"workdir": str(work), "tasks": ["anomaly"], "size": "tiny",
                                             "window_days": 3, "date": day, **root},
                 "seqenc_batch_score": {"workdir": str(work), "date": day, **root}}
        for dag_id, conf in confs.items():
            run = run_dag(dag_id, conf, env, logical)
            assert run["run_state"] == "success", run["_output"][-5000:]
            results[name, dag_id] = run
    local = works["local"] / "data"
    assert storage.read_objects(remote, "hdfs", day).height > 0
    assert storage.read_objects(remote, "hdfs", day).equals(storage.read_objects(local, "hdfs", day))
    assert storage.read_labels(remote, "hdfs").equals(storage.read_labels(local, "hdfs"))
    assert json.loads(storage.drain_state_path(remote, "hdfs").read_bytes()) == \
        json.loads(storage.drain_state_path(local, "hdfs").read_bytes())
    assert not (works["s3"] / "data").exists()  # the S3 run's data went to the bucket only
    part = f"anomaly/date={day}/part-0.parquet"  # the predictions go beside an S3 data root
    scored = {"s3": pl.read_parquet(f"s3://{BUCKET}/dags/data/predictions/{part}").sort("sequence_id"),
              "local": pl.read_parquet(works["local"] / "predictions" / part).sort("sequence_id")}
    assert not (works["s3"] / "predictions").exists()
    assert scored["s3"].height > 0 and scored["s3"]["sequence_id"].equals(scored["local"]["sequence_id"])
    assert (scored["s3"]["score"] - scored["local"]["score"]).abs().max() < 1e-6


def test_a_catalogue_source_on_s3_ingests_as_its_local_copy(runs, s3, tmp_path):
    """A catalogue source whose raw ``path`` (a glob) and ``labels`` are ``s3://`` URIs: ``seqenc
    ingest logs --source`` fetches them and writes the same objects, labels and templates as the
    same files on disk; a glob matching nothing is a one-line error."""
    raw = runs["raw"]
    client = objectstore.client()
    client.upload_file(raw["path"], BUCKET, "landing/hdfs/hdfs.log")
    client.upload_file(raw["labels"], BUCKET, "landing/hdfs-labels/hdfs_labels.csv")
    catalogs = {}
    for name, where in (("s3", f"s3://{BUCKET}/landing"), ("disk", str(tmp_path / "landing"))):
        if name == "disk":
            (tmp_path / "landing" / "hdfs").mkdir(parents=True)
            (tmp_path / "landing" / "hdfs-labels").mkdir()
            shutil.copy(raw["path"], tmp_path / "landing" / "hdfs" / "hdfs.log")
            shutil.copy(raw["labels"], tmp_path / "landing" / "hdfs-labels" / "hdfs_labels.csv")
        catalogs[name] = tmp_path / f"{name}.toml"
        catalogs[name].write_text(f'[sources.app]\nkind = "logs"\npreset = "hdfs"\npath = "{where}/hdfs/*.log"\n'
                                  f'labels = "{where}/hdfs-labels/hdfs_labels.csv"\n')
    roots = {"s3": f"s3://{BUCKET}/from-catalogue", "disk": str(tmp_path / "data")}
    for name in roots:
        assert main(["ingest", "logs", "--catalog", str(catalogs[name]), "--source", "app", "--root", roots[name],
                     "--date", DAY]) == 0
    assert storage.read_objects(roots["s3"], "app").height > 0
    assert storage.read_objects(roots["s3"], "app").equals(storage.read_objects(roots["disk"], "app"))
    assert storage.read_labels(roots["s3"], "app").equals(storage.read_labels(roots["disk"], "app"))
    assert json.loads(storage.drain_state_path(roots["s3"], "app").read_bytes()) == \
        json.loads(storage.drain_state_path(roots["disk"], "app").read_bytes())
    assert f"from-catalogue/objects/source=app/ingest_date={DAY}/part-hdfs.log.parquet" in _keys("from-catalogue/")
    catalogs["s3"].write_text(catalogs["s3"].read_text().replace("*.log", "*.gz"))
    message = cli_error(["ingest", "logs", "--catalog", str(catalogs["s3"]), "--source", "app", "--root",
                         roots["s3"]])
    assert "matches no file" in message and "s3://" in message


def test_evaluate_reads_an_s3_root(runs, capsys):
    """``seqenc evaluate --root s3://...`` scores the labelled test split from the bucket, as the
    local run's evaluate does from disk."""
    printed = {}
    for name, root in (("remote", runs["remote_root"]), ("local", runs["local_root"])):
        assert main(["evaluate", "--workdir", str(runs["base"] / name), "--task", "anomaly", "--root", root,
                     "--no-progress"]) == 0
        out = capsys.readouterr().out
        printed[name] = json.loads(out[out.index("{"):])
    assert printed["remote"]["sequences"] == printed["local"]["sequences"] > 0
    assert printed["remote"]["metrics"] == pytest.approx(printed["local"]["metrics"])
