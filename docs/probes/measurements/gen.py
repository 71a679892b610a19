"""Probe (docs/training.md, "Measurements are not ids"): two made-up streams whose anomalies live
in values, as JSON events with a label file (the labels only measure). Usage:

    python gen.py checkout|jobs DAY N SEED   -> STREAM-DAY.jsonl, STREAM-DAY.csv

* checkout: sessions open / view / cart / pay / close, a request id per event; a fraudulent one
  (8 %) pays 900-1,500 at every step where others pay 5-400 (with cents);
* jobs: submit / start / finish with a queue, a worker and a numeric job_id; a stuck job (6 %)
  takes 20-90 times its queue's usual duration_ms and 2-5 attempts (1 otherwise).
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
