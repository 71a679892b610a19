"""``seqenc bench score``: CPU batch-scoring throughput of a TVM-KA bundle, next to one-at-a-time scoring.

Data: ``parsers.synthetic.generate_hdfs_logs`` -> the real ingest (``parsers.log_ingest.ingest_logs``,
preset hdfs) -> ``parsers.storage.read_objects``: one sequence per HDFS block. The first
``sequences`` block ids (sorted) are scored.

Model: a TVM-KA of the given size (default d_model 256, 4 layers, 8 heads of which 4 shared,
d_ff 1024, 128-token TVM window), **random init** (throughput does not depend on the weights),
a WordPiece vocabulary trained on the generated keys and values, saved with
``training.scoring.save_bundle`` with the anomaly task's metadata (``exclude_keys``,
``event_key``) -- so scoring sees exactly what a trained anomaly bundle would see.

Two sides, same process, same run, same bundle directory (the machine may be shared and noisy):

* **batched** (the product path): ``load_bundle`` (timed apart, ``load_seconds``), then one
  ``training.scoring.score_objects`` call over all the sequences' objects: S(k) of every key of
  every sequence tokenised, all windows sorted by length and packed into TVM batches
  (``seqenc.inference``), KRs pooled per key, the KA over batches of sequences. ``seconds``
  covers the whole call (value sequences, tokenisation, TVM, KA, the predictions frame).
* **baseline**: the same sequences' first ``baseline_sequences``, scored one sequence at a time
  (a loop of ``score_objects`` calls on one sequence's objects each; the objects are split by
  sequence before its clock starts). Its own sequences / seconds / sequences_per_s, nothing
  extrapolated.

Each side loads its own bundle (a fresh tokenizer cache each), and one throw-away sequence is
scored first so that neither side pays torch's first-call set-up. ``speedup`` = batched
sequences_per_s / baseline sequences_per_s. ``max_abs_score_diff`` compares the two sides'
scores on the baseline's sequences (batching must change speed, not results); both prediction
frames are kept in the work folder (``predictions_batched.parquet``, ``predictions_baseline.parquet``).

Threads: ``threads`` 0 keeps torch's default (one per core). On a machine where other jobs hold
the cores, torch's worker threads wait on each other at every op; the many small ops of
one-at-a-time scoring suffer far more from that than the large batched ones, so the speedup
grows with the load (``load_average_1m`` records it; ``--threads 1`` avoids the effect).

OUT: ``{"sequences", "seconds", "sequences_per_s", "baseline": {...}, "speedup", ...}`` and a
Markdown table beside it (``.md``).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch
from tqdm.auto import tqdm

from parsers.resources import peak_rss_mb

log = logging.getLogger(__name__)


@dataclass
class ScoreBenchSettings:
    sequences: int = 1000  # HDFS blocks generated and scored
    baseline_sequences: int = 100  # of those, scored one at a time
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_shared_heads: int = 4
    d_ff: int = 1024
    max_positions: int = 128  # TVM window, tokens
    vocab_size: int = 4096  # WordPiece vocabulary trained on the generated data
    anomaly_rate: float = 0.04
    threads: int = 0  # torch threads; 0 = torch's default
    seed: int = 0


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def prepare(s: ScoreBenchSettings, workdir: Path) -> tuple[pl.DataFrame, Path, dict]:
    """Generate, ingest, build the random-init bundle: -> (objects of the scored sequences,
    bundle directory, data stats)."""
    from parsers import storage, synthetic
    from parsers.log_ingest import ingest_logs
    from seqenc.catalog import DEFAULT_CATALOG, load_catalog
    from seqenc.config import TVMKAConfig
    from seqenc.model import TVMKA
    from training.scoring import save_bundle
    from training.task_data import value_sequences, vocab_and_windows

    # the shipped catalogue's log task over HDFS-like lines: what the generator writes
    catalog = load_catalog(DEFAULT_CATALOG)
    name, spec = next((n, t) for n, t in catalog.tasks.items()
                      if catalog.sources[t.source].demo_generator == "hdfs_logs")
    classes = spec.ordered_classes([])
    raw, root = workdir / "raw", workdir / "data"
    for stale in (raw, root):
        shutil.rmtree(stale, ignore_errors=True)
    t0 = time.perf_counter()
    generated = synthetic.generate_hdfs_logs(raw / "hdfs.log", raw / "hdfs_labels.csv", n_blocks=s.sequences,
                                             anomaly_rate=s.anomaly_rate, seed=s.seed)
    ingest_logs(raw / "hdfs.log", root, source=spec.source, preset=catalog.sources[spec.source].preset,
                ingest_date="2000-01-01")
    objects = storage.read_objects(root, spec.source)
    ids = sorted(objects["sequence_id"].unique().to_list())[: s.sequences]
    objects = objects.filter(pl.col("sequence_id").is_in(ids))
    log.info("generated and ingested %d lines, %d sequences in %.1f s", generated["lines"], len(ids),
             time.perf_counter() - t0)

    value_seqs = value_sequences(objects, spec)
    # the vocabulary and windows the way training builds them (every generated sequence is "train")
    tok, data = vocab_and_windows(value_seqs, pl.Series(ids), {"vocab_size": s.vocab_size,
                                                                "max_positions": s.max_positions})
    torch.manual_seed(s.seed)
    config = TVMKAConfig(vocab_size=tok.vocab_size, pad_token_id=tok.pad_id, max_positions=s.max_positions,
                         d_model=s.d_model, n_layers=s.n_layers, n_heads=s.n_heads, n_shared_heads=s.n_shared_heads,
                         d_ff=s.d_ff, task=spec.model_task, n_classes=len(classes), class_names=classes)
    metadata = {"task_name": name, "source": spec.source, "threshold": 0.5, "mode": "random_init",
                "exclude_keys": list(spec.exclude_keys), "event_key": spec.event_key}
    bundle = save_bundle(TVMKA(config), tok, metadata, workdir / "bundle")
    stats = {"lines": generated["lines"], "objects": objects.select("sequence_id", "step").unique().height,
             "rows": objects.height, **{k: data.stats[k] for k in ("keys", "windows", "tokens", "values")},
             "vocab_size": tok.vocab_size}
    return objects, bundle, stats


def run_batched(bundle_dir: Path, objects: pl.DataFrame, progress: bool) -> dict:
    from training.scoring import load_bundle, score_objects

    t0 = time.perf_counter()
    bundle = load_bundle(bundle_dir)
    load_seconds = time.perf_counter() - t0
    rss_before = _rss_mb()
    t0 = time.perf_counter()
    predictions = score_objects(bundle, objects, progress=progress)
    seconds = time.perf_counter() - t0
    return {"predictions": predictions, "seconds": seconds, "load_seconds": load_seconds,
            "rss_before_mb": rss_before}


def run_one_at_a_time(bundle_dir: Path, objects: pl.DataFrame, ids: list[str], progress: bool) -> dict:
    from training.scoring import load_bundle, score_objects

    bundle = load_bundle(bundle_dir)
    parts = objects.filter(pl.col("sequence_id").is_in(ids)).partition_by("sequence_id", as_dict=True)
    parts = [parts[(i,)] for i in ids]
    frames = []
    with _quiet("seqenc.sequences"):  # its per-call INFO line would print once per sequence
        t0 = time.perf_counter()
        for part in tqdm(parts, desc="baseline: one sequence at a time", disable=not progress, leave=False):
            frames.append(score_objects(bundle, part, progress=False))
        seconds = time.perf_counter() - t0
    return {"predictions": pl.concat(frames) if frames else None, "seconds": seconds}


@contextmanager
def _quiet(name: str):
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(max(logging.WARNING, logger.getEffectiveLevel()))
    try:
        yield
    finally:
        logger.setLevel(level)


def _warm_up(bundle_dir: Path, objects: pl.DataFrame) -> None:
    """Score one sequence with a throw-away bundle, so neither timed side pays torch's first-call
    set-up (thread pool, kernels); each side then loads its own bundle (a cold tokenizer cache)."""
    from training.scoring import score_objects

    if objects.height:
        score_objects(bundle_dir, objects.filter(pl.col("sequence_id") == objects["sequence_id"][0]), progress=False)


def bench_score(s: ScoreBenchSettings, workdir: str | Path, progress: bool = True) -> dict:
    """The whole benchmark; writes the prediction frames into ``workdir`` and returns OUT's dict.
    torch's thread count is set for the run (``threads``) and restored after."""
    threads = torch.get_num_threads()
    if s.threads:
        torch.set_num_threads(s.threads)
    try:
        return _bench_score(s, Path(workdir), progress)
    finally:
        torch.set_num_threads(threads)


def _bench_score(s: ScoreBenchSettings, workdir: Path, progress: bool) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    objects, bundle_dir, stats = prepare(s, workdir)
    ids = sorted(objects["sequence_id"].unique().to_list())
    base_ids = ids[: s.baseline_sequences]
    _warm_up(bundle_dir, objects)

    load_start = os.getloadavg()
    log.info("baseline: scoring %d sequences one at a time", len(base_ids))
    base = run_one_at_a_time(bundle_dir, objects, base_ids, progress)
    log.info("batched: scoring %d sequences in one call", len(ids))
    batched = run_batched(bundle_dir, objects, progress)
    peak = peak_rss_mb()

    pred = batched["predictions"]
    pred.write_parquet(workdir / "predictions_batched.parquet")
    n = pred.height
    result = {
        "sequences": n,
        "seconds": round(batched["seconds"], 4),
        "sequences_per_s": round(n / batched["seconds"], 3),
        "load_seconds": round(batched["load_seconds"], 3),
    }
    if base["predictions"] is not None:
        base["predictions"].write_parquet(workdir / "predictions_baseline.parquet")
        joined = base["predictions"].join(pred, on="sequence_id", how="left", suffix="_batched")
        diff = float(np.max(np.abs(joined["score"].to_numpy() - joined["score_batched"].to_numpy())))
        bn = base["predictions"].height
        result["baseline"] = {"method": "score_objects on one sequence at a time (same bundle, same sequences)",
                              "sequences": bn, "seconds": round(base["seconds"], 4),
                              "sequences_per_s": round(bn / base["seconds"], 3)}
        result["speedup"] = round((n / batched["seconds"]) / (bn / base["seconds"]), 2)
        result["max_abs_score_diff"] = diff
        result["same_predictions"] = joined["prediction"].to_list() == joined["prediction_batched"].to_list()
    result.update({
        "weights": "random init",
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        # 1-minute load average before the baseline and after the batched run: other jobs on the machine
        "load_average_1m": {"start": round(load_start[0], 2), "end": round(os.getloadavg()[0], 2)},
        "model": {k: getattr(s, k) for k in ("d_model", "n_layers", "n_heads", "n_shared_heads", "d_ff",
                                             "max_positions")},
        "data": stats,
        "peak_rss_mb": round(peak, 1),
        "rss_before_batched_mb": round(batched["rss_before_mb"], 1),
        "settings": asdict(s),
        "workdir": str(workdir),
    })
    log.info("batched %d sequences in %.2f s (%.1f/s); baseline %s", n, batched["seconds"], n / batched["seconds"],
             result.get("baseline"))
    return result


def score_table(r: dict) -> str:
    m, b = r["model"], r.get("baseline")
    model = f"d{m['d_model']} L{m['n_layers']} h{m['n_heads']} p{m['n_shared_heads']} w{m['max_positions']}"
    head = ("| model | threads | sequences | windows | tokens | seconds | sequences/s | baseline sequences | "
            "baseline seconds | baseline sequences/s | speedup | max score diff | peak RSS MB |")
    if b is None:
        cells = ["-"] * 5
    else:
        cells = [str(b["sequences"]), f"{b['seconds']:.2f}", f"{b['sequences_per_s']:.1f}", f"{r['speedup']:.2f}",
                 f"{r['max_abs_score_diff']:.1e}"]
    return "\n".join([
        head,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {model} | {r['torch_threads']} | {r['sequences']} | {r['data']['windows']} | {r['data']['tokens']} | "
        f"{r['seconds']:.2f} | {r['sequences_per_s']:.1f} | " + " | ".join(cells) + f" | {r['peak_rss_mb']:.0f} |",
    ])
