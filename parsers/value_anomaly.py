"""HDFS-like raw logs whose anomalies show only in parameter *values*.

A benchmark for models that read values: every block goes through the same lifecycle as in
parsers.synthetic (allocateBlock, a three-node write pipeline, PacketResponder / Received /
addStoredBlock per replica, sometimes served, verified, deleted), and its *shape* -- which
events, how many, in which order -- is drawn from one distribution for every block, normal or
not. An anomalous block differs from a normal one only in the values of one or more lines:

* ``size_mismatch`` -- one replica's ``Received block ... of size N`` reports a size that
  disagrees with the other replicas and with the name node's ``addStoredBlock ... size``; the
  wrong size is an ordinary block size, so only the disagreement gives it away;
* ``foreign_node`` -- one ``addStoredBlock`` (the name node records a replica) or one
  ``Received ... from /ip`` names a data node that is not in the block's pipeline; the node is
  an ordinary cluster node, so only the comparison with the pipeline gives it away;
* ``odd_port`` -- one data-node address in the pipeline (``dest`` of a ``Receiving block`` line,
  or an ``addStoredBlock``) carries a port that normal blocks never use (they all use 50010);
* ``oversize`` -- every line agrees on a size larger than the 64 MiB block size (impossible for
  a single HDFS block; normal sizes are at most 67108864).

How the "same shape" is guaranteed: block structure and normal values come from one random
stream (``seed``), drawn identically whatever the label; which blocks are anomalous, of which
kind, and the replacement values come from a second stream (``seed + 1``). Lines of a block are
generated in non-decreasing time, and the final sort by time is stable, so a block's line order
is its generation order. Masks replace every perturbed value by the same mask (``<NUM>``,
``<IP>``), so Drain3 sees the same masked text and the template sequences match too.
"""

from __future__ import annotations

import csv
import datetime as dt
import logging
import random
from pathlib import Path

from parsers.synthetic import (
    _HDFS_START,
    FULL_BLOCK,
    RESPONDER,
    XCEIVER,
    _hdfs_line,
    _no_block_event,
    hdfs_nodes_and_blocks,
)

logger = logging.getLogger(__name__)

VALUE_ANOMALY_KINDS = ("size_mismatch", "foreign_node", "odd_port", "oversize")
DATANODE_PORT = 50010
ODD_PORTS = (50011, 50020, 50075, 50100)  # never used by a normal block's data nodes
# The order the three replicas report completion in (real HDFS_1 shows all three): responder
# and Received lines pairwise then the name node's addStoredBlock lines; per replica; or the
# name node first.
COMPLETION_ORDERS = ("pairs_then_stored", "per_replica", "stored_first")
_ORDER_WEIGHTS = (0.6, 0.2, 0.2)


def _block(rng: random.Random, arng: random.Random, blk: str, t0: dt.datetime, nodes: list[str],
           kind: str | None) -> list[tuple]:
    """Lines ``(time, level, component, content, pid)`` of one block, in time order.

    ``rng`` draws the structure and every normal value, the same number of draws for every
    block; ``arng`` draws only what an anomaly changes."""
    sec = dt.timedelta(seconds=1)
    ev: list[tuple] = []
    t = t0

    def add(component, content, pid, level="INFO", gap=(0, 1)):
        nonlocal t
        t += rng.randint(*gap) * sec
        ev.append((t, level, component, content, pid))

    ns_pid = rng.randint(26, 35)
    pipeline = rng.sample(nodes, 3)
    size = FULL_BLOCK if rng.random() < 0.7 else rng.randint(1_000, FULL_BLOCK - 1)
    job, task = rng.randint(1, 9), rng.randint(0, 1999)
    src_ports = [rng.randint(30000, 60999) for _ in pipeline]
    pids = [rng.randint(100, 30000) for _ in pipeline]
    order = rng.choices(COMPLETION_ORDERS, _ORDER_WEIGHTS)[0]
    served = rng.random() < 0.3
    serve_exception = rng.random() < 0.5
    verified = rng.random() < 0.2
    deleted = rng.random() < 0.4
    clients = [rng.choice(nodes) for _ in range(2)]
    server = rng.choice(pipeline)
    subdirs = [rng.randint(0, 63) for _ in pipeline]

    # --- what an anomaly changes (values only, from arng)
    dest_ports = [DATANODE_PORT] * 3
    stored_at = [f"{n}:{DATANODE_PORT}" for n in pipeline]
    received_size = [size] * 3
    received_from = [pipeline[i - 1] if i else pipeline[0] for i in range(3)]
    if kind == "oversize":
        size = FULL_BLOCK + arng.randint(1, FULL_BLOCK)
        received_size = [size] * 3
    elif kind == "size_mismatch":
        other = size
        while other == size:
            other = FULL_BLOCK if size != FULL_BLOCK and arng.random() < 0.5 else arng.randint(1_000, FULL_BLOCK - 1)
        received_size[arng.randrange(3)] = other
    elif kind == "foreign_node":
        foreign = arng.choice([n for n in nodes if n not in pipeline])
        i = arng.randrange(3)
        if arng.random() < 0.5:
            stored_at[i] = f"{foreign}:{DATANODE_PORT}"
        else:
            received_from[i] = foreign
    elif kind == "odd_port":
        i, port = arng.randrange(3), arng.choice(ODD_PORTS)
        if arng.random() < 0.5:
            dest_ports[i] = port
        else:
            stored_at[i] = f"{pipeline[i]}:{port}"

    path = f"/user/root/rand/_temporary/_task_200811092030_000{job}_m_{task:06d}_0/part-{task:05d}."
    add("dfs.FSNamesystem", f"BLOCK* NameSystem.allocateBlock: {path} {blk}", ns_pid, gap=(0, 0))
    src = pipeline[0]  # the client writes from the first data node
    for i, dest in enumerate(pipeline):
        add(XCEIVER, f"Receiving block {blk} src: /{src}:{src_ports[i]} dest: /{dest}:{dest_ports[i]}",
            rng.randint(100, 30000))
        src = dest

    def responder(i, gap=(0, 1)):
        add(RESPONDER, f"PacketResponder {2 - i} for block {blk} terminating", pids[i], gap=gap)
        add(RESPONDER, f"Received block {blk} of size {received_size[i]} from /{received_from[i]}", pids[i])

    def stored(i, gap=(0, 2)):
        add("dfs.FSNamesystem", f"BLOCK* NameSystem.addStoredBlock: blockMap updated: {stored_at[i]} is added to "
            f"{blk} size {size}", ns_pid, gap=gap)

    first_gap = (3, 90)
    if order == "pairs_then_stored":
        for i in range(3):
            responder(i, gap=first_gap if i == 0 else (0, 1))
        for i in range(3):
            stored(i)
    elif order == "per_replica":
        for i in range(3):
            responder(i, gap=first_gap if i == 0 else (0, 1))
            stored(i)
    else:
        for i in range(3):
            stored(i, gap=first_gap if i == 0 else (0, 1))
        for i in range(3):
            responder(i)

    if served:
        add(XCEIVER, f"{server}:{DATANODE_PORT} Served block {blk} to /{clients[0]}", rng.randint(100, 30000),
            gap=(10, 3000))
        if serve_exception:
            add(XCEIVER, f"{server}:{DATANODE_PORT}:Got exception while serving {blk} to /{clients[1]}:",
                rng.randint(100, 30000), level="WARN", gap=(1, 1))
    if verified:
        add("dfs.DataBlockScanner", f"Verification succeeded for {blk}", 13, gap=(60, 7200))
    if deleted:
        t_del_gap = (60, 20000)
        for j, node in enumerate(pipeline):
            add("dfs.FSNamesystem", f"BLOCK* NameSystem.delete: {blk} is added to invalidSet of "
                f"{node}:{DATANODE_PORT}", ns_pid, gap=t_del_gap if j == 0 else (0, 0))
        for j in range(3):
            subdir = f"/mnt/hadoop/dfs/data/current/subdir{subdirs[j]}/{blk}"
            add("dfs.FSDataset", f"Deleting block {blk} file {subdir}", 19, gap=(1, 40))
    return ev


def generate_value_anomaly_logs(log_path, labels_path, n_blocks: int = 1500, anomaly_rate: float = 0.1,
                                seed: int = 0) -> dict:
    """Write an HDFS_1-style raw log and a ``BlockId,Label,Kind`` CSV (``Kind`` is the anomaly
    kind, empty for a normal block).

    Exactly ``round(n_blocks * anomaly_rate)`` blocks are anomalous, kinds drawn uniformly from
    ``VALUE_ANOMALY_KINDS``. Blocks overlap in time so their lines interleave; about 2 % of the
    lines name no block (as in parsers.synthetic). Deterministic for a seed. Returns counts and
    paths."""
    rng, arng = random.Random(seed), random.Random(seed + 1)
    nodes, blocks = hdfs_nodes_and_blocks(rng, n_blocks)
    n_anom = round(n_blocks * anomaly_rate)
    kinds = {i: arng.choice(VALUE_ANOMALY_KINDS) for i in sorted(arng.sample(range(n_blocks), n_anom))}

    events, t0 = [], _HDFS_START
    for i, blk in enumerate(blocks):
        t0 += dt.timedelta(seconds=rng.randint(0, 12))
        events.extend(_block(rng, arng, blk, t0, nodes, kinds.get(i)))
    n_other = max(1, len(events) // 50)
    span = (max(e[0] for e in events) - _HDFS_START).total_seconds()
    for _ in range(n_other):
        events.append(_no_block_event(rng, _HDFS_START + dt.timedelta(seconds=rng.randint(0, int(span))), nodes))
    events.sort(key=lambda e: e[0])  # stable: a block's lines keep their generation order

    log_path, labels_path = Path(log_path), Path(labels_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    labels_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w", encoding="utf-8") as fh:
        fh.writelines(_hdfs_line(t, pid, level, comp, content) + "\n" for t, level, comp, content, pid in events)
    with labels_path.open("w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["BlockId", "Label", "Kind"])
        for i, blk in enumerate(blocks):
            w.writerow([blk, "Anomaly" if i in kinds else "Normal", kinds.get(i, "")])

    kind_counts = {k: sum(1 for v in kinds.values() if v == k) for k in VALUE_ANOMALY_KINDS}
    logger.info("wrote %d lines for %d blocks (%d value anomalies) to %s", len(events), n_blocks, n_anom, log_path)
    return {"log_path": str(log_path), "labels_path": str(labels_path), "lines": len(events), "blocks": n_blocks,
            "anomalies": n_anom, "anomaly_kinds": kind_counts, "no_block_lines": n_other,
            "kinds": {blocks[i]: k for i, k in kinds.items()}}
