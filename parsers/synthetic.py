"""Built-in demo data: an HDFS-like raw log and JSON Lines user-session events.

Both generators are deterministic for a given ``seed`` (they only use ``random.Random``).

``generate_hdfs_logs`` imitates LogHub's HDFS_1 log (``yymmdd HHMMSS pid LEVEL component:
content``). Every block goes through the real lifecycle (allocateBlock, three-node write
pipeline, PacketResponder, Received, addStoredBlock, sometimes served / verified / deleted).
A chosen share of blocks is anomalous, of one of four kinds an operator would flag:

* ``missing_replica`` – fewer Received / addStoredBlock lines than replicas;
* ``exception`` – writeBlock / receiveBlock exceptions, interrupted PacketResponder;
* ``size_mismatch`` – a replica reports a Received size that differs from addStoredBlock;
* ``bad_order`` – the block is deleted before it was ever added to the blockMap.

Normal blocks carry benign noise too (``Got exception while serving`` is common in the real
log), and a few lines name no block at all, as in a real name-node log.

``generate_session_events`` writes user sessions of a cloud web product. The label of a
session is what the user does *after* the observed prefix: ``upgrade``, ``help_chat`` or
``none``. The signal is deliberately carried partly by payload *values* (error codes,
pages, usage, HTTP statuses, query text), with overlap and label noise, so a model that only
counts event types does clearly worse than one that reads values.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import logging
import random
from pathlib import Path

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- HDFS

ANOMALY_KINDS = ("missing_replica", "exception", "size_mismatch", "bad_order")
FULL_BLOCK = 67108864
_HDFS_START = dt.datetime(2008, 11, 9, 20, 35, 18)
XCEIVER, RESPONDER = "dfs.DataNode$DataXceiver", "dfs.DataNode$PacketResponder"
_EXCEPTIONS = (
    "java.io.IOException: Connection reset by peer",
    "java.io.IOException: Could not read from stream",
    "java.io.EOFException: while trying to read 65557 bytes",
    "java.io.InterruptedIOException: Interruped while waiting for IO on channel",
)


def _hdfs_line(t: dt.datetime, pid: int, level: str, component: str, content: str) -> str:
    return f"{t:%y%m%d %H%M%S} {pid} {level} {component}: {content}"


def _block_events(rng: random.Random, blk: str, t0: dt.datetime, nodes: list[str], kind: str | None):
    """Events ``(time, level, component, content, pid)`` of one block's life."""
    ev: list[tuple] = []

    def add(t, component, content, pid, level="INFO"):
        ev.append((t, level, component, content, pid))

    ns_pid = rng.randint(26, 35)  # the name node's handler threads
    sec = dt.timedelta(seconds=1)
    pipeline = rng.sample(nodes, 3)
    size = FULL_BLOCK if rng.random() < 0.8 else rng.randint(1_000, FULL_BLOCK - 1)
    job, task = rng.randint(1, 9), rng.randint(0, 1999)
    path = f"/user/root/rand/_temporary/_task_200811092030_000{job}_m_{task:06d}_0/part-{task:05d}."
    add(t0, "dfs.FSNamesystem", f"BLOCK* NameSystem.allocateBlock: {path} {blk}", ns_pid)

    src, t = pipeline[0], t0  # the client writes from the first data node
    for dest in pipeline:
        t += rng.randint(0, 1) * sec
        port = rng.randint(30000, 60999)
        add(t, XCEIVER, f"Receiving block {blk} src: /{src}:{port} dest: /{dest}:50010", rng.randint(100, 30000))
        src = dest

    t_done = t0 + rng.randint(3, 90) * sec
    acked = list(range(3))
    if kind == "missing_replica":
        acked = sorted(rng.sample(acked, rng.choice([1, 2])))
    odd = rng.choice(acked) if kind == "size_mismatch" else None
    stored_at = []
    for i in acked:
        pid = rng.randint(100, 30000)
        t = t_done + rng.randint(0, 2) * sec
        got = size
        if i == odd:  # this replica acknowledges a different size than the name node stores
            got = rng.randint(1_000, size - 1) if size > 1_000 else size + 512
        prev = pipeline[i - 1] if i else pipeline[0]
        add(t, RESPONDER, f"PacketResponder {2 - i} for block {blk} terminating", pid)
        add(t, RESPONDER, f"Received block {blk} of size {got} from /{prev}", pid)
        stored_at.append(t + rng.randint(0, 3) * sec)
        updated = f"blockMap updated: {pipeline[i]}:50010 is added to {blk} size {size}"
        add(stored_at[-1], "dfs.FSNamesystem", f"BLOCK* NameSystem.addStoredBlock: {updated}", ns_pid)

    if kind == "missing_replica" and rng.random() < 0.5:
        t = t_done + rng.randint(300, 900) * sec
        add(t, "dfs.FSNamesystem$PendingReplicationMonitor", f"PendingReplicationMonitor timed out block {blk}", ns_pid)
        target = f"{rng.choice(nodes)}:50010"
        add(
            t + sec,
            "dfs.FSNamesystem",
            f"BLOCK* ask {pipeline[acked[0]]}:50010 to replicate {blk} to datanode(s) {target}",
            ns_pid,
        )
    if kind == "exception":
        t = t0 + rng.randint(2, 60) * sec
        pid = rng.randint(100, 30000)
        exc = rng.choice(_EXCEPTIONS)
        choices = [
            (XCEIVER, f"writeBlock {blk} received exception {exc}"),
            (RESPONDER, f"PacketResponder {rng.randint(0, 2)} for block {blk} Interrupted."),
            (XCEIVER, f"Exception in receiveBlock for block {blk} {exc}"),
            (XCEIVER, f"{pipeline[0]}:50010:Exception writing block {blk} to mirror {pipeline[1]}:50010"),
        ]
        for component, content in rng.sample(choices, rng.randint(1, 3)):
            add(t, component, content, pid)
            t += rng.randint(0, 2) * sec

    # benign activity after the write
    last = max(stored_at, default=t_done)
    if rng.random() < 0.25:
        t = last + rng.randint(10, 3000) * sec
        node = rng.choice(pipeline)
        add(t, XCEIVER, f"{node}:50010 Served block {blk} to /{rng.choice(nodes)}", rng.randint(100, 30000))
        if rng.random() < 0.6:  # clients that hang up are routine in HDFS_1, in normal blocks too
            content = f"{node}:50010:Got exception while serving {blk} to /{rng.choice(nodes)}:"
            add(t + sec, XCEIVER, content, rng.randint(100, 30000), level="WARN")
    if rng.random() < 0.05:
        add(last + rng.randint(60, 7200) * sec, "dfs.DataBlockScanner", f"Verification succeeded for {blk}", 13)

    if kind == "bad_order" or rng.random() < 0.4:
        if kind == "bad_order":  # deletion lands before the blockMap ever learnt of the block
            t_del = t0 + rng.randint(1, 2) * sec
            ev[:] = [e if "addStoredBlock" not in e[3] else (e[0] + 120 * sec, *e[1:]) for e in ev]
        else:
            t_del = last + rng.randint(60, 20000) * sec
        for node in pipeline:
            add(
                t_del,
                "dfs.FSNamesystem",
                f"BLOCK* NameSystem.delete: {blk} is added to invalidSet of {node}:50010",
                ns_pid,
            )
        if rng.random() < 0.1:
            add(t_del + sec, "dfs.FSNamesystem", f"BLOCK* ask {pipeline[0]}:50010 to delete  {blk}", ns_pid)
        for _ in pipeline:  # one deletion per replica
            subdir = f"/mnt/hadoop/dfs/data/current/subdir{rng.randint(0, 63)}/{blk}"
            add(t_del + rng.randint(1, 40) * sec, "dfs.FSDataset", f"Deleting block {blk} file {subdir}", 19)
    return ev


def _no_block_event(rng: random.Random, t: dt.datetime, nodes: list[str]):
    """A line of another component that names no block."""
    node = rng.choice(nodes)
    options = [
        ("dfs.FSNamesystem", f"Roll Edit Log from {node}"),
        ("dfs.DataNode", f"BlockReport of {rng.randint(100, 900)} blocks got processed in {rng.randint(1, 40)} msecs"),
        (
            "dfs.FSNamesystem",
            (
                f"Number of transactions: {rng.randint(10, 900)} Total time for "
                f"transactions(ms): {rng.randint(1, 90)} Number of syncs: {rng.randint(5, 200)}"
            ),
        ),
        ("dfs.DataNode", f"{node}:50010 In DataNode.run, data = FSDataset{{dirpath='/mnt/hadoop/dfs/data/current'}}"),
        ("org.apache.hadoop.ipc.Server", f"IPC Server handler {rng.randint(0, 9)} on 9000: starting"),
    ]
    comp, content = rng.choice(options)
    return (t, "INFO", comp, content, rng.randint(13, 40))


def hdfs_nodes_and_blocks(rng: random.Random, n_blocks: int) -> tuple[list[str], list[str]]:
    """About 60 data-node addresses and ``n_blocks`` distinct block ids, drawn from ``rng``."""
    nodes = sorted({f"10.{rng.choice((250, 251))}.{rng.randint(1, 254)}.{rng.randint(1, 254)}" for _ in range(60)})
    blocks: list[str] = []
    seen: set[str] = set()
    while len(blocks) < n_blocks:
        blk = f"blk_{'-' if rng.random() < 0.5 else ''}{rng.getrandbits(63)}"
        if blk not in seen:
            seen.add(blk)
            blocks.append(blk)
    return nodes, blocks


def generate_hdfs_logs(log_path, labels_path, n_blocks: int = 2000, anomaly_rate: float = 0.03, seed: int = 0) -> dict:
    """Write an HDFS_1-style raw log and a LogHub-style ``BlockId,Label`` CSV.

    Exactly ``round(n_blocks * anomaly_rate)`` blocks are anomalous (kinds drawn uniformly
    from ``ANOMALY_KINDS``). Lines are time ordered; blocks overlap in time, so their lines
    interleave. About 2 % of the lines name no block. Returns counts and paths.
    """
    rng = random.Random(seed)
    nodes, blocks = hdfs_nodes_and_blocks(rng, n_blocks)
    n_anom = round(n_blocks * anomaly_rate)
    anomalous = dict.fromkeys(rng.sample(range(n_blocks), n_anom))
    kinds = {i: rng.choice(ANOMALY_KINDS) for i in anomalous}

    events = []
    t0 = _HDFS_START
    for i, blk in enumerate(blocks):
        t0 += dt.timedelta(seconds=rng.randint(0, 12))
        events.extend(_block_events(rng, blk, t0, nodes, kinds.get(i)))
    n_other = max(1, len(events) // 50)
    span = (max(e[0] for e in events) - _HDFS_START).total_seconds()
    for _ in range(n_other):
        events.append(_no_block_event(rng, _HDFS_START + dt.timedelta(seconds=rng.randint(0, int(span))), nodes))
    events.sort(key=lambda e: e[0])  # stable: same-second lines keep their causal order

    log_path, labels_path = Path(log_path), Path(labels_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    labels_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w", encoding="utf-8") as fh:
        for t, level, comp, content, pid in events:
            fh.write(_hdfs_line(t, pid, level, comp, content) + "\n")
    with labels_path.open("w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["BlockId", "Label"])
        for i, blk in enumerate(blocks):
            w.writerow([blk, "Anomaly" if i in anomalous else "Normal"])

    kind_counts = {k: sum(1 for v in kinds.values() if v == k) for k in ANOMALY_KINDS}
    logger.info("wrote %d HDFS lines for %d blocks (%d anomalous) to %s", len(events), n_blocks, n_anom, log_path)
    return {
        "log_path": str(log_path),
        "labels_path": str(labels_path),
        "lines": len(events),
        "blocks": n_blocks,
        "anomalies": n_anom,
        "anomaly_kinds": kind_counts,
        "no_block_lines": n_other,
    }


# ----------------------------------------------------------------------------- sessions

SESSION_LABELS = ("none", "upgrade", "help_chat")
_LABEL_WEIGHTS = (0.6, 0.2, 0.2)
_EVENT_TYPES = (
    "page_view",
    "search",
    "api_call",
    "service_create",
    "service_delete",
    "error",
    "billing_view",
    "docs_view",
    "login",
)
# Event-type mix per class: only slightly different, so type counts alone are a weak signal.
_TYPE_WEIGHTS = {
    "none": (30, 10, 25, 6, 3, 5, 3, 8, 2),
    "upgrade": (30, 10, 25, 7, 2, 6, 5, 7, 2),
    "help_chat": (28, 12, 24, 6, 3, 7, 3, 10, 2),
}
_PAGES = ("/", "/dashboard", "/services", "/services/new", "/settings", "/account", "/blog", "/pricing", "/status")
_ENDPOINTS = ("/v1/services", "/v1/deployments", "/v1/metrics", "/v1/logs", "/v1/keys")
_ERROR_CODES = ("NOT_FOUND", "INVALID_ARGUMENT", "TIMEOUT", "RATE_LIMITED", "QUOTA_EXCEEDED", "INTERNAL")
_QUERIES = {
    "how": (
        "how to deploy a container",
        "how to rotate api keys",
        "how to fix 502 bad gateway",
        "how to roll back a deployment",
        "how to connect a database",
    ),
    "limit": ("increase service limit", "pricing pro plan", "quota per project", "team plan features"),
    "plain": ("logs", "metrics dashboard", "python sdk", "webhooks", "custom domain", "ssl certificate"),
}
_DOCS = ("/docs/quickstart", "/docs/cli", "/docs/troubleshooting", "/docs/limits", "/docs/api", "/docs/billing")


def _payload(rng: random.Random, etype: str, c: str, state: dict) -> dict:
    """Payload of one event. ``c`` is the class whose *value* habits the event follows."""
    up, hc = c == "upgrade", c == "help_chat"
    if etype == "page_view":
        w = [10, 14, 10, 5, 4, 4, 3, 12 if up else 3, 6 if hc else 2]
        return {
            "page": rng.choices(_PAGES, w)[0],
            "referrer": rng.choice(("direct", "google", "email", "docs")),
            "items": rng.sample(["nav", "banner", "footer", "sidebar", "card"], rng.randint(0, 3)),
        }
    if etype == "search":
        kind = rng.choices(("how", "limit", "plain"), (6 if hc else 1.5, 3 if up else 1, 4))[0]
        return {"query": rng.choice(_QUERIES[kind]), "results": rng.randint(0, 40)}
    if etype == "api_call":
        bad = rng.random() < (0.22 if hc else 0.04)
        status = (
            rng.choice((500, 502, 503))
            if bad
            else rng.choices((200, 201, 204, 400, 404, 429), (60, 10, 5, 4, 4, 4 if up else 1))[0]
        )
        return {
            "endpoint": rng.choice(_ENDPOINTS),
            "method": rng.choice(("GET", "GET", "POST", "PUT", "DELETE")),
            "http_status": status,
            "latency_ms": int(rng.lognormvariate(5.3 if bad else 4.5, 0.6)),
        }
    if etype in ("service_create", "service_delete"):
        if etype == "service_create":
            state["services"] += 1
        ok = rng.random() > (0.3 if hc else 0.06)
        return {
            "service_id": f"svc-{rng.randint(0, 99999):05d}",
            "action": etype.split("_")[1],
            "status": "ok" if ok else "failed",
            "tier": rng.choice(("small", "medium", "large")),
            "tags": rng.sample(["web", "db", "cache", "worker", "cron"], rng.randint(0, 2)),
        }
    if etype == "error":
        w = [(4, 4, 2, 2, 1, 1), (2, 2, 1, 3, 8, 1), (2, 2, 4, 1, 1, 5)][SESSION_LABELS.index(c)]
        return {
            "error_code": rng.choices(_ERROR_CODES, w)[0],
            "retryable": rng.random() < 0.4,
            "message": None if rng.random() < 0.5 else "request failed",
        }
    if etype == "billing_view":
        usage = min(100.0, max(0.0, rng.gauss(84 if up else 48, 10 if up else 22)))
        return {"usage_pct": round(usage, 1), "invoice_due": rng.random() < 0.1, "services": state["services"]}
    if etype == "docs_view":
        w = [3, 2, 6 if hc else 1.5, 4 if up else 1, 3, 2]
        return {"page": rng.choices(_DOCS, w)[0], "seconds_on_page": rng.randint(3, 400)}
    return {"method": rng.choice(("password", "sso", "github")), "mfa": rng.random() < 0.5}


def write_events_and_labels(rows: list[tuple], labels: dict[str, str], events_path, labels_path) -> None:
    """Events ``(ts, order, event dict)`` as JSON Lines in time order (stable: ties keep their
    generation order) and ``session_id,label`` rows as CSV."""
    rows = sorted(rows, key=lambda r: (r[0], r[1]))
    events_path, labels_path = Path(events_path), Path(labels_path)
    for path in (events_path, labels_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    with events_path.open("w", encoding="utf-8") as fh:
        for _, _, ev in rows:
            fh.write(json.dumps(ev, separators=(",", ":")) + "\n")
    with labels_path.open("w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["session_id", "label"])
        w.writerows(labels.items())


def generate_session_events(events_path, labels_path, n_sessions: int = 1500, seed: int = 0) -> dict:
    """Write JSON Lines session events and a ``session_id,label`` CSV.

    Each session is an observed prefix of 20–80 events; the label (about 60 % ``none``,
    20 % ``upgrade``, 20 % ``help_chat``) is what happens next. Noise: each event follows the
    value habits of another class with probability 0.3, and 5 % of labels are flipped.
    Lines of different sessions interleave in time order. Returns counts and paths.
    """
    rng = random.Random(seed)
    start = dt.datetime(2026, 11, 1, 8, 0, 0)
    rows: list[tuple[dt.datetime, int, dict]] = []
    labels: dict[str, str] = {}
    for s in range(n_sessions):
        sid = f"s{s:06d}"
        label = rng.choices(SESSION_LABELS, _LABEL_WEIGHTS)[0]
        free_p = 0.75 if label == "upgrade" else 0.5
        user = {
            "plan": "free" if rng.random() < free_p else rng.choice(("pro", "pro", "team")),
            "region": rng.choice(("eu-west", "us-east", "us-west", "ap-south")),
            "tenure_days": int(rng.expovariate(1 / 120)),
        }
        t = start + dt.timedelta(seconds=rng.uniform(0, 12 * 3600))
        state = {"services": rng.randint(0, 5)}
        n = rng.randint(20, 80)
        for k in range(n):
            habit = label if rng.random() > 0.3 else rng.choice(SESSION_LABELS)
            etype = "login" if k == 0 else rng.choices(_EVENT_TYPES, _TYPE_WEIGHTS[label])[0]
            ev = {
                "session_id": sid,
                "ts": t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z",
                "event_type": etype,
                "user": user,
                "payload": _payload(rng, etype, habit, state),
            }
            rows.append((t, len(rows), ev))
            t += dt.timedelta(seconds=rng.expovariate(1 / 20))
        labels[sid] = rng.choice(SESSION_LABELS) if rng.random() < 0.05 else label
    write_events_and_labels(rows, labels, events_path, labels_path)
    counts = {lab: sum(1 for v in labels.values() if v == lab) for lab in SESSION_LABELS}
    logger.info("wrote %d events of %d sessions to %s", len(rows), n_sessions, events_path)
    return {
        "events_path": str(events_path),
        "labels_path": str(labels_path),
        "events": len(rows),
        "sessions": n_sessions,
        "labels": counts,
    }
