"""A user's own data for the bring-your-own-data tests: names, fields and classes that appear
nowhere in the code (order events keyed by ``order.id`` with time field ``at``, a 4-class label
column, a binary label with positive class ``fraud``, and audit logs in a format of the user's
own), each with a real signal for a model to learn (seeded)."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

# a 4-class label with arbitrary names, one with the characters MLflow metric names refuse
STAGES = ("kumquat", "zebu", "quokka", "yak & co's, ltd")
LOG_FORMATS = {"formats": {"vaultlog": {
    "header": "<Date> <Time> <Level> <Component>: <Content>", "ts_fields": ["Date", "Time"],
    "ts_format": "%Y-%m-%d %H:%M:%S", "id_pattern": r"(sess-\d+)"}}}


def write_orders(folder: Path, n_orders: int = 160, seed: int = 0, day: str = "2025-03-01") -> dict:
    """``orders.jsonl`` (events), ``stage.csv`` (order_ref, stage) and ``risk.csv`` (order_ref,
    risk: fraud / legit). The stage follows the actions, fraud follows the country."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    events, stages, risks = [], [], []
    for i in range(n_orders):
        oid = f"ord-{seed}-{i:04d}"
        stage = STAGES[i % 4]
        actions = ["view"] * rng.randint(1, 3) + ["cart"]
        actions += {"kumquat": ["pay", "ship", "refund"], "zebu": ["pay", "ship"], "quokka": ["pay"], STAGES[3]: []}[stage]
        fraud = rng.random() < 0.3
        country = "XQ" if fraud else rng.choice(["FR", "DE", "NL", "PT"])
        for j, action in enumerate(actions):
            events.append({"order": {"id": oid, "channel": rng.choice(["web", "app"])},
                           "at": f"{day}T{(i % 20):02d}:{j:02d}:{rng.randint(0, 59):02d}Z", "action": action,
                           "amount": round(rng.uniform(5, 200), 2), "country": country,
                           "request_id": f"rq-{rng.getrandbits(40):010x}"})
        stages.append((oid, stage))
        risks.append((oid, "fraud" if fraud else "legit"))
    (folder / "orders.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    with (folder / "stage.csv").open("w", newline="") as fh:  # csv quotes the class with a comma
        csv.writer(fh).writerows([("order_ref", "stage"), *stages])
    (folder / "risk.csv").write_text("comment,order_ref,risk\n" + "".join(f"x,{a},{b}\n" for a, b in risks))
    return {"events": folder / "orders.jsonl", "stage": folder / "stage.csv", "risk": folder / "risk.csv"}


def write_vault_logs(folder: Path, n_sessions: int = 120, seed: int = 0, day: str = "2025-03-01") -> dict:
    """``vault.log`` in the user's format ``vaultlog`` (``formats.json``) and ``breach.csv``
    (session, verdict: breach / fine; about 10 % breaches: an escalation line no fine session has)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    lines, verdicts = [], []
    for i in range(n_sessions):
        sid = f"sess-{seed}{i:04d}"
        breach = rng.random() < 0.1
        t = f"{day} {(i % 24):02d}:{rng.randint(0, 59):02d}"
        node = rng.randint(1, 4)
        body = [f"INFO gate: session {sid} opened from node-{node}"]
        body += [f"INFO store: session {sid} read secret s-{rng.randint(1, 9)}" for _ in range(rng.randint(1, 3))]
        if breach:
            body.append(f"WARN policy: session {sid} escalation denied for role admin-{rng.randint(1, 3)}")
        body.append(f"INFO gate: session {sid} closed after {rng.randint(1, 90)} s")
        lines += [f"{t}:{k:02d} {b}" for k, b in enumerate(body)]
        verdicts.append((sid, "breach" if breach else "fine"))
    (folder / "vault.log").write_text("\n".join(lines) + "\n")
    (folder / "breach.csv").write_text("session,verdict\n" + "".join(f"{a},{b}\n" for a, b in verdicts))
    formats = folder.parent / "formats.json"
    formats.write_text(json.dumps(LOG_FORMATS))
    return {"logs": folder / "vault.log", "labels": folder / "breach.csv", "formats": formats}


def write_byod(base: Path, n_orders: int = 160, n_sessions: int = 120) -> dict:
    """The orders events and vault logs under ``base/raw`` and their catalogue ``base/seqenc.toml``."""
    orders = write_orders(base / "raw", n_orders=n_orders)
    vault = write_vault_logs(base / "raw", n_sessions=n_sessions)
    catalog = base / "seqenc.toml"
    catalog.write_text(catalogue_text(vault["formats"]))
    return {"orders": orders, "vault": vault, "catalog": catalog}


def catalogue_text(formats: Path, tiny_steps: bool = True) -> str:
    """Sources ``orders`` / ``orders_risk`` (the same events, two label files) and ``vault``
    (logs); tasks ``order_stage`` (4 classes), ``fraud_watch`` (binary, positive ``fraud``) and
    ``vault_watch`` (anomaly without labels; its labels only evaluate)."""
    train = '{tvm_ka_ratio = 0.1, checkpoint_every = 0}' if tiny_steps else "{}"
    return f'''
[sources.orders]
kind = "events"
session_field = "order.id"
ts_field = "at"
label_id_column = "order_ref"
label_column = "stage"

[sources.orders_risk]
kind = "events"
session_field = "order.id"
ts_field = "at"
label_id_column = "order_ref"
label_column = "risk"

[sources.vault]
kind = "logs"
preset = "vaultlog"
formats = "{formats}"
label_id_column = "session"
label_column = "verdict"

[tasks.order_stage]
source = "orders"
kind = "multiclass"
exclude_keys = ["request_id", "at"]
size = "tiny"
config = {{train = {train}}}

[tasks.fraud_watch]
source = "orders_risk"
kind = "binary"
positive = "fraud"
exclude_keys = ["request_id"]
size = "tiny"
config = {{train = {train}}}

[tasks.vault_watch]
source = "vault"
kind = "anomaly"
positive = "breach"
event_key = true
exclude_keys = ["template"]
threshold = {{policy = "contamination", share = 0.1}}
size = "tiny"
config = {{train = {train}}}
'''


def write_app_log(path: Path, n_lines: int = 1200, seed: int = 0) -> Path:
    """An application's log in the ``spark`` preset's format over ~5 hours: block, task and
    executor lines; one 10-minute stretch has a burst of task failures."""
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        second = i * 15 + rng.randint(0, 14)
        stamp = f"25/03/01 {10 + second // 3600:02d}:{(second // 60) % 60:02d}:{second % 60:02d}"
        if 2400 <= second < 3000 and rng.random() < 0.5:
            lines.append(f"{stamp} ERROR executor.Executor: Exception in task {rng.randint(0, 9)}.0 in stage "
                         f"{rng.randint(1, 5)}.0 (TID {rng.randint(1, 999)})")
            continue
        kind = rng.random()
        if kind < 0.5:
            lines.append(f"{stamp} INFO storage.BlockManager: Found block rdd_{rng.randint(1, 9)}_{rng.randint(1, 9)} "
                         "locally")
        elif kind < 0.8:
            lines.append(f"{stamp} INFO executor.Executor: Finished task {rng.randint(0, 9)}.0 in stage "
                         f"{rng.randint(1, 5)}.0 (TID {rng.randint(1, 999)}). {rng.randint(900, 2900)} bytes result "
                         "sent to driver")
        else:
            lines.append(f"{stamp} INFO executor.CoarseGrainedExecutorBackend: Got assigned task {rng.randint(1, 999)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def write_shelves(tables: Path, texts: Path, n_tables: int = 6, seed: int = 0) -> dict:
    """A user's tables and statements about them: ``tables/<shelf>.csv`` (columns item, count)
    and ``texts/claims.jsonl`` (cid, claim, shelf, verdict): "there are N <item> on the shelf",
    ``held`` when the table says N, else ``refuted``."""
    rng = random.Random(seed)
    tables.mkdir(parents=True, exist_ok=True)
    texts.mkdir(parents=True, exist_ok=True)
    items = ["bolts", "nuts", "washers", "rivets", "hinges", "gaskets"]
    claims = []
    for t in range(n_tables):
        name = f"shelf-{t:02d}.csv"
        rows = [(item, rng.randint(1, 9)) for item in rng.sample(items, 4)]
        (tables / name).write_text("item,count\n" + "".join(f"{a},{b}\n" for a, b in rows))
        for k in range(8):
            item, count = rows[k % 4]
            held = k % 2 == 0
            claims.append({"cid": f"c{t}-{k}", "claim": f"there are {count if held else count % 9 + 1} {item}",
                           "shelf": name, "verdict": "held" if held else "refuted"})
    (texts / "claims.jsonl").write_text("".join(json.dumps(c) + "\n" for c in claims))
    return {"tables": sorted(tables.glob("*.csv")), "claims": texts / "claims.jsonl", "n_claims": len(claims)}


def table_catalogue_text(tiny_steps: bool = True) -> str:
    """Sources ``shelves`` (tables) and ``claims`` (texts with labels); task ``claim_check``
    (binary, positive ``refuted``) joining each claim to the table its ``shelf`` field names."""
    train = '{tvm_ka_ratio = 0.1, checkpoint_every = 0}' if tiny_steps else "{}"
    return f'''
[sources.shelves]
kind = "tables"

[sources.claims]
kind = "texts"
text_field = "claim"
id_field = "cid"
label_field = "verdict"

[tasks.claim_check]
source = "claims"
kind = "binary"
positive = "refuted"
table_source = "shelves"
table_key = "shelf"
size = "tiny"
config = {{train = {train}}}
'''
