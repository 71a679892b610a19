"""Probe (docs/training.md, "Measurements are not ids"): two made-up streams whose anomalies live
in values, as JSON events with a label file (the labels only measure). Usage:

    python gen.py checkout|jobs|logins|api|pumps DAY N SEED   -> STREAM-DAY.jsonl, STREAM-DAY.csv

* checkout: sessions open / view / cart / pay / close, a request id per event; a fraudulent one
  (8 %) pays 900-1,500 at every step where others pay 5-400 (with cents);
* jobs: submit / start / finish with a queue, a worker and a numeric job_id; a stuck job (6 %)
  takes 20-90 times its queue's usual duration_ms and 2-5 attempts (1 otherwise);
* logins (added 2026-12-07, docs/training.md "The label-free rule on made-up streams"): open, 0-2
  fails, ok, 2-6 page views, logout, the country fixed per session; a brute force (5 %) fails 6-15
  times, an impossible travel (3 %) changes country mid-session;
* api (added 2026-12-07, read only to report): a client's 4-9 calls (endpoint, status, latency_ms,
  bytes); a degraded client (5 %) waits 8-30 times its endpoint's latency on every call, one in
  four of its calls a 503;
* pumps (added 2026-12-07, read only to report): a pump's 12 readings (temp_c, vibration, rpm);
  an overheating pump (5 %) runs 15-30 degrees hot and shakes 3-6 times harder in its second half.
"""

import json
import random
import sys

kind, day, n, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
events, labels = [], []
for i in range(n):
    sid = f"{day}-{kind[0]}{i:05d}"
    if kind == "checkout":
        bad = rng.random() < 0.08
        for j, action in enumerate(["open", "view", "cart", "pay", "close"]):
            amount = rng.uniform(900, 1500) if bad else rng.uniform(5, 400)
            events.append({"session": sid, "at": f"{day}T{i % 24:02d}:{j:02d}:{rng.randint(0, 59):02d}Z",
                           "action": action, "amount": round(amount, 2), "device": rng.choice(["ios", "android"]),
                           "request_id": f"r{rng.getrandbits(40):010x}"})
    elif kind == "logins":
        r = rng.random()
        bad, brute, travel = r < 0.08, r < 0.05, 0.05 <= r < 0.08
        country, user = rng.choice(["de", "fr", "nl", "se", "pl", "it"]), f"u{rng.randint(1, 300)}"
        steps = ["open"] + ["fail"] * (rng.randint(6, 15) if brute else rng.randint(0, 2)) + ["ok"]
        steps += ["page"] * rng.randint(2, 6) + ["logout"]
        for j, step in enumerate(steps):
            if travel and j == len(steps) // 2:
                country = rng.choice(["br", "au", "jp", "za"])
            events.append({"session": sid, "at": f"{day}T{(i // 60) % 24:02d}:{i % 60:02d}:{j % 60:02d}Z",
                           "step": step, "country": country, "agent": rng.choice(["firefox", "chrome", "safari"]),
                           "user": user})
    elif kind == "api":
        bad = rng.random() < 0.05
        for j in range(rng.randint(4, 9)):
            endpoint = rng.choice(["/orders", "/search", "/cart", "/user"])
            latency = {"/orders": 120, "/search": 60, "/cart": 40, "/user": 25}[endpoint] * rng.uniform(0.5, 1.8)
            status = 200 if rng.random() < 0.97 else rng.choice([404, 400])
            if bad:
                latency *= rng.uniform(8, 30)
                status = 503 if rng.random() < 0.25 else status
            events.append({"session": sid, "at": f"{day}T{(i // 60) % 24:02d}:{i % 60:02d}:{j:02d}Z",
                           "endpoint": endpoint, "status": status, "latency_ms": round(latency, 1),
                           "bytes": rng.randint(200, 9000)})
    elif kind == "pumps":
        bad = rng.random() < 0.05
        for j in range(12):
            hot = bad and j >= 6
            events.append({"session": sid, "at": f"{day}T{(i // 60) % 24:02d}:{i % 60:02d}:{j * 4:02d}Z",
                           "step": "reading", "temp_c": round(rng.gauss(60, 3) + (rng.uniform(15, 30) if hot else 0), 1),
                           "vibration": round(rng.gauss(1.0, 0.15) * (rng.uniform(3, 6) if hot else 1), 3),
                           "rpm": rng.randint(1400, 1600)})
    else:
        bad = rng.random() < 0.06
        queue = rng.choice(["etl", "report", "email", "thumbs"])
        job, worker = rng.getrandbits(31), f"w{rng.randint(1, 8)}"
        base = {"etl": 4000, "report": 1500, "email": 200, "thumbs": 800}[queue]
        for j, step in enumerate(["submit", "start", "finish"]):
            duration = base * rng.uniform(0.6, 1.6) * (rng.uniform(20, 90) if bad else 1.0)
            event = {"session": sid, "at": f"{day}T{(i // 60) % 24:02d}:{i % 60:02d}:{j * 10:02d}Z", "step": step,
                     "queue": queue, "worker": worker, "job_id": job}
            if step == "finish":
                event |= {"duration_ms": int(duration), "attempts": rng.randint(2, 5) if bad else 1, "status": "ok"}
            events.append(event)
    labels.append(f"{sid},{'bad' if bad else 'ok'}")
with open(f"{kind}-{day}.jsonl", "w") as f:
    f.write("".join(json.dumps(e) + "\n" for e in events))
with open(f"{kind}-{day}.csv", "w") as f:
    f.write("session,verdict\n" + "\n".join(labels) + "\n")
print(kind, day, n, sum(row.endswith(",bad") for row in labels), "bad")
