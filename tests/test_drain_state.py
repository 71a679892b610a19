"""Drain3 state as plain JSON (parsers.drain_state): real Drain3, real files, no jsonpickle loads."""

import base64
import json
import logging
import os
import re
import zlib

import jsonpickle
import pytest
from drain3.drain import Drain
from shared_data import DATA, require

from parsers import storage
from parsers.drain_state import FORMAT, VERSION, DrainStateFile, _clusters_in_order, dump_state
from parsers.log_ingest import ingest_logs
from parsers.logs import LineParser, make_miner
from parsers.presets import resolve
from parsers.synthetic import generate_hdfs_logs


def hdfs_lines(tmp_path, n_blocks=60) -> list[str]:
    generate_hdfs_logs(tmp_path / "hdfs.log", tmp_path / "labels.csv", n_blocks=n_blocks, seed=3)
    return (tmp_path / "hdfs.log").read_text(encoding="utf-8").splitlines()


def feed(parser: LineParser, lines: list[str]) -> list[int]:
    """Cluster id of every line through the header regex, the masks and Drain3; without
    LineParser's cache (masked content -> cluster), which lives only as long as one run."""
    heads = [head for head in map(parser.header, lines) if not isinstance(head, str)]
    drain, masker = parser.miner.drain, parser.miner.masker
    return [drain.add_log_message(masker.mask(groups["Content"]))[0].cluster_id for groups, _ in heads]


def clusters_of(miner) -> list[tuple[int, str, int]]:
    return [(c.cluster_id, c.get_template(), c.size) for c in miner.drain.clusters]


def pickle_keys(data) -> list[str]:
    """Every key starting with ``py/`` anywhere in parsed JSON."""
    if isinstance(data, dict):
        return [k for k in data if k.startswith("py/")] + [k for v in data.values() for k in pickle_keys(v)]
    if isinstance(data, list):
        return [k for v in data for k in pickle_keys(v)]
    return []


def drain3_snapshot(drain, compress: bool = True) -> bytes:
    """The bytes ``TemplateMiner.save_state`` wrote before: jsonpickle, then zlib and base64
    (Drain3's default ``snapshot_compress_state``)."""
    state = jsonpickle.dumps(drain, keys=True).encode("utf-8")
    return base64.b64encode(zlib.compress(state)) if compress else state


def test_ingest_writes_plain_json_state(tmp_path):
    lines = hdfs_lines(tmp_path)
    report = ingest_logs(tmp_path / "hdfs.log", tmp_path / "data", ingest_date="2026-01-02")
    path = storage.drain_state_path(tmp_path / "data", "hdfs")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert pickle_keys(data) == []
    assert (data["format"], data["version"]) == (FORMAT, VERSION)
    assert len(data["clusters"]) == report["templates"] > 5
    assert sum(c["size"] for c in data["clusters"]) == report["parsed"] == len(lines)
    assert data["miner"]["depth"] == resolve("hdfs").depth and data["tree"]["children"]


SOURCES = {  # name -> (preset, raw log lines)
    "generated-hdfs": lambda tmp_path: ("hdfs", hdfs_lines(tmp_path, n_blocks=120)),
    "loghub-hdfs": lambda tmp_path: ("hdfs", require(DATA / "loghub/HDFS/HDFS_2k.log").read_text().splitlines()),
    "loghub-openstack": lambda tmp_path: ("openstack",
                                          require(DATA / "loghub/OpenStack/OpenStack_2k.log").read_text().splitlines()),
    "loghub-linux": lambda tmp_path: ("linux", require(DATA / "loghub/Linux/Linux_2k.log").read_text().splitlines()),
}


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_save_load_continue_equals_uninterrupted_miner(tmp_path, source):
    preset, lines = SOURCES[source](tmp_path)
    half = len(lines) // 2
    whole = LineParser(preset, state_path=None)
    ids_whole = feed(whole, lines)

    path = tmp_path / "state" / "drain3-x.json"
    first = LineParser(preset, path)
    ids_first = feed(first, lines[:half])
    first.miner.save_state("first half")
    second = LineParser(preset, path)  # a fresh process would do the same: load, then go on
    assert clusters_of(second.miner) == clusters_of(first.miner)
    ids_second = feed(second, lines[half:])

    assert ids_first + ids_second == ids_whole
    assert clusters_of(second.miner) == clusters_of(whole.miner)
    assert dump_state(second.miner.drain) == dump_state(whole.miner.drain)  # the prefix tree too


def test_lru_bounded_drain_continues_exactly(tmp_path):
    """With ``max_clusters`` the saved order is the LRU order: evictions after a reload match."""
    # 4 hot templates (early, often used) and 6 rare ones that cycle: only LRU eviction keeps the hot ones
    kinds = [4 + (i // 5) % 6 if i % 5 == 4 else (i * 3) % 4 for i in range(600)]  # line 249 is rare: it evicts
    contents = [f"event{k} happened at node n{i}" for i, k in enumerate(kinds)]

    def drain():
        return Drain(depth=4, sim_th=0.5, max_clusters=6, parametrize_numeric_tokens=False)

    whole = drain()
    ids_whole = [whole.add_log_message(c)[0].cluster_id for c in contents]
    state = DrainStateFile(tmp_path / "lru.json")
    first = drain()
    ids = [first.add_log_message(c)[0].cluster_id for c in contents[:249]]
    state.save(first)
    second = drain()
    assert state.load(second)
    ids_first = ids + [first.add_log_message(c)[0].cluster_id for c in contents[249:]]  # saving changed nothing
    ids += [second.add_log_message(c)[0].cluster_id for c in contents[249:]]
    assert ids == ids_first == ids_whole and whole.clusters_counter > 10  # clusters were evicted
    assert [c.cluster_id for c in _clusters_in_order(first)] != sorted(first.id_to_cluster)  # LRU order matters
    assert dump_state(second) == dump_state(first) == dump_state(whole)


def test_template_miner_snapshots_write_the_new_format(tmp_path, caplog):
    """Drain3's own snapshot policy (a save on every cluster change) goes through the new format;
    a different ``sim_th`` in the file only warns (the format's threshold is used)."""
    path = tmp_path / "drain3-hdfs.json"
    miner = make_miner(resolve("hdfs"), path)
    result = miner.add_log_message("Receiving block blk_1 src: /10.0.0.1:50010 dest: /10.0.0.2:50010")
    assert result["change_type"] == "cluster_created"
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["format"] == FORMAT and [c["size"] for c in data["clusters"]] == [1]

    data["miner"]["sim_th"] = 0.9
    path.write_text(json.dumps(data), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="parsers.drain_state"):
        again = make_miner(resolve("hdfs"), path)
    assert again.drain.sim_th == resolve("hdfs").sim_th and "sim_th=0.9" in caplog.text


class RunsShell:
    """What a tampered file asks jsonpickle to do on load: call ``os.system``."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def tampered_old(miner, payload: dict) -> bytes:
    data = json.loads(jsonpickle.dumps(miner.drain, keys=True))
    data["profiler"] = payload
    return base64.b64encode(zlib.compress(json.dumps(data).encode()))


def tampered_new(miner, payload: dict) -> bytes:
    data = dump_state(miner.drain)
    data["clusters"][0]["template_tokens"] = payload
    return json.dumps(data).encode()


def foreign_class(miner, payload: dict) -> bytes:
    data = json.loads(jsonpickle.dumps(miner.drain, keys=True))
    data["root_node"]["py/object"] = "subprocess.Popen"
    return json.dumps(data).encode()


@pytest.mark.parametrize("tamper", [tampered_old, tampered_new, foreign_class])
def test_tampered_state_is_refused_and_runs_nothing(tmp_path, tamper):
    marker = tmp_path / "pwned"
    payload = json.loads(jsonpickle.dumps(RunsShell(f"touch {marker}"), keys=True))
    assert "py/reduce" in payload  # the real jsonpickle payload, never loaded here
    parser = LineParser("hdfs", None)
    feed(parser, hdfs_lines(tmp_path))
    path = tmp_path / "state" / "drain3-hdfs.json"
    path.parent.mkdir()
    path.write_bytes(tamper(parser.miner, payload))
    before = path.read_bytes()

    with pytest.raises(ValueError, match=re.escape(str(path))) as err:
        make_miner(resolve("hdfs"), path)
    assert "Delete it" in str(err.value)
    assert not marker.exists()
    assert path.read_bytes() == before  # not rewritten


@pytest.mark.parametrize("compress", [True, False], ids=["compressed", "plain"])
def test_old_jsonpickle_state_is_migrated_once(tmp_path, caplog, compress):
    lines = hdfs_lines(tmp_path)
    half = len(lines) // 2
    old = LineParser("hdfs", None)
    feed(old, lines[:half])
    path = tmp_path / "state" / "drain3-hdfs.json"
    path.parent.mkdir()
    path.write_bytes(drain3_snapshot(old.miner.drain, compress))

    with caplog.at_level(logging.WARNING, logger="parsers.drain_state"):
        migrated = LineParser("hdfs", path)
    assert any(r.getMessage().startswith(f"migrated {path}") for r in caplog.records)
    assert dump_state(migrated.miner.drain) == dump_state(old.miner.drain)
    on_disk = json.loads(path.read_text(encoding="utf-8"))
    assert (on_disk["format"], on_disk["version"]) == (FORMAT, VERSION) and pickle_keys(on_disk) == []
    assert on_disk == dump_state(old.miner.drain)

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="parsers.drain_state"):
        again = LineParser("hdfs", path)
    assert not caplog.records  # migrated once
    assert feed(again, lines[half:]) == feed(old, lines[half:])
    assert clusters_of(again.miner) == clusters_of(old.miner)


def test_migration_resolves_py_id_references(tmp_path):
    """jsonpickle writes a second reference to the same list as ``{"py/id": n}``."""
    parser = LineParser("hdfs", None)
    feed(parser, hdfs_lines(tmp_path))
    drain = parser.miner.drain
    leaf = next(n for n in drain.root_node.key_to_child_node["6"].key_to_child_node.values() if n.cluster_ids)
    drain.root_node.cluster_ids = leaf.cluster_ids  # unused by Drain; now one list in two places
    path = tmp_path / "drain3-hdfs.json"
    path.write_bytes(drain3_snapshot(drain, compress=False))
    assert '"py/id"' in path.read_text()

    migrated = make_miner(resolve("hdfs"), path)
    assert migrated.drain.root_node.cluster_ids == leaf.cluster_ids != []
    assert dump_state(migrated.drain) == dump_state(drain)


def break_version(d):
    d["version"] = 2


def drop_tree(d):
    del d["tree"]


def counter_as_text(d):
    d["clusters_counter"] = str(d["clusters_counter"])


def unknown_cluster_key(d):
    d["clusters"][0]["template"] = "x"


def id_past_counter(d):
    d["clusters"][0]["id"] = d["clusters_counter"] + 1


def other_depth(d):
    d["miner"]["depth"] = 6


def pickle_tag_inside(d):
    d["tree"]["children"]["4"]["py/object"] = "drain3.drain.Node"


def tree_too_deep(d):
    leaf = {"cluster_ids": [], "children": {}}
    d["tree"]["children"]["4"]["children"]["BLOCK*"]["children"]["x"] = leaf


@pytest.mark.parametrize("damage", [break_version, drop_tree, counter_as_text, unknown_cluster_key, id_past_counter,
                                    other_depth, pickle_tag_inside, tree_too_deep])
def test_malformed_state_is_refused_naming_the_file(tmp_path, damage):
    parser = LineParser("hdfs", None)
    feed(parser, hdfs_lines(tmp_path))
    data = dump_state(parser.miner.drain)
    damage(data)
    path = tmp_path / "drain3-hdfs.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(str(path))):
        make_miner(resolve("hdfs"), path)


@pytest.mark.parametrize("text", [b"", b"[]", b"not json at all", b'{"format": "seqenc-drain3-state"} trailing'])
def test_not_a_state_file_is_refused(tmp_path, text):
    path = tmp_path / "drain3-hdfs.json"
    path.write_bytes(text)
    with pytest.raises(ValueError, match=re.escape(str(path))):
        make_miner(resolve("hdfs"), path)
