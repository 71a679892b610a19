"""``seqenc bench sequences``: building a task's value sequences over many days of ingested logs.

The product path (training.tasks.sequence_build: buckets of ``chunk_sequences`` sequences, spilled to
Parquet) against its baseline, the same build in one in-memory pass, each run by
``stage_sequences`` in a child process of its own, whose peak RSS (``VmHWM``) is the figure:

* ``days`` days of ``lines_per_day`` generated HDFS-like lines each (training.bench.ingest's
  generator, a seed per day), ingested into ``<workdir>/data`` by the log ingest; a re-run with
  the same work folder reuses the days already ingested (ingest is what ``seqenc bench ingest``
  measures, not this);
* the task: unlabelled ``anomaly`` on that source, Drain3 event key on, the per-line header
  fields left out (as the demo's HDFS task), model size ``demo`` (vocabulary 4,096, windows of
  128 tokens);
* ``all`` rows: every sequence of every day, buckets of each of ``chunk_sizes``; the in-memory
  baseline does not fit this machine at a week of 10M-line days, so it is not run on all;
* ``compare`` rows: a ``compare_sequences`` sample (the task's ``max_sequences``), both builds,
  and ``same_files``: the two output folders hold equal files.

JSON: ``{"days", "lines_per_day", "ingest": [...per day], "rows": [{"scope", "build",
"chunk_sequences", "sequences", "object_rows", "windows", "tokens", "seconds",
"peak_rss_mb", "same_files"?}], "summary"}``; a Markdown table and a plot beside it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

SOURCE = "logs"
TASK = "watch"
IN_MEMORY = 10**12  # a chunk size no task reaches: one bucket, built in memory

CATALOG = """# seqenc bench sequences: the generated source and the task built over it
[sources.{source}]
kind = "logs"
preset = "hdfs"

[tasks.{task}]
source = "{source}"
kind = "anomaly"
event_key = true
exclude_keys = ["date", "time", "pid", "template"]
{cap}
"""


def day_names(days: int) -> list[str]:
    from datetime import date, timedelta

    return [(date(2025, 3, 1) + timedelta(days=d)).isoformat() for d in range(days)]


def ingest_days(workdir: Path, days: int, lines_per_day: int, seed: int = 0, progress: bool = True) -> list[dict]:
    """Generate and ingest each day not yet under ``<workdir>/data``; a report per day."""
    from parsers import storage
    from parsers.log_ingest import ingest_logs
    from training.bench.ingest import generate_lines

    root, raw = workdir / "data", workdir / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    reports = []
    for d, day in enumerate(day_names(days)):
        done = workdir / f"ingested-{day}.json"
        if done.is_file() and (storage.objects_dir(root, SOURCE) / f"ingest_date={day}").is_dir():
            reports.append(json.loads(done.read_text()))
            continue
        t0 = time.perf_counter()
        log = generate_lines(lines_per_day, raw / f"{day}.log", seed=seed + d)
        r = ingest_logs(log, root, source=SOURCE, preset="hdfs", ingest_date=day)
        log.unlink()
        report = {"day": day, "lines": r["read"], "object_rows": r["rows"], "sequences": r["sequences"],
                  "seconds": round(time.perf_counter() - t0, 1)}
        done.write_text(json.dumps(report))
        reports.append(report)
        if progress:
            print(f"ingested {day}: {report}", file=sys.stderr, flush=True)
    return reports


def _child(workdir: str, catalog: str, chunk: int, out: str) -> dict:
    """One build in this (child) process: seconds, peak RSS, the stage's stats."""
    from parsers.resources import peak_rss_mb
    from training.pipeline.stages import stage_sequences
    from training.tasks.spec import resolve_task

    t0 = time.perf_counter()
    result = stage_sequences(out, resolve_task(catalog, TASK), "demo", seed=0, data_root=str(Path(workdir) / "data"),
                             chunk_sequences=chunk, progress=False)
    return {"seconds": round(time.perf_counter() - t0, 1), "peak_rss_mb": round(peak_rss_mb(), 1),
            "stats": result["stats"], "dir": result["dir"]}


def _run(workdir: Path, catalog: Path, chunk: int, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "training.bench.sequences", str(workdir), str(catalog), str(chunk),
                           str(out)], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"bench sequences child (chunk {chunk}) failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _same_files(a: Path, b: Path) -> bool:
    import polars as pl

    names = sorted(p.name for p in a.iterdir())
    if names != sorted(p.name for p in b.iterdir()):
        return False
    for name in names:
        if name.endswith(".parquet"):
            if not pl.read_parquet(a / name).equals(pl.read_parquet(b / name)):
                return False
        elif (a / name).read_bytes() != (b / name).read_bytes():
            return False
    return True


def _row(scope: str, chunk: int, child: dict, object_rows: int) -> dict:
    s = child["stats"]
    return {"scope": scope, "build": "in_memory" if chunk == IN_MEMORY else "buckets",
            "chunk_sequences": None if chunk == IN_MEMORY else chunk, "sequences": s["sequences"],
            "object_rows": object_rows, "windows": s["windows"], "tokens": s["tokens"],
            "seconds": child["seconds"], "peak_rss_mb": child["peak_rss_mb"]}


def bench_sequences(workdir: str | Path, days: int = 2, lines_per_day: int = 200_000,
                    chunk_sizes: tuple[int, ...] = (20_000,), compare_sequences: int = 20_000, seed: int = 0,
                    progress: bool = True) -> dict:
    """The rows of the module docstring (``compare_sequences`` 0: no compare rows)."""
    import polars as pl

    from parsers import storage

    workdir = Path(workdir).resolve()
    ingest = ingest_days(workdir, days, lines_per_day, seed, progress)
    dates = [r["day"] for r in ingest]
    total_rows = storage.scan_objects(workdir / "data", SOURCE, dates).select(pl.len()).collect().item()
    rows = []
    for tag, cap in (("all", None), ("compare", compare_sequences or None)):
        if tag == "compare" and cap is None:
            continue
        catalog = workdir / f"catalog-{tag}.toml"
        catalog.write_text(CATALOG.format(source=SOURCE, task=TASK, cap=f"max_sequences = {cap}" if cap else ""))
        chunks = chunk_sizes if tag == "all" else (IN_MEMORY, min(chunk_sizes))
        outs = {}
        for chunk in chunks:
            out = workdir / "built" / f"{tag}-{chunk}"
            if progress:
                print(f"building {tag} (chunk {chunk if chunk != IN_MEMORY else 'in memory'})", file=sys.stderr,
                      flush=True)
            child = _run(workdir, catalog, chunk, out)
            object_rows = total_rows if tag == "all" else _sample_rows(workdir, dates, Path(child["dir"]))
            rows.append(_row(f"{tag}" if tag == "all" else f"sample of {cap}", chunk, child, object_rows))
            outs[chunk] = Path(child["dir"])
        if tag == "compare":
            same = _same_files(*outs.values())
            for row in rows[-2:]:
                row["same_files"] = same
    return {"days": days, "lines_per_day": lines_per_day, "ingest": ingest,
            "lines": sum(r["lines"] for r in ingest), "object_rows": total_rows, "rows": rows,
            "summary": _summary(rows)}


def _sample_rows(workdir: Path, dates: list[str], seq_dir: Path) -> int:
    import polars as pl

    from parsers import storage

    ids = pl.read_parquet(seq_dir / "splits.parquet")["sequence_id"].implode()
    scan = storage.scan_objects(workdir / "data", SOURCE, dates)
    return scan.filter(pl.col("sequence_id").is_in(ids)).select(pl.len()).collect().item()


def _summary(rows: list[dict]) -> dict:
    cmp = {r["build"]: r for r in rows if r["scope"] != "all"}
    out = {}
    if len(cmp) == 2:
        out["compare_rss_ratio_buckets_over_in_memory"] = round(cmp["buckets"]["peak_rss_mb"] /
                                                                cmp["in_memory"]["peak_rss_mb"], 3)
        out["compare_time_ratio_buckets_over_in_memory"] = round(cmp["buckets"]["seconds"] /
                                                                 max(cmp["in_memory"]["seconds"], 1e-9), 3)
        out["same_files"] = cmp["buckets"]["same_files"]
    every = [r for r in rows if r["scope"] == "all"]
    if every:
        out["all_max_peak_rss_mb"] = max(r["peak_rss_mb"] for r in every)
    return out


def sequences_table(r: dict) -> str:
    lines = [f"{r['days']} days x {r['lines_per_day']:,} lines = {r['lines']:,} lines, {r['object_rows']:,} object rows",
             "", "| scope | build | chunk | sequences | object rows | windows | tokens | seconds | peak RSS MB | same files |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['scope']} | {row['build']} | {row['chunk_sequences'] or '-'} | {row['sequences']:,} | "
                     f"{row['object_rows']:,} | {row['windows']:,} | {row['tokens']:,} | {row['seconds']} | "
                     f"{row['peak_rss_mb']:,.0f} | {row.get('same_files', '-')} |")
    return "\n".join(lines)


def plot_sequences(r: dict, path: Path) -> None:
    """Peak RSS against sequences built, one marker per row (buckets vs in memory)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for build, marker in (("buckets", "o"), ("in_memory", "s")):
        pts = [(row["sequences"], row["peak_rss_mb"]) for row in r["rows"] if row["build"] == build]
        if pts:
            ax.scatter(*zip(*pts), marker=marker, label=build)
            for row in (x for x in r["rows"] if x["build"] == build):
                ax.annotate(f"{row['seconds']:.0f} s", (row["sequences"], row["peak_rss_mb"]), fontsize=7,
                            xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("sequences built")
    ax.set_ylabel("peak RSS (MB)")
    ax.set_title(f"value sequences over {r['days']} days ({r['lines']:,} lines)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":  # a child of bench_sequences: workdir catalog chunk out
    print(json.dumps(_child(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])))
