"""Raw log ingestion with real Drain3 and real Parquet files on disk."""

import gzip
from pathlib import Path

import polars as pl
from shared_data import DATA, require

from parsers import storage
from parsers.log_ingest import ingest_logs
from parsers.logs import HDFS, ingest_labels
from parsers.synthetic import generate_hdfs_logs

DAY = "2026-01-02"

LINES = [
    "081109 203615 148 INFO dfs.DataNode$PacketResponder: PacketResponder 1 for block blk_38865049064139660 terminating",
    "081109 204655 556 INFO dfs.DataNode$PacketResponder: Received block blk_3587508140051953248 of size 67108864 from /10.251.42.84",
    "081109 204722 567 INFO dfs.DataNode$PacketResponder: Received block blk_38865049064139660 of size 1024 from /10.251.214.112",
    "081109 204005 35 INFO dfs.FSNamesystem: BLOCK* NameSystem.addStoredBlock: blockMap updated: 10.251.73.220:50010 is added to blk_38865049064139660 size 67108864",
    "081110 212510 19 INFO dfs.FSNamesystem: BLOCK* ask 10.250.18.114:50010 to delete  blk_38865049064139660 blk_-5140072410813878235",
    "081109 204100 19 INFO dfs.FSNamesystem: Roll Edit Log from 10.250.19.102",
]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def objects_of(df: pl.DataFrame, seq: str) -> dict[int, dict[str, str]]:
    """``{step: {key: value}}`` of one sequence."""
    out: dict[int, dict[str, str]] = {}
    for row in df.filter(pl.col("sequence_id") == seq).iter_rows(named=True):
        out.setdefault(row["step"], {})[row["key"]] = row["value"]
    return out


def test_templates_named_keys_and_steps(tmp_path):
    report = ingest_logs(write(tmp_path / "hdfs.log", LINES), tmp_path / "data", ingest_date=DAY)
    assert report["read"] == report["parsed"] == 6
    assert report["rejected"] == 0 and report["no_sequence_id"] == 1
    assert report["sequences"] == 3 and report["objects"] == 6
    df = storage.read_objects(tmp_path / "data", "hdfs")
    assert df.columns == ["sequence_id", "step", "ts", "key", "value", "template_id"]
    assert df.height == report["rows"]

    blk = objects_of(df, "blk_38865049064139660")
    assert len(blk) == 4  # ordered by time: 20:36:15, 20:40:05, 20:47:22, next day
    assert blk[0] == {
        "date": "081109",
        "time": "203615",
        "pid": "148",
        "level": "INFO",
        "component": "dfs.DataNode$PacketResponder",
        "template": "PacketResponder <NUM> for block <BLK> terminating",
        "responder": "1",
        "block": "blk_38865049064139660",
    }
    assert blk[1]["template"] == "BLOCK* NameSystem.addStoredBlock: blockMap updated: <IP> is added to <BLK> size <NUM>"
    assert (blk[1]["datanode"], blk[1]["size"]) == ("10.251.73.220:50010", "67108864")
    assert blk[2]["template"] == "Received block <BLK> of size <NUM> from /<IP>"
    assert (blk[2]["block"], blk[2]["size"], blk[2]["src_ip"]) == ("blk_38865049064139660", "1024", "10.251.214.112")
    ts = df.filter(pl.col("sequence_id") == "blk_38865049064139660").sort("step")["ts"].unique(maintain_order=True)
    assert str(ts[0]) == "2008-11-09 20:36:15"

    # both Received lines share one template id
    received = df.filter((pl.col("key") == "template") & pl.col("value").str.starts_with("Received"))
    assert received["template_id"].n_unique() == 1 and received.height == 2


def test_line_naming_two_blocks_lands_in_both_sequences(tmp_path):
    ingest_logs(write(tmp_path / "hdfs.log", LINES), tmp_path / "data", ingest_date=DAY)
    df = storage.read_objects(tmp_path / "data", "hdfs")
    other = objects_of(df, "blk_-5140072410813878235")
    assert list(other) == [0]
    assert other[0]["template"].startswith("BLOCK* ask <IP> to delete")
    assert other[0] == objects_of(df, "blk_38865049064139660")[3]


def test_unnamed_slots_get_mask_and_position_names(tmp_path):
    line = "081109 203615 148 INFO dfs.Foo: Shipping 10.1.2.3:80 for blk_42 after 0x1f retries 7"
    ingest_logs(write(tmp_path / "x.log", [line]), tmp_path / "data", ingest_date=DAY)
    obj = objects_of(storage.read_objects(tmp_path / "data", "hdfs"), "blk_42")[0]
    assert obj["template"] == "Shipping <IP> for <BLK> after <HEX> retries <NUM>"
    assert {k: obj[k] for k in ("ip_1", "blk_2", "hex_3", "num_4")} == {
        "ip_1": "10.1.2.3:80",
        "blk_2": "blk_42",
        "hex_3": "0x1f",
        "num_4": "7",
    }


def test_bad_lines_go_to_rejects_with_a_reason(tmp_path):
    path = tmp_path / "bad.log"
    path.write_bytes(
        (LINES[0] + "\n").encode()
        + b"this is not an hdfs line\n"
        + b"081399 256199 1 INFO dfs.X: Verification succeeded for blk_1\n"  # month 13
        + b"081109 203615 1 INFO dfs.X: caf\xe9 blk_2\n"  # latin-1 byte
        + b"\n"
    )
    report = ingest_logs(path, tmp_path / "data", ingest_date=DAY)
    assert (report["read"], report["parsed"], report["rejected"], report["blank"]) == (5, 1, 3, 1)
    rejects = storage.read_rejects(tmp_path / "data", "hdfs").sort("line_no")
    assert rejects["line_no"].to_list() == [2, 3, 4]
    reasons = rejects["reason"].to_list()
    assert reasons[0].startswith("header mismatch") and reasons[1] == "bad timestamp"
    assert reasons[2].startswith("undecodable")
    assert rejects["raw"][0] == "this is not an hdfs line" and set(rejects["file"]) == {str(path)}
    assert report["rejects_path"].endswith(f"rejects/source=hdfs/ingest_date={DAY}/part-bad.log.parquet")


def test_reingest_replaces_and_drain_state_keeps_template_ids(tmp_path):
    root = tmp_path / "data"
    log = write(tmp_path / "hdfs.log", LINES)
    first = ingest_logs(log, root, ingest_date=DAY)
    state = Path(first["state_path"])
    assert state == root / "state" / "drain3-hdfs.json" and state.stat().st_size > 0
    ids_before = dict(
        storage.read_objects(root, "hdfs")
        .filter(pl.col("key") == "template")
        .select("value", "template_id")
        .unique()
        .iter_rows()
    )

    second = ingest_logs(log, root, ingest_date=DAY)
    assert second["rows"] == first["rows"] and second["new_templates"] == 0
    assert storage.read_objects(root, "hdfs").height == first["rows"]  # replaced, not appended
    assert len(list(root.glob("objects/**/*.parquet"))) == 1

    # a new file: the miner reloads the saved state, so known templates keep their ids
    later = write(tmp_path / "later.log", [LINES[1].replace("556", "9"), LINES[0].replace("148", "7")])
    third = ingest_logs(later, root, ingest_date="2026-01-03")
    assert third["new_templates"] == 0 and third["templates"] == first["templates"]
    df = storage.read_objects(root, "hdfs")
    ids_after = dict(df.filter(pl.col("key") == "template").select("value", "template_id").unique().iter_rows())
    assert ids_after == ids_before
    assert df.height == first["rows"] + third["rows"]


def test_gzip_input_and_synthetic_end_to_end(tmp_path):
    info = generate_hdfs_logs(tmp_path / "HDFS.log", tmp_path / "anomaly_label.csv", n_blocks=150, seed=2)
    gz = tmp_path / "HDFS.log.gz"
    gz.write_bytes(gzip.compress((tmp_path / "HDFS.log").read_bytes()))
    root = tmp_path / "data"
    report = ingest_logs(gz, root, ingest_date=DAY)
    assert report["rejected"] == 0 and report["param_failures"] == 0
    assert report["parsed"] == info["lines"] and report["no_sequence_id"] == info["no_block_lines"]
    assert report["sequences"] == 150
    assert report["objects_path"].endswith("part-HDFS.log.parquet")  # .gz dropped: the same part as HDFS.log
    lab = ingest_labels(tmp_path / "anomaly_label.csv", root, "hdfs")
    assert lab["labels"] == 150 and lab["counts"]["Anomaly"] == info["anomalies"]
    labels = storage.read_labels(root, "hdfs")
    assert set(labels["sequence_id"]) == set(storage.read_objects(root, "hdfs")["sequence_id"])


def test_labels_reject_missing_and_duplicate_ids(tmp_path):
    csv_path = tmp_path / "labels.csv"
    csv_path.write_text("session_id,label\ns1,none\ns2,\ns1,upgrade\ns3,help_chat\n")
    report = ingest_labels(csv_path, tmp_path / "data", "sessions")
    assert (report["labels"], report["rejected"]) == (2, 2)
    assert storage.read_labels(tmp_path / "data", "sessions").rows() == [("s1", "none"), ("s3", "help_chat")]
    reasons = storage.read_rejects(tmp_path / "data", "sessions")["reason"].to_list()
    assert reasons == ["missing id or label", "duplicate id"]


def test_real_hdfs_sample_ingests_without_rejects(tmp_path):
    real = require(DATA / "loghub" / "HDFS" / "HDFS_2k.log")
    head = real.read_text(encoding="utf-8").splitlines()[:200]
    report = ingest_logs(write(tmp_path / "HDFS_head.log", head), tmp_path / "data", ingest_date=DAY)
    assert report["read"] == report["parsed"] == 200 and report["rejected"] == 0
    assert report["param_failures"] == 0
    keys = set(storage.read_objects(tmp_path / "data", "hdfs")["key"])
    header = {f.lower() for f in HDFS.fields} | {"template"}
    assert not {k for k in keys - header if k[-1].isdigit()}, (
        "every real HDFS template should be in key_names/hdfs.json"
    )


def test_streaming_batches_do_not_change_the_output(tmp_path):
    from training.bench.ingest import generate_lines

    log = generate_lines(3000, tmp_path / "gen.log")
    small = ingest_logs(log, tmp_path / "a", ingest_date=DAY, batch_lines=500)
    whole = ingest_logs(log, tmp_path / "b", ingest_date=DAY)
    assert small["rows"] == whole["rows"] > 0 and small["sequences"] == whole["sequences"]
    a = storage.read_objects(tmp_path / "a", "hdfs")
    b = storage.read_objects(tmp_path / "b", "hdfs")
    assert a.equals(b)
    heights = [f.height for f in storage.LineReader(log, []).frames(500)]  # it did go batch by batch
    assert len(heights) > 1 and sum(heights) == 3000
    # steps are 0..n-1 inside every sequence, in time order
    per_seq = a.unique(["sequence_id", "step"]).group_by("sequence_id").agg(
        pl.col("step").sort(), pl.col("ts").sort_by("step"))
    for steps, ts in zip(per_seq["step"].to_list(), per_seq["ts"].to_list()):
        assert steps == list(range(len(steps)))
        assert ts == sorted(ts)


def test_the_parser_caches_stay_bounded_and_give_the_same_clusters(monkeypatch):
    """A full masked-content cache starts empty again: memory stays bounded, clusters are the same."""
    from parsers import logs

    lines = [f"081109 2036{i % 60:02d} 148 INFO dfs.DataNode: served block blk_{i} to node{i % 7}" for i in range(300)]
    unbounded = [logs.LineParser("hdfs", None).parse(x).cluster.cluster_id for x in lines]
    monkeypatch.setattr(logs, "CACHE_LIMIT", 3)
    small = logs.LineParser("hdfs", None)
    bounded = [small.parse(x).cluster.cluster_id for x in lines]
    assert bounded == unbounded and len(small._clusters) <= 3 and len(small._ts) <= 3


def test_the_tokenizer_cache_stays_bounded(monkeypatch):
    from seqenc import tokenizer as tk

    tok = tk.ValueTokenizer.train([f"v{i}" for i in range(50)], vocab_size=120)
    want = tok.encode_many([f"v{i}" for i in range(50)])
    monkeypatch.setattr(tk, "CACHE_LIMIT", 10)
    tok._cache.clear()
    got = [tok.encode_many([f"v{i}"])[0] for i in range(50)]
    assert got == want and len(tok._cache) <= 10
    assert tok.encode_many([f"v{i}" for i in range(30)]) == want[:30]  # one call over the limit still answers
