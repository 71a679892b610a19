"""``seqenc bench ingest``: whole-ingest throughput next to plain Drain3 loops, same lines, same run.

* **ingest**: ``parsers.log_ingest.ingest_logs`` on N generated HDFS-like lines -- read, header parse,
  masking, Drain3, parameter extraction and key naming, session grouping, Parquet write.
* **drain3 loop** (``drain3_loop_lines_per_s``, ``ratio``, ``same_templates``): a
  ``TemplateMiner`` with the *same* configuration (masks, depth, similarity, mask-aware
  similarity) and ``add_log_message`` on every line's content, no cache. Kept as it was before
  issue 21, for continuity with earlier figures.
* **cached drain3 loop** (``drain3_cached_loop_lines_per_s``, ``ratio_vs_cached``,
  ``same_templates_cached``): the same miner with the ingest's masked-content cache, as
  :class:`parsers.logs.LineParser` does it: mask the content, look the masked text up in a
  dict; on a hit bump the cluster's size, else ``drain.add_log_message``. This is the
  like-for-like baseline: the ingest has the cache too, so ``ratio`` (against the uncached
  loop) credits the ingest with the cache's hits. ``cache_hit_share`` (hits / lines in the
  cached loop) and ``distinct_masked_contents`` say how much the lines repeat: the generated
  lines have a few dozen distinct masked contents in a million, so nearly every lookup hits.
  Real logs repeat less, most of all in free-text systems: with their presets, the LogHub 2k
  samples give hit shares of 0.993 (HDFS), 0.94 (HPC), 0.73 (OpenStack) and 0.67 (BGL) --
  on 2,000 lines only; longer files repeat more.

Choice: the contents are split from their headers *before* the loops' clocks start, so the
loops are timed on masking and Drain3 only (conservative: it makes the ratios smaller).

Each side runs in its own child process (``python -m training.bench.ingest``), so ``peak_rss_mb`` is
the ingest's own peak (``ru_maxrss``, the whole process). ``same_templates`` /
``same_templates_cached`` compare the final template sets of the ingest and of each loop. OUT:
``{"lines", "lines_per_s", "drain3_loop_lines_per_s", "ratio", "same_templates",
"drain3_cached_loop_lines_per_s", "ratio_vs_cached", "same_templates_cached", "cache_hit_share",
"distinct_masked_contents", "peak_rss_mb", ...}`` plus a Markdown table beside it.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def generate_lines(n_lines: int, path: Path, seed: int = 0) -> Path:
    """Exactly ``n_lines`` HDFS-like lines (the built-in generator, cut to length)."""
    from parsers.synthetic import generate_hdfs_logs

    full = path.with_suffix(".full.log")
    generate_hdfs_logs(full, path.with_suffix(".labels.csv"), n_blocks=max(1, n_lines // 15 + 1), seed=seed)
    with full.open("rb") as src, path.open("wb") as dst:
        for i, line in enumerate(src):
            if i >= n_lines:
                break
            dst.write(line)
    full.unlink()
    n = sum(1 for _ in path.open("rb"))
    if n < n_lines:
        raise RuntimeError(f"generator gave {n} lines, wanted {n_lines}")
    return path


def _child_ingest(log: str, root: str) -> dict:
    from parsers.log_ingest import ingest_logs
    from parsers.logs import make_miner
    from parsers.presets import PRESETS
    from parsers.storage import drain_state_path

    t0 = time.perf_counter()
    report = ingest_logs(log, root, source="bench", preset="hdfs", ingest_date="2000-01-01")
    seconds = time.perf_counter() - t0
    miner = make_miner(PRESETS["hdfs"], drain_state_path(root, "bench"))
    return {"seconds": seconds, "templates": sorted(c.get_template() for c in miner.drain.clusters),
            "report": report, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def drain3_loop(contents: list[str], cached: bool) -> tuple[list[str], int]:
    """Feed contents to a Drain3 miner configured like the HDFS preset's; returns the sorted
    final templates and the number of cache hits (0 without the cache).

    ``cached``: the masked-content cache of :class:`parsers.logs.LineParser` -- a repeated
    masked text skips the tree search and only bumps its cluster's size."""
    from parsers.logs import make_miner
    from parsers.presets import PRESETS

    miner = make_miner(PRESETS["hdfs"], None)
    hits = 0
    if cached:
        clusters: dict[str, object] = {}
        for content in contents:
            masked = miner.masker.mask(content)
            cluster = clusters.get(masked)
            if cluster is None:
                clusters[masked], _ = miner.drain.add_log_message(masked)
            else:
                cluster.size += 1
                hits += 1
    else:
        for content in contents:
            miner.add_log_message(content)
    return sorted(c.get_template() for c in miner.drain.clusters), hits


def _child_loop(log: str, cached: bool) -> dict:
    from parsers.presets import PRESETS

    rx = PRESETS["hdfs"].regex()
    contents = []
    with open(log, encoding="utf-8") as fh:
        for line in fh:
            m = rx.match(line.rstrip("\n"))
            if m:
                contents.append(m.group("Content").strip())
    t0 = time.perf_counter()
    templates, hits = drain3_loop(contents, cached)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "lines": len(contents), "templates": templates, "cache_hits": hits,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _run_child(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "training.bench.ingest", *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_ingest(n_lines: int, workdir: str | Path | None = None, seed: int = 0) -> dict:
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        log = generate_lines(n_lines, Path(tmp) / "bench.log", seed)
        ours = _run_child("ingest", str(log), str(Path(tmp) / "root"))
        loop = _run_child("loop", str(log))
        cached = _run_child("loop-cached", str(log))
    lines_per_s = n_lines / ours["seconds"]
    loop_per_s = loop["lines"] / loop["seconds"]
    cached_per_s = cached["lines"] / cached["seconds"]
    return {
        "lines": n_lines,
        "lines_per_s": round(lines_per_s, 1),
        "drain3_loop_lines_per_s": round(loop_per_s, 1),  # no cache, as before issue 21
        "ratio": round(lines_per_s / loop_per_s, 3),
        "same_templates": ours["templates"] == loop["templates"],
        "drain3_cached_loop_lines_per_s": round(cached_per_s, 1),  # with the ingest's cache: like for like
        "ratio_vs_cached": round(lines_per_s / cached_per_s, 3),
        "same_templates_cached": ours["templates"] == cached["templates"],
        "cache_hit_share": round(cached["cache_hits"] / cached["lines"], 6),
        "distinct_masked_contents": cached["lines"] - cached["cache_hits"],  # the cached loop's misses
        "peak_rss_mb": round(ours["peak_rss_mb"], 1),
        "seconds": round(ours["seconds"], 2),
        "drain3_loop_seconds": round(loop["seconds"], 2),
        "drain3_cached_loop_seconds": round(cached["seconds"], 2),
        "drain3_loop_peak_rss_mb": round(loop["peak_rss_mb"], 1),
        "templates": len(ours["templates"]),
        "report": {k: ours["report"][k] for k in ("read", "parsed", "rejected", "objects", "rows", "sequences")},
    }


def ingest_table(r: dict) -> str:
    """Markdown: the ingest against both loops (ratio = ingest lines/s / loop lines/s)."""
    return "\n".join([
        "| lines | ingest lines/s | Drain3 loop lines/s (no cache) | ratio | cached Drain3 loop lines/s "
        "| ratio vs cached | cache hit share | same templates (loop / cached) | peak RSS MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---:|",
        f"| {r['lines']} | {r['lines_per_s']:.0f} | {r['drain3_loop_lines_per_s']:.0f} | {r['ratio']:.2f} | "
        f"{r['drain3_cached_loop_lines_per_s']:.0f} | {r['ratio_vs_cached']:.2f} | {r['cache_hit_share']:.4f} | "
        f"{r['same_templates']} / {r['same_templates_cached']} | {r['peak_rss_mb']:.0f} |",
    ])


if __name__ == "__main__":  # children: ingest LOG ROOT | loop LOG | loop-cached LOG
    kind = sys.argv[1]
    result = (_child_ingest(sys.argv[2], sys.argv[3]) if kind == "ingest"
              else _child_loop(sys.argv[2], cached=kind == "loop-cached"))
    print(json.dumps(result, default=str))
