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

* **parallel** (``--workers 1,2,4``; ``parallel``: a list of rows ``{"workers", "lines_per_s",
  "peak_rss_mb", "same_templates", ...}``): the same N lines cut into ``files`` consecutive files
  (rotated logs, default 4 per worker of the largest count), ingested once serially
  (parsers.log_ingest, file after file: the reference, ``serial``) and once per worker count
  with parsers.parallel_ingest (mine in parallel, merge, write in parallel), each in a child
  process with a fresh data root. ``peak_rss_mb`` is the largest worker's peak (each worker
  reports its own, parsers.resources), ``coordinator_rss_mb`` the child's own (it merges). ``same_templates``: the Drain3
  state afterwards (every cluster id and template) equals the serial run's;
  ``same_grouping``: every part holds the same objects ``(sequence_id, step, template_id)``, in
  the same order, as the serial run's (a digest per part; the slots may differ where a later
  file generalised a template: parsers.parallel_ingest). ``speedup`` is against the serial run.
  ``--no-loops`` leaves out the two Drain3 loops (their uncached pass is slow on 10M lines).
  Every row carries ``executor``: ``"process"`` (these worker processes). ``--executor celery``
  adds ``"celery"`` rows: the same files through the seqenc_ingest DAG on a real Celery cluster,
  one per worker count (training.bench.ingest_celery), next to the process rows of the same run.

Choice: the contents are split from their headers *before* the loops' clocks start, so the
loops are timed on masking and Drain3 only (conservative: it makes the ratios smaller).

Each side runs in its own child process (``python -m training.bench.ingest``), so ``peak_rss_mb`` is
the ingest's own peak (``VmHWM``, the whole process: parsers.resources; ``ru_maxrss`` of a child
would carry the parent's peak, 3.1 GB after generating 10M lines). ``same_templates`` /
``same_templates_cached`` compare the final template sets of the ingest and of each loop. OUT:
``{"lines", "lines_per_s", "drain3_loop_lines_per_s", "ratio", "same_templates",
"drain3_cached_loop_lines_per_s", "ratio_vs_cached", "same_templates_cached", "cache_hit_share",
"distinct_masked_contents", "peak_rss_mb", ...}`` plus a Markdown table beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from parsers.resources import peak_rss_mb


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
            "report": report, "peak_rss_mb": peak_rss_mb()}


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
            "peak_rss_mb": peak_rss_mb()}


def _run_child(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "training.bench.ingest", *args], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"bench child {' '.join(args)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_ingest(n_lines: int, workdir: str | Path | None = None, seed: int = 0, workers: list[int] | None = None,
                 loops: bool = True, files: int | None = None, executor: str = "process") -> dict:
    """The single-file rows (ingest next to the Drain3 loops, unless ``loops`` is False) and,
    with ``workers``, the ``parallel`` rows (module docstring)."""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        log = generate_lines(n_lines, Path(tmp) / "bench.log", seed)
        ours = _run_child("ingest", str(log), str(Path(tmp) / "root"))
        shutil.rmtree(Path(tmp) / "root", ignore_errors=True)
        parallel = bench_parallel(log, workers, Path(tmp), files, executor) if workers else None
        loop = _run_child("loop", str(log)) if loops else None
        cached = _run_child("loop-cached", str(log)) if loops else None
    result = _single_file(n_lines, ours, loop, cached)
    if parallel:
        result.update(parallel)
    return result


def _single_file(n_lines: int, ours: dict, loop: dict | None, cached: dict | None) -> dict:
    lines_per_s = n_lines / ours["seconds"]
    if loop is None:
        return {"lines": n_lines, "lines_per_s": round(lines_per_s, 1), "peak_rss_mb": round(ours["peak_rss_mb"], 1),
                "seconds": round(ours["seconds"], 2), "templates": len(ours["templates"]),
                "report": {k: ours["report"][k] for k in ("read", "parsed", "rejected", "objects", "rows", "sequences")}}
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


def split_lines(log: Path, files: int, folder: Path) -> list[Path]:
    """``log`` cut into ``files`` files of consecutive lines (as a rotated log), in order."""
    n = sum(1 for _ in log.open("rb"))
    per = -(-n // files)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"bench-{i:03d}.log" for i in range(files)]
    with log.open("rb") as src:
        for path in paths:
            with path.open("wb") as dst:
                for _, line in zip(range(per), src):
                    dst.write(line)
    return [p for p in paths if p.stat().st_size]


def _outcome(root: Path, source: str = "bench") -> dict:
    """The Drain3 state's clusters and a digest of each part's objects (sequence_id, step, template_id)."""
    import hashlib

    import polars as pl

    from parsers.logs import make_miner
    from parsers.presets import PRESETS
    from parsers.storage import drain_state_path, objects_dir

    miner = make_miner(PRESETS["hdfs"], drain_state_path(root, source))
    digests = {}
    for part in sorted(objects_dir(root, source).rglob("part-*.parquet")):
        rows = pl.read_parquet(part, columns=["sequence_id", "step", "template_id"]).unique(maintain_order=True)
        hashes = rows.select(pl.struct(pl.all()).hash(seed=0)).to_series().to_numpy()
        digests[part.name] = hashlib.sha256(hashes.tobytes()).hexdigest()
    return {"templates": {str(c.cluster_id): c.get_template() for c in miner.drain.clusters}, "parts": digests}


def _child_files(kind: str, folder: str, root: str, workers: int) -> dict:
    from parsers.log_ingest import ingest_logs
    from parsers.parallel_ingest import ingest_parallel

    paths = sorted(Path(folder).glob("bench-*.log"))
    t0 = time.perf_counter()
    if kind == "serial":
        read = sum(ingest_logs(p, root, source="bench", preset="hdfs", ingest_date="2000-01-01")["read"]
                   for p in paths)
        workers_peak = None
    else:
        result = ingest_parallel(paths, root, source="bench", preset="hdfs", ingest_date="2000-01-01", workers=workers)
        read, workers_peak = result["read"], result["workers_peak_rss_mb"]
    seconds = time.perf_counter() - t0
    peak = peak_rss_mb()  # before reading the outcome back
    return {"seconds": seconds, "read": read, **_outcome(Path(root)), "peak_rss_mb": peak,
            "workers_peak_rss_mb": workers_peak}


EXECUTORS = ("process", "celery")


def _process_row(folder: Path, w: int, tmp: Path, serial: dict, n_lines: int) -> dict:
    """The files through parsers.parallel_ingest with ``w`` worker processes, in a child."""
    root = tmp / f"parallel-{w}"
    out = _run_child("files", "parallel", str(folder), str(root), str(w))
    shutil.rmtree(root, ignore_errors=True)
    return {
        "executor": "process",
        "workers": w,
        "lines_per_s": round(n_lines / out["seconds"], 1),
        "peak_rss_mb": round(out["workers_peak_rss_mb"], 1),
        "same_templates": out["templates"] == serial["templates"],
        "same_grouping": out["parts"] == serial["parts"],
        "speedup": round(serial["seconds"] / out["seconds"], 3),
        "seconds": round(out["seconds"], 2),
        "coordinator_rss_mb": round(out["peak_rss_mb"], 1),
        "read": out["read"],
    }


def bench_parallel(log: Path, workers: list[int], tmp: Path, files: int | None = None,
                   executor: str = "process") -> dict:
    """The ``serial`` reference and one ``parallel`` row per worker count (module docstring)."""
    if executor not in EXECUTORS:
        raise ValueError(f"--executor must be one of {', '.join(EXECUTORS)}; got {executor!r}")
    files = files or 4 * max(workers)
    folder = tmp / "files"
    paths = split_lines(log, files, folder)
    n_lines = sum(1 for _ in log.open("rb"))
    serial = _run_child("files", "serial", str(folder), str(tmp / "serial"), "1")
    # the process rows always: with --executor celery they are its like-for-like peer, same files, same run
    rows = [_process_row(folder, w, tmp, serial, n_lines) for w in workers]
    if executor == "celery":
        from training.bench.ingest_celery import celery_rows

        rows += celery_rows(folder, workers, tmp, serial, n_lines, _outcome)
    shutil.rmtree(tmp / "serial", ignore_errors=True)
    return {"files": len(paths), "cpu_count": os.cpu_count(),
            "serial": {"lines_per_s": round(n_lines / serial["seconds"], 1), "seconds": round(serial["seconds"], 2),
                       "peak_rss_mb": round(serial["peak_rss_mb"], 1), "templates": len(serial["templates"]),
                       "read": serial["read"]},
            "parallel": rows}


def ingest_table(r: dict) -> str:
    """Markdown: the ingest against both loops (ratio = ingest lines/s / loop lines/s), then the
    parallel rows against the serial ingest of the same files."""
    out = [] if "drain3_loop_lines_per_s" not in r else _loops_table(r)
    if "drain3_loop_lines_per_s" not in r:
        out += ["| lines | ingest lines/s (one file) | peak RSS MB |", "|---:|---:|---:|",
                f"| {r['lines']} | {r['lines_per_s']:.0f} | {r['peak_rss_mb']:.0f} |"]
    if r.get("parallel"):
        s = r["serial"]
        out += ["", f"{r['lines']} lines in {r['files']} files, {r['cpu_count']} cores; serial ingest of the files: "
                f"{s['lines_per_s']:.0f} lines/s, peak RSS {s['peak_rss_mb']:.0f} MB", "",
                "| executor | workers | lines/s | speedup vs serial | peak RSS per worker MB | same templates "
                "| same grouping |", "|---|---:|---:|---:|---:|---|---|"]
        out += [f"| {p.get('executor', 'process')} | {p['workers']} | {p['lines_per_s']:.0f} | {p['speedup']:.2f} | "
                f"{p['peak_rss_mb']:.0f} | {p['same_templates']} | {p['same_grouping']} |" for p in r["parallel"]]
    return "\n".join(out)


def plot_parallel(r: dict, path: Path) -> None:
    """Lines/s against workers, the serial ingest of the same files as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    workers = sorted({p["workers"] for p in r["parallel"]})
    labels = {"process": "worker processes (mine, merge, write)", "celery": "seqenc_ingest DAG on Celery workers"}
    for executor in dict.fromkeys(p.get("executor", "process") for p in r["parallel"]):
        rows = [p for p in r["parallel"] if p.get("executor", "process") == executor]
        ax.plot([p["workers"] for p in rows], [p["lines_per_s"] for p in rows], "o-", label=labels[executor])
    ax.axhline(r["serial"]["lines_per_s"], color="grey", ls="--", label="serial ingest, file after file")
    ax.set_xlabel("worker processes")
    ax.set_ylabel("lines / s")
    ax.set_xticks(workers)
    ax.set_title(f"{r['lines']:,} lines, {r['files']} files, {r['cpu_count']} cores", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _loops_table(r: dict) -> list[str]:
    return [
        "| lines | ingest lines/s | Drain3 loop lines/s (no cache) | ratio | cached Drain3 loop lines/s "
        "| ratio vs cached | cache hit share | same templates (loop / cached) | peak RSS MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---:|",
        f"| {r['lines']} | {r['lines_per_s']:.0f} | {r['drain3_loop_lines_per_s']:.0f} | {r['ratio']:.2f} | "
        f"{r['drain3_cached_loop_lines_per_s']:.0f} | {r['ratio_vs_cached']:.2f} | {r['cache_hit_share']:.4f} | "
        f"{r['same_templates']} / {r['same_templates_cached']} | {r['peak_rss_mb']:.0f} |",
    ]


if __name__ == "__main__":  # children: ingest LOG ROOT | loop LOG | loop-cached LOG | files KIND FOLDER ROOT W
    kind = sys.argv[1]
    if kind == "files":
        result = _child_files(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    elif kind == "ingest":
        result = _child_ingest(sys.argv[2], sys.argv[3])
    else:
        result = _child_loop(sys.argv[2], cached=kind == "loop-cached")
    print(json.dumps(result, default=str))
