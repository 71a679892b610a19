"""Probe (2026-12-07, docs/training.md "Magnitude gaps"): a third made-up stream, written after
the gap cuts were fixed and before any run on it, to check the binary default on anomalies
nothing was chosen on.

``make``: three days of device-hours of a sensor fleet as JSON events (``d1.jsonl`` 900, ``d2.jsonl``
500, ``d3.jsonl`` 400 device-hours; a ``boot`` or not, then 6-12 ``reading`` events with
``temp_c`` 17.0-27.0, ``humidity`` 30-65, ``battery_mv`` 3500-4200 and ``rssi`` -95 to -40)
with labels (``l1.csv`` ...): ``fault`` for three kinds, each about 3 %, else ``ok``:

- **unit error**: 1-3 readings report ``temp_c`` in kelvin (290.0-300.0);
- **brown-out**: the last 2-4 readings' ``battery_mv`` fall to 2000-3000;
- **reboot loop**: 4-8 ``boot`` events among the readings (counts see it).

``measure ROOT=PREDICTIONS ...``: as docs/probes/checkout_stream.py (kinds in ``k1.csv`` ...).

    python docs/probes/sensor_stream.py make DIR
    python docs/probes/sensor_stream.py measure DIR "binary, defaults=work/predictions/faults" ...
"""
import random
import sys
from datetime import timedelta
from pathlib import Path

DAYS = [(900, "2026-07-01"), (500, "2026-07-02"), (400, "2026-07-03")]
KINDS = ["ok", "unit", "brownout", "reboots"]


def device_hour(rnd: random.Random, kind: str) -> list[dict]:
    """One device-hour's events: a boot or not, 6-12 readings (and a fault's kind)."""
    n_read = rnd.randint(6, 12)
    rows = [{"event": "boot", "fw": rnd.choice(["1.4.2", "1.4.3"])}] if rnd.random() < 0.2 else []
    kelvin = set(rnd.sample(range(n_read), rnd.randint(1, 3))) if kind == "unit" else set()
    low = n_read - rnd.randint(2, 4) if kind == "brownout" else n_read
    battery = rnd.uniform(3500, 4200)
    for r in range(n_read):
        battery -= rnd.uniform(0, 8)
        temp = rnd.uniform(290.0, 300.0) if r in kelvin else rnd.uniform(17.0, 27.0)
        mv = rnd.uniform(2000, 3000) if r >= low else battery
        rows.append({"event": "reading", "temp_c": f"{temp:.1f}", "humidity": rnd.randint(30, 65),
                     "battery_mv": int(mv), "rssi": rnd.randint(-95, -40)})
        if kind == "reboots" and r % 2 == 1 and sum(x["event"] == "boot" for x in rows) < 8:
            rows.append({"event": "boot", "fw": rnd.choice(["1.4.2", "1.4.3"])})
    return rows


STREAM = {"id_field": "device_hour", "label_field": "state", "kinds": KINDS, "positive": "fault", "prefix": "dev",
          "day_seconds": 82000, "step": lambda rnd: timedelta(seconds=rnd.randint(240, 360)), "session": device_hour}


if __name__ == "__main__":
    from checkout_stream import make, measure  # one writer and one measure (docs/probes, run as a script)

    command, where = sys.argv[1], Path(sys.argv[2])
    if command == "make":
        make(where, DAYS, 300, **STREAM)
    else:
        measure(where, dict(arg.split("=", 1) for arg in sys.argv[3:]), DAYS, KINDS, "device_hour", "fault")
