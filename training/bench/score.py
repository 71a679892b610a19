"""``seqenc bench score``: batch-scoring throughput and memory of a TVM-KA bundle at volume, the
same scores in small chunks, and one-at-a-time scoring as the simplest baseline.

Data: ``parsers.synthetic.generate_hdfs_logs`` (``sequences`` HDFS blocks) -> the real ingest
(``parsers.log_ingest.ingest_logs``, preset hdfs) -> one ingest partition on disk: one
sequence per block.

Model: a TVM-KA of the given size (default d_model 256, 4 layers, 8 heads of which 4 shared,
d_ff 1024, 128-token TVM window), **random init** (throughput does not depend on the weights),
a WordPiece vocabulary trained on the first ``vocab_sequences`` blocks' keys and values, saved
with ``training.serving.scoring.save_bundle`` with the anomaly task's metadata (``exclude_keys``,
``event_key``) -- so scoring sees exactly what a trained anomaly bundle would see.

Three sides, same run, same bundle, each in its own child process (``python -m
training.bench.score``) so that ``peak_rss_mb`` is the side's own (``VmHWM``,
parsers.resources: the process, torch and the model included), not the generator's or the
ingest's:

* **batched** (the product path, ``seqenc score`` and the batch-scoring DAG):
  ``training.serving.batch_score.score_in_chunks`` over the partition, bucketed in one pass into chunks
  of about ``chunk_sequences`` sequences (default 2,000: memory follows the chunk, not the
  partition); within a chunk all windows of all keys are sorted by length and packed into TVM
  batches (``seqenc.inference``). ``seconds`` covers everything after loading the bundle (timed
  apart, ``load_seconds``): reading, value sequences, tokenisation, TVM, KA, the predictions.
* **small_batches**: the same function with ``small_chunk`` sequences a chunk (default 100),
  over every sequence: ``max_abs_score_diff`` / ``same_predictions`` inside ``small_batches``
  compare all the scores -- chunking must change speed and memory, not results.
* **baseline**: the first ``baseline_sequences`` scored one sequence at a time (a loop of
  ``score_objects`` calls; the objects are split by sequence before its clock starts);
  ``speedup`` = batched sequences_per_s / baseline sequences_per_s, and the top-level
  ``max_abs_score_diff`` / ``same_predictions`` compare its scores with the batched ones.

Each side first scores one throw-away sequence so that none pays torch's first-call set-up.

Threads: ``threads`` 0 keeps torch's default (one per core). On a machine where other jobs hold
the cores, torch's worker threads wait on each other at every op; the many small ops of
one-at-a-time scoring suffer far more from that than the large batched ones, so the speedup
grows with the load (``load_average_1m`` records it; ``--threads 1`` avoids the effect).

OUT: ``{"sequences", "seconds", "sequences_per_s", "peak_rss_mb", "chunk_sequences",
"small_batches": {...}, "baseline": {...}, "speedup", ...}``, the prediction frames in the work
folder (``predictions_{batched,small_batches,baseline}.parquet``) and a Markdown table (``.md``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
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
    chunk_sequences: int = 2000  # sequences per chunk on the product path (training.serving.batch_score)
    small_chunk: int = 100  # sequences per chunk of the small-batches side (0: no such side)
    vocab_sequences: int = 2000  # blocks the WordPiece vocabulary is trained on
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


def prepare(s: ScoreBenchSettings, workdir: Path) -> tuple[Path, Path, dict]:
    """Generate, ingest, build the random-init bundle: -> (data root, bundle directory, data stats)."""
    from parsers import storage, synthetic
    from parsers.log_ingest import ingest_logs
    from seqenc.config import TVMKAConfig
    from seqenc.model import TVMKA
    from training.serving.scoring import save_bundle
    from training.tasks.catalog import DEFAULT_CATALOG, load_catalog
    from training.tasks.task_data import value_sequences, vocab_and_windows

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
    scan = storage.scan_objects(root, spec.source)
    ids = scan.select("sequence_id").unique().collect()["sequence_id"].sort()
    log.info("generated and ingested %d lines, %d sequences in %.1f s", generated["lines"], len(ids),
             time.perf_counter() - t0)

    # the vocabulary the way training builds it, on a sample of the sequences
    sample = ids.head(s.vocab_sequences)
    value_seqs = value_sequences(scan.filter(pl.col("sequence_id").is_in(sample.implode())).collect(), spec)
    tok, data = vocab_and_windows(value_seqs, sample, {"vocab_size": s.vocab_size, "max_positions": s.max_positions})
    torch.manual_seed(s.seed)
    config = TVMKAConfig(vocab_size=tok.vocab_size, pad_token_id=tok.pad_id, max_positions=s.max_positions,
                         d_model=s.d_model, n_layers=s.n_layers, n_heads=s.n_heads, n_shared_heads=s.n_shared_heads,
                         d_ff=s.d_ff, task=spec.model_task, n_classes=len(classes), class_names=classes)
    metadata = {"task_name": name, "source": spec.source, "threshold": 0.5, "mode": "random_init",
                "exclude_keys": list(spec.exclude_keys), "event_key": spec.event_key}
    bundle = save_bundle(TVMKA(config), tok, metadata, workdir / "bundle")
    counts = scan.select(pl.len().alias("rows"), pl.struct("sequence_id", "step").n_unique().alias("objects")).collect()
    stats = {"lines": generated["lines"], "sequences": len(ids), "objects": counts["objects"][0],
             "rows": counts["rows"][0], "vocab_size": tok.vocab_size, "vocab_sequences": len(sample),
             **{f"sample_{k}": data.stats[k] for k in ("keys", "windows", "tokens", "values")}}
    return root, bundle, {**stats, "source": spec.source}


def _child(side: str, settings: dict, root: str, source: str, bundle_dir: str, out: str) -> dict:
    """One side in this (child) process: score, write the predictions to ``out``, report."""
    from parsers import storage
    from training.serving.batch_score import score_in_chunks
    from training.serving.scoring import load_bundle, score_objects

    settings = dict(settings)
    progress = settings.pop("progress", False)
    s = ScoreBenchSettings(**settings)
    if s.threads:
        torch.set_num_threads(s.threads)
    scan = storage.scan_objects(root, source)
    first = scan.select(pl.col("sequence_id").min()).collect().item()
    with _quiet("seqenc.sequences"), _quiet("seqenc.inference"):
        score_objects(load_bundle(bundle_dir), scan.filter(pl.col("sequence_id") == first).collect(), progress=False)
    t0 = time.perf_counter()
    bundle = load_bundle(bundle_dir)  # each side its own (a cold tokenizer cache)
    load_seconds = time.perf_counter() - t0
    rss_before = _rss_mb()
    if side == "baseline":
        ids = scan.select("sequence_id").unique().collect()["sequence_id"].sort().head(s.baseline_sequences)
        parts = scan.filter(pl.col("sequence_id").is_in(ids.implode())).collect().partition_by("sequence_id",
                                                                                               as_dict=True)
        parts = [parts[(i,)] for i in ids.to_list()]
        frames = []
        with _quiet("seqenc.sequences"):  # its per-call INFO line would print once per sequence
            t0 = time.perf_counter()
            for part in tqdm(parts, desc="baseline: one sequence at a time", disable=not progress, leave=False):
                frames.append(score_objects(bundle, part, progress=False))
            seconds = time.perf_counter() - t0
        predictions = pl.concat(frames)
    else:
        chunk = s.chunk_sequences if side == "batched" else s.small_chunk
        t0 = time.perf_counter()
        predictions = score_in_chunks(bundle, scan, chunk, progress=progress)
        seconds = time.perf_counter() - t0
    peak = peak_rss_mb()
    predictions.write_parquet(out)
    return {"seconds": seconds, "load_seconds": load_seconds, "rss_before_mb": rss_before, "peak_rss_mb": peak,
            "sequences": predictions.height, "torch_threads": torch.get_num_threads()}


def _run_side(side: str, s: ScoreBenchSettings, root: Path, source: str, bundle: Path, out: Path,
              progress: bool) -> dict:
    settings = json.dumps({**asdict(s), "progress": progress})
    proc = subprocess.run([sys.executable, "-m", "training.bench.score", side, settings, str(root), source,
                           str(bundle), str(out)], stdout=subprocess.PIPE, text=True)
    if proc.returncode:
        raise RuntimeError(f"bench score: the {side} side failed (exit {proc.returncode}); its error is above")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@contextmanager
def _quiet(name: str):
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(max(logging.WARNING, logger.getEffectiveLevel()))
    try:
        yield
    finally:
        logger.setLevel(level)


def _compare(a: pl.DataFrame, b: pl.DataFrame) -> dict:
    """Every sequence of ``a`` against ``b``: the largest score difference, same predictions."""
    joined = a.join(b, on="sequence_id", how="left", suffix="_other")
    if joined["score_other"].null_count():
        raise RuntimeError(f"{joined['score_other'].null_count()} sequences scored on one side only")
    diff = float(np.max(np.abs(joined["score"].to_numpy() - joined["score_other"].to_numpy())))
    return {"max_abs_score_diff": diff,
            "same_predictions": joined["prediction"].to_list() == joined["prediction_other"].to_list()}


def bench_score(s: ScoreBenchSettings, workdir: str | Path, progress: bool = True) -> dict:
    """The whole benchmark; writes the prediction frames into ``workdir`` and returns OUT's dict."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    root, bundle_dir, stats = prepare(s, workdir)
    source = stats.pop("source")
    load_start = os.getloadavg()
    runs, frames = {}, {}
    sides = [("baseline", s.baseline_sequences > 0), ("batched", True), ("small_batches", s.small_chunk > 0)]
    for side, wanted in sides:
        if wanted:
            log.info("bench score: the %s side", side)
            path = workdir / f"predictions_{side}.parquet"
            runs[side] = _run_side(side, s, root, source, bundle_dir, path, progress)
            frames[side] = pl.read_parquet(path)
    batched = runs["batched"]
    n = batched["sequences"]
    result = {
        "sequences": n,
        "seconds": round(batched["seconds"], 4),
        "sequences_per_s": round(n / batched["seconds"], 3),
        "load_seconds": round(batched["load_seconds"], 3),
        "peak_rss_mb": round(batched["peak_rss_mb"], 1),
        "rss_before_batched_mb": round(batched["rss_before_mb"], 1),
        "chunk_sequences": s.chunk_sequences,
    }
    if "small_batches" in runs:
        small = runs["small_batches"]
        result["small_batches"] = {"chunk_sequences": s.small_chunk, "sequences": small["sequences"],
                                   "seconds": round(small["seconds"], 4),
                                   "sequences_per_s": round(small["sequences"] / small["seconds"], 3),
                                   "peak_rss_mb": round(small["peak_rss_mb"], 1),
                                   **_compare(frames["batched"], frames["small_batches"])}
    if "baseline" in runs:
        base = runs["baseline"]
        bn = base["sequences"]
        result["baseline"] = {"method": "score_objects on one sequence at a time (same bundle, same sequences)",
                              "sequences": bn, "seconds": round(base["seconds"], 4),
                              "sequences_per_s": round(bn / base["seconds"], 3),
                              "peak_rss_mb": round(base["peak_rss_mb"], 1)}
        result["speedup"] = round((n / batched["seconds"]) / (bn / base["seconds"]), 2)
        result.update(_compare(frames["baseline"], frames["batched"]))
    result.update({
        "weights": "random init",
        "device": "cpu",
        "torch_threads": batched["torch_threads"],
        "cpu_count": os.cpu_count(),
        # 1-minute load average before the first side and after the last: other jobs on the machine
        "load_average_1m": {"start": round(load_start[0], 2), "end": round(os.getloadavg()[0], 2)},
        "model": {k: getattr(s, k) for k in ("d_model", "n_layers", "n_heads", "n_shared_heads", "d_ff",
                                             "max_positions")},
        "data": stats,
        "settings": asdict(s),
        "workdir": str(workdir),
    })
    log.info("batched %d sequences in %.2f s (%.1f/s); baseline %s", n, batched["seconds"], n / batched["seconds"],
             result.get("baseline"))
    return result


def score_table(r: dict) -> str:
    m, b, sb = r["model"], r.get("baseline"), r.get("small_batches")
    model = f"d{m['d_model']} L{m['n_layers']} h{m['n_heads']} p{m['n_shared_heads']} w{m['max_positions']}"
    lines = [
        "| model | threads | sequences | chunk | seconds | sequences/s | peak RSS MB | small chunks: size, "
        "sequences/s, peak RSS MB, max score diff, same predictions | one at a time: sequences, sequences/s | "
        "speedup | max score diff |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    small = "-" if sb is None else (f"{sb['chunk_sequences']}, {sb['sequences_per_s']:.1f}, {sb['peak_rss_mb']:.0f}, "
                                    f"{sb['max_abs_score_diff']:.1e}, {sb['same_predictions']}")
    base = ["-", "-", "-"] if b is None else [f"{b['sequences']}, {b['sequences_per_s']:.1f}", f"{r['speedup']:.2f}",
                                              f"{r['max_abs_score_diff']:.1e}"]
    lines.append(f"| {model} | {r['torch_threads']} | {r['sequences']} | {r['chunk_sequences']} | {r['seconds']:.2f} | "
                 f"{r['sequences_per_s']:.1f} | {r['peak_rss_mb']:.0f} | {small} | " + " | ".join(base) + " |")
    return "\n".join(lines)


if __name__ == "__main__":  # a side: python -m training.bench.score SIDE SETTINGS_JSON ROOT SOURCE BUNDLE OUT
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(_child(sys.argv[1], json.loads(sys.argv[2]), *sys.argv[3:7])))
