"""``seqenc bench ingest``: whole-ingest throughput next to a plain Drain3 loop, same lines, same run.

* **ingest**: ``parsers.logs.ingest_logs`` on N generated HDFS-like lines -- read, header parse,
  masking, Drain3, parameter extraction and key naming, session grouping, Parquet write.
* **drain3 loop**: a ``TemplateMiner`` with the *same* configuration (masks, depth, similarity,
  mask-aware similarity) and ``add_log_message`` on every line's content. Choice: the contents
  are split from their headers *before* the loop's clock starts, so the loop is timed on
  Drain3's own work only (conservative: it makes the ratio smaller).

Each side runs in its own child process (``python -m parsers.bench``), so ``peak_rss_mb`` is
the ingest's own peak (``ru_maxrss``, the whole process). ``same_templates`` compares the two
sides' final template sets. OUT: ``{"lines", "lines_per_s", "drain3_loop_lines_per_s", "ratio",
"same_templates", "peak_rss_mb", ...}`` plus a Markdown table beside it.
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
    from parsers.logs import ingest_logs, make_miner
    from parsers.presets import PRESETS
    from parsers.storage import drain_state_path

    t0 = time.perf_counter()
    report = ingest_logs(log, root, source="bench", preset="hdfs", ingest_date="2000-01-01")
    seconds = time.perf_counter() - t0
    miner = make_miner(PRESETS["hdfs"], drain_state_path(root, "bench"))
    return {"seconds": seconds, "templates": sorted(c.get_template() for c in miner.drain.clusters),
            "report": report, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _child_loop(log: str) -> dict:
    from parsers.logs import make_miner
    from parsers.presets import PRESETS

    fmt = PRESETS["hdfs"]
    rx = fmt.regex()
    contents = []
    with open(log, encoding="utf-8") as fh:
        for line in fh:
            m = rx.match(line.rstrip("\n"))
            if m:
                contents.append(m.group("Content").strip())
    miner = make_miner(fmt, None)
    t0 = time.perf_counter()
    for content in contents:
        miner.add_log_message(content)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "lines": len(contents),
            "templates": sorted(c.get_template() for c in miner.drain.clusters),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _run_child(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "parsers.bench", *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_ingest(n_lines: int, workdir: str | Path | None = None, seed: int = 0) -> dict:
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        log = generate_lines(n_lines, Path(tmp) / "bench.log", seed)
        ours = _run_child("ingest", str(log), str(Path(tmp) / "root"))
        loop = _run_child("loop", str(log))
    lines_per_s = n_lines / ours["seconds"]
    loop_per_s = loop["lines"] / loop["seconds"]
    return {
        "lines": n_lines,
        "lines_per_s": round(lines_per_s, 1),
        "drain3_loop_lines_per_s": round(loop_per_s, 1),
        "ratio": round(lines_per_s / loop_per_s, 3),
        "same_templates": ours["templates"] == loop["templates"],
        "peak_rss_mb": round(ours["peak_rss_mb"], 1),
        "seconds": round(ours["seconds"], 2),
        "drain3_loop_seconds": round(loop["seconds"], 2),
        "drain3_loop_peak_rss_mb": round(loop["peak_rss_mb"], 1),
        "templates": len(ours["templates"]),
        "report": {k: ours["report"][k] for k in ("read", "parsed", "rejected", "objects", "rows", "sequences")},
    }


def ingest_table(r: dict) -> str:
    return "\n".join([
        "| lines | ingest lines/s | Drain3 loop lines/s | ratio | same templates | peak RSS MB |",
        "|---:|---:|---:|---:|---|---:|",
        f"| {r['lines']} | {r['lines_per_s']:.0f} | {r['drain3_loop_lines_per_s']:.0f} | {r['ratio']:.2f} | "
        f"{r['same_templates']} | {r['peak_rss_mb']:.0f} |",
    ])


if __name__ == "__main__":  # children: ingest LOG ROOT | loop LOG
    kind = sys.argv[1]
    result = _child_ingest(sys.argv[2], sys.argv[3]) if kind == "ingest" else _child_loop(sys.argv[2])
    print(json.dumps(result, default=str))
