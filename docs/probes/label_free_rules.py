"""Probe (2026-12-06, docs/training.md "A label-free rule for tight score blocks"): which rule on
the score distribution flags a sensible share without labels? The rule of
``training.engine.unlabelled.label_free_threshold`` (median + 3.5 MAD) flagged 29-37 % of two
new streams, because most of a stream's scores sit in a tight block and the MAD is its width.

Two steps, run from the repository root (the data: ../shared/data):

    # 1. train the bench's unlabelled rows (training.bench.accuracy's settings) and save every
    #    sequence's P(anomaly): under the bench's policy, and rescored under the ``anomaly``
    #    kind's default policy (contamination 0.05), into OUT/<dataset>-<mode>-<seed>.npz
    python docs/probes/label_free_rules.py dump bgl unlabelled 0,1,2 W OUT
    python docs/probes/label_free_rules.py dump hdfs unlabelled+normal 0,1,2 W OUT '{"model": {"value_end": true}}'
    # 2. every candidate rule: dev F1 and the share flagged, its cut set (a) on the reference
    #    sequences (the bench's label-free row) and (b) on the dev window itself (how `seqenc score`
    #    sets it on a scored day), per row and on the mean over the rows; PREDICTIONS: optional
    #    `seqenc score` outputs (parquet) whose flagged share is printed too
    python docs/probes/label_free_rules.py rules OUT [PREDICTIONS ...]
    # 3. the +normal rows only (a clean reference): the rule against quantiles of the reference
    python docs/probes/label_free_rules.py clean OUT
    # 4. (2026-12-07) the all-train rows of OUT together with made-up streams (folders of
    #    docs/probes/measurements/run.sh, STREAM-TAG, in the folder of gen.py's files): per rule,
    #    F1 and share on each stream's day 2 (cut on the day, as `seqenc score` cuts it, and on
    #    the bundle's reference scores) and on the bench's dev, and the mean over every row
    python docs/probes/label_free_rules.py streams OUT STREAMS_DIR jobs-new checkout-new ...
    #    report seeds: SPLIT=test reads the bench rows' test split (cut on the reference and on test)
"""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
from sklearn.metrics import f1_score

from seqenc.surprise import probability_score
from training.bench import accuracy as A

sys.path.insert(0, str(Path(__file__).parent))
from unlabelled_count_mix import bench_inputs  # noqa: E402  (the bench's dataset, windows and trainer)


def dump(name: str, mode: str, seeds: list[int], work: Path, out: Path, config: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        t0 = time.time()
        ds, data, y, splits, trainer = bench_inputs(name, seed, work, config)
        given = dict(splits)
        if mode == "unlabelled+normal":  # as training.bench.accuracy._train_unlabelled gives it
            given["train"] = splits["train"][y[splits["train"]] == 0]
            given["reference"] = splits["dev"][y[splits["dev"]] == 0]
            given["vocabulary"] = splits["train"]
        t = trainer(given, work / f"seed-{seed}" / mode)
        t.threshold_policy = A._threshold_policy(mode, name, config)
        final = t.fit()
        default, _ = t.rescore({"policy": "contamination", "share": 0.05})  # the anomaly kind's default
        np.savez_compressed(out / f"{name}-{mode}-{seed}.npz", bench=final["probs"][:, 1], default=default[:, 1],
                            y=y, reference=t.reference, **splits)
        print(name, mode, seed, t.threshold_policy, final["test"].get("f1"), round(time.time() - t0), flush=True)


def spread_mad(x: np.ndarray) -> tuple[float, float]:
    median = float(np.median(x))
    return median, float(np.median(np.abs(x - median))) / 0.6745


def mad_alone(x):  # the rule before: the MAD, a mean-absolute-deviation fallback when it is 0
    median, s = spread_mad(x)
    s = s or 1.253314 * float(np.mean(np.abs(x - median)))
    return median + 3.5 * s if s > 0 else np.nextafter(x.max(), np.inf)


def above_block(x):  # the MAD of the scores above the median when the MAD is 0
    median, s = spread_mad(x)
    if s > 0:
        return median + 3.5 * s
    above = x[x > median]
    if len(above) < 2:
        return np.nextafter(x.max(), np.inf)
    m2, s2 = spread_mad(above)
    return m2 + 3.5 * s2 if s2 > 0 else np.nextafter(m2, np.inf)


def upper_deviations(x):  # the median of the upward deviations when the MAD is 0
    median, s = spread_mad(x)
    up = x[x > median] - median
    if s == 0 and len(up) == 0:
        return np.nextafter(x.max(), np.inf)
    return median + 3.5 * (s if s > 0 else float(np.median(up)) / 0.6745)


def tukey_far(x):  # Tukey's far-out fence, q3 + 3 IQR (on the scores above a tie block)
    median, s = spread_mad(x)
    part = x if s > 0 else x[x > median]
    if len(part) < 4:
        return np.nextafter(x.max(), np.inf)
    q1, q3 = np.quantile(part, [0.25, 0.75])
    return q3 + 3 * (q3 - q1)


def floored(floor: float):  # the MAD, never below ``floor`` nats (the rule adopted, at 1.5)
    def rule(x):
        median, s = spread_mad(x)
        return median + 3.5 * max(s, floor)
    return rule


def clamped(floor: float, z: float = 3.5):  # as ``floored``, on the scores clamped at 0 (-log of a tail probability is >= 0)
    def rule(x):
        median, s = spread_mad(np.maximum(x, 0.0))
        return max(median + z * max(s, floor), 0.0)
    return rule


STREAM_RULES = {**{f"floor {f}": clamped(f) for f in (0.5, 0.713, 1.0, 1.25, 1.5, 2.0)},
                **{f"z 3.0, floor {f}": clamped(f, z=3.0) for f in (1.0, 1.5)}}


def judged(rule, scores: np.ndarray, y: np.ndarray, reference: np.ndarray) -> tuple:
    """(F1, share flagged) of ``scores`` with the rule's cut set on ``reference``, then the same with
    the cut set on ``scores`` themselves (a scored day, as `seqenc score` sets it)."""
    by_ref, by_day = scores > rule(reference), scores > rule(scores)
    return f1_score(y, by_ref), by_ref.mean(), f1_score(y, by_day), by_day.mean()

RULES = {"MAD alone (before)": mad_alone, "MAD above the block": above_block, "upper deviations": upper_deviations,
         "Tukey far-out": tukey_far, **{f"MAD, floor {f}": floored(f) for f in (0.5, 0.713, 1.0, 1.5, 2.0, 3.0)},
         **{f"clamped at 0, floor {f}": clamped(f) for f in (1.0, 1.5, 2.0)}}


def rules(out: Path, predictions: list[str]) -> None:
    rows: dict[tuple, list] = {}
    for f in sorted(out.glob("*.npz")):
        z, tag = np.load(f), f.stem.rsplit("-", 1)[0]
        for policy in ("bench", "default"):
            s, y, dev = probability_score(z[policy]), z["y"], z["dev"]
            for name, rule in RULES.items():
                rows.setdefault((tag, policy, name), []).append(judged(rule, s[dev], y[dev], s[z["reference"]]))
    print(f"{'row (mean over seeds)':60s} {'F1 ref':>7s} {'share':>6s} {'F1 win':>7s} {'share':>6s}")
    means: dict[str, list] = {}
    for (tag, policy, name), v in rows.items():
        v = np.mean(v, axis=0)
        means.setdefault(name, []).append(v)
        print(f"{tag + ' ' + policy + ' ' + name:60s} {v[0]:7.3f} {v[1]:6.3f} {v[2]:7.3f} {v[3]:6.3f}")
    print("mean over the rows:")
    for name, v in means.items():
        v = np.mean(v, axis=0)
        print(f"  {name:24s} F1 ref {v[0]:.3f} share {v[1]:.3f} | F1 window {v[2]:.3f} share {v[3]:.3f}")
    for path in predictions:  # unlabelled streams: the share each rule flags
        s = probability_score(pl.read_parquet(path)["score"].to_numpy())
        print(path, len(s), " ".join(f"{name}: {np.mean(s > rule(s)):.3f}" for name, rule in RULES.items()))


def clean(out: Path) -> None:
    """The +normal rows (a clean reference: normal dev sequences): the adopted label-free rule
    against quantiles of the reference's scores, dev F1 and share flagged, mean over seeds, under
    the bench's policy ("bench": the scorer a quantile policy fits, no trim) and the default's."""
    from training.engine.unlabelled import label_free_threshold, quantile_cut

    cuts = {"modified z": label_free_threshold, **{f"q {q}": (lambda r, q=q: quantile_cut(r, q))
                                                  for q in (0.95, 0.98, 0.99, 0.995, 0.999)}}
    table: dict[str, list] = {}
    for f in sorted(out.glob("*unlabelled+normal-*.npz")):
        z, tag = np.load(f), f.stem.rsplit("-", 1)[0]
        for policy in ("bench", "default"):
            p, y, dev = z[policy], z["y"], z["dev"]
            table.setdefault(f"{tag} {policy}", []).append(
                [(f1_score(y[dev], p[dev] >= cut(p[z["reference"]])), np.mean(p[dev] >= cut(p[z["reference"]])))
                 for cut in cuts.values()])
    print(f"{'row (mean over seeds): F1 (share)':44s}" + "".join(f"{name:>16s}" for name in cuts))
    for row, v in table.items():
        v = np.mean(v, axis=0)
        print(f"{row:44s}" + "".join(f"{f1:9.3f} ({share:.2f})" for f1, share in v))
    v = np.mean([np.mean(v, axis=0) for v in table.values()], axis=0)
    print(f"{'mean over the rows':44s}" + "".join(f"{f1:9.3f} ({share:.2f})" for f1, share in v))


def streams(out: Path, here: Path, runs: list[str], split: str = "dev") -> None:
    """Step 4: every rule of ``STREAM_RULES`` on the all-train bench rows of ``out`` (dev F1, cut on
    the reference and on the dev split itself; bench and default scorers) and on day 2 of each
    stream run (cut on the bundle's reference scores and on day 2's own scores)."""
    rows: dict[tuple, list] = {}
    for f in sorted(out.glob("*-unlabelled-*.npz")):
        z, tag = np.load(f), f.stem.rsplit("-", 1)[0]
        for policy in ("bench", "default"):
            s, y, dev = probability_score(z[policy]), z["y"], z[split]
            for name, rule in STREAM_RULES.items():
                rows.setdefault((f"{tag} {policy}", name), []).append(judged(rule, s[dev], y[dev], s[z["reference"]]))
    for run in runs:
        stream = run.split("-")[0]
        p = pl.read_parquet(here / run / "pred/date=2026-05-02/part-0.parquet").join(
            pl.read_csv(here / f"{stream}-2026-05-02.csv").rename({"session": "sequence_id"}), on="sequence_id")
        meta = json.loads((here / run / "work/models/watch/bundle/metadata.json").read_text())
        s, y = probability_score(p["score"].to_numpy()), (p["verdict"] == "bad").to_numpy()
        ref = probability_score(np.asarray(meta["reference_scores"]))
        for name, rule in STREAM_RULES.items():
            rows.setdefault((run, name), []).append(judged(rule, s, y, ref))
    print(f"{'row (mean over seeds)':44s} {'rule':16s} {'F1 ref':>7s} {'share':>6s} {'F1 day':>7s} {'share':>6s}")
    means: dict[str, list] = {}
    for (tag, name), v in rows.items():
        v = np.mean(v, axis=0)
        means.setdefault(name, []).append(v)
        print(f"{tag:44s} {name:16s} {v[0]:7.3f} {v[1]:6.3f} {v[2]:7.3f} {v[3]:6.3f}")
    print(f"mean over the {len(next(iter(means.values())))} rows:")
    for name, v in means.items():
        v = np.mean(v, axis=0)
        print(f"  {name:16s} F1 ref {v[0]:.3f} share {v[1]:.3f} | F1 day {v[2]:.3f} share {v[3]:.3f}")


if __name__ == "__main__":
    if sys.argv[1] == "streams":
        streams(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:], os.environ.get("SPLIT", "dev"))
    elif sys.argv[1] == "clean":
        clean(Path(sys.argv[2]))
    elif sys.argv[1] == "dump":
        dump(sys.argv[2], sys.argv[3], [int(s) for s in sys.argv[4].split(",")], Path(sys.argv[5]), Path(sys.argv[6]),
             json.loads(sys.argv[7]) if len(sys.argv) > 7 else {})
    else:
        rules(Path(sys.argv[2]), sys.argv[3:])
