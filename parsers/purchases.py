"""Instacart-like purchase histories for next-item prediction (JSON Lines events + labels).

The TVM-KA paper's third task is next-product prediction on Instacart: a user's previous
purchases, each a structured object (product, aisle, department, day of week, hour, ...), and
the product bought next as the target, "a classification task over a universe of 3212
products" scored by recall@k. The Instacart files cannot be downloaded here, so this generator
writes the same shape of data with a known, learnable structure:

* a catalogue of ``n_products`` products, each in one aisle and one department (aisle =
  product // 5, department = aisle // 4: products of an aisle share a department);
* every user has a *routine*: 3-8 products from one or two favourite departments, bought in a
  fixed cyclic order, plus a usual order day and hour;
* a history is 20-60 purchases: each is the routine's next product (the cursor advances), or
  with probability ``noise`` an impulse buy drawn from a Zipf-like popularity over the whole
  catalogue (the cursor stays);
* the label is the product after the last one: the routine's next product with probability
  0.9, else an impulse buy.

What a model must read: which products a user buys (counts get the routine's members, enough
for a good recall@10) *and* where the user stands in the routine cycle (only the order of the
product values tells the next one, which recall@1 rewards). Lines of different users interleave
in time order. ``seed`` fixes everything.
"""

from __future__ import annotations

import datetime as dt
import logging
import random

from parsers.synthetic import write_events_and_labels

logger = logging.getLogger(__name__)

PRODUCTS_PER_AISLE = 5
AISLES_PER_DEPARTMENT = 4


def product_name(i: int) -> str:
    return f"P{i:04d}"


def catalogue(n_products: int) -> list[str]:
    """Every product id of the catalogue, in order (the label space of the task)."""
    return [product_name(i) for i in range(n_products)]


def generate_purchases(events_path, labels_path, n_users: int = 1500, n_products: int = 200,
                       noise: float = 0.25, seed: int = 0) -> dict:
    """Write ``events_path`` (JSON Lines: session_id = user, ts, event_type, product, aisle,
    department, order_dow, order_hour, add_to_cart_order, reordered) and ``labels_path``
    (``session_id,label`` with the next product). Returns counts and paths."""
    if n_products < 2 * PRODUCTS_PER_AISLE * AISLES_PER_DEPARTMENT:
        raise ValueError(f"n_products must be >= {2 * PRODUCTS_PER_AISLE * AISLES_PER_DEPARTMENT} (two departments)")
    rng = random.Random(seed)
    n_departments = n_products // (PRODUCTS_PER_AISLE * AISLES_PER_DEPARTMENT)
    popularity = [1.0 / (1 + i) ** 0.8 for i in range(n_products)]  # Zipf-like impulse buys
    by_department = {d: [p for p in range(n_products) if p // (PRODUCTS_PER_AISLE * AISLES_PER_DEPARTMENT) == d]
                     for d in range(n_departments)}
    start = dt.datetime(2026, 1, 5, 0, 0, 0)
    rows: list[tuple[dt.datetime, int, dict]] = []
    labels: dict[str, str] = {}
    for u in range(n_users):
        uid = f"u{u:06d}"
        departments = rng.sample(range(n_departments), rng.choice((1, 2)))
        pool = [p for d in departments for p in by_department[d]]
        routine = rng.sample(pool, min(len(pool), rng.randint(3, 8)))
        dow, hour = rng.randrange(7), rng.choice((8, 9, 10, 12, 17, 18, 19, 20))
        cursor, bought = rng.randrange(len(routine)), set()
        t = start + dt.timedelta(days=rng.uniform(0, 14), hours=hour)
        for k in range(rng.randint(20, 60)):
            if rng.random() < noise:
                product = rng.choices(range(n_products), popularity)[0]
            else:
                product, cursor = routine[cursor], (cursor + 1) % len(routine)
            rows.append((t, len(rows), _event(uid, t, product, dow, hour, k, product in bought)))
            bought.add(product)
            t += dt.timedelta(hours=rng.choice((0.01, 0.02, 24 * 7, 24 * 14)))
        target = routine[cursor] if rng.random() < 0.9 else rng.choices(range(n_products), popularity)[0]
        labels[uid] = product_name(target)
    write_events_and_labels(rows, labels, events_path, labels_path)
    logger.info("wrote %d purchases of %d users (%d products) to %s", len(rows), n_users, n_products, events_path)
    return {"events_path": str(events_path), "labels_path": str(labels_path), "events": len(rows),
            "users": n_users, "products": n_products, "distinct_targets": len(set(labels.values()))}


def _event(uid: str, t: dt.datetime, product: int, dow: int, hour: int, k: int, reordered: bool) -> dict:
    aisle = product // PRODUCTS_PER_AISLE
    return {
        "session_id": uid,
        "ts": t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z",
        "event_type": "purchase",
        "product": product_name(product),
        "aisle": f"aisle{aisle:03d}",
        "department": f"dept{aisle // AISLES_PER_DEPARTMENT:02d}",
        "order_dow": dow,
        "order_hour": hour,
        "add_to_cart_order": k % 12 + 1,
        "reordered": int(reordered),
    }
