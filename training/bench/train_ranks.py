"""``seqenc bench train``: one training job on 1 data-parallel rank and on N, the same data, the
same run: what each rank computed and how long it took (training.engine.sharding).

Data: the built-in generator at ``size`` (``stage_generate``), ingested once
(``stage_ingest``), the ingested data copied into one work folder per world size; the task is
the shipped catalogue's ``anomaly`` (hdfs, binary: Algorithm 1, KR refreshes between rounds).

Each world size runs ``seqenc train --deepspeed`` (ZeRO stage 0 unless ``deepspeed`` says
otherwise; 1 rank too, so that only the world size changes between the rows) as that many
processes started the way torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), on CPU with gloo when there are fewer GPUs than ranks, ``OMP_NUM_THREADS=threads``
each. Every rank prints its counts (``data_parallel`` of the train command's JSON): the
sequences and windows it holds (training.engine.rank_share), the distinct windows and tokens it
encoded in the KR refreshes (training.engine.sharding: the unit divided is the distinct window)
and their seconds (``refresh_encode_seconds``: its own encoding; ``refresh_seconds``: with the all-gather, i.e. waiting for the slowest
rank), the sequences it scored for the surprise (with ``surprise_scoring``), its peak resident
memory (``peak_rss_mb``: the whole process, imports included), and ``fit_seconds``
(the trainer's ``fit``). A world's ``trainer_seconds`` is rank 0's ``fit_seconds`` (rank 0 enters
``fit`` last, after opening the MLflow run, and the ranks end together; another rank's includes
waiting for it); ``wall_seconds`` is the whole command (imports, DeepSpeed, sequences, MLflow).

Ratios (``ratios``, world N against world 1): ``refresh_seconds`` and ``refresh_encode_seconds``
of the slowest rank, ``trainer_seconds``, ``wall_seconds``, and ``windows_share`` (the most
distinct windows a rank of N encoded over what the one rank encoded: about 0.5 for two ranks). On a machine with
fewer cores than ranks x threads, the ranks share cores and the seconds say little;
``load_average_1m`` records what else ran.

OUT: ``{"settings", "data", "worlds": [{"world", "wall_seconds", "trainer_seconds",
"refresh_seconds", ..., "ranks": [per-rank counts], "metrics"}], "ratios": {...}}``, a Markdown
table (``.md``) and a plot (``.png``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_DEEPSPEED = {"zero_optimization": {"stage": 0}}
COUNTS = ("held_sequences", "held_windows", "refresh_windows", "refresh_tokens", "refresh_encode_seconds", "refresh_seconds", "surprise_sequences",
          "surprise_seconds", "mlm_rows", "ka_rows", "fit_seconds", "peak_rss_mb")


def _printed(stdout: str) -> dict:
    return json.loads(stdout[stdout.index("{\n"):stdout.index("\n}") + 2])


def run_world(cmd: list[str], world: int, threads: int, timeout: float) -> tuple[list[dict], float]:
    """``cmd`` as ranks 0..world-1 at once: (each rank's printed JSON, wall seconds). Each rank's
    output goes to a file (a rank blocked on a full pipe while another waits for it at a barrier
    would hang both); a rendezvous port taken between picking and binding it is tried once more."""
    for attempt in (1, 2):
        try:
            return _run_world_once(cmd, world, threads, timeout)
        except _PortTaken:
            if attempt == 2:
                raise RuntimeError(f"the rendezvous port of {world} ranks was taken twice; run again") from None
            log.warning("the rendezvous port was taken before rank 0 bound it; starting the ranks again")
    raise AssertionError("unreachable")


class _PortTaken(RuntimeError):
    pass


def _run_world_once(cmd: list[str], world: int, threads: int, timeout: float) -> tuple[list[dict], float]:
    from training.engine.launch import launch_ranks

    t0 = time.perf_counter()
    results = launch_ranks(cmd, world, env={"OMP_NUM_THREADS": str(threads)}, timeout=timeout)
    wall = time.perf_counter() - t0
    for r in results:
        if r.returncode != 0:
            if "address already in use" in r.stderr.lower():
                raise _PortTaken(r.stderr[-500:])
            raise RuntimeError(f"rank {r.rank} of {world} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return [_printed(r.stdout) for r in results], wall


def bench_train(workdir: str | Path, size: str = "tiny", worlds: tuple[int, ...] = (1, 2), seed: int = 0,
                threads: int = 1, config: dict | None = None, deepspeed: dict | None = None,
                timeout: float = 3600) -> dict:
    """The job once per world size (module docstring); -> the result dict."""
    from training.pipeline.stages import stage_generate, stage_ingest

    if 1 not in worlds:
        raise ValueError(f"worlds {worlds} must include 1: the ratios are against one rank")
    workdir = Path(workdir).resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    source = workdir / "source"
    t0 = time.perf_counter()
    raw = stage_generate(str(source), size, seed)
    ingested = stage_ingest(str(source), "hdfs", raw["hdfs"]["path"], raw["hdfs"]["labels"])
    data = {"size": size, "generate_ingest_seconds": round(time.perf_counter() - t0, 2),
            "ingested": {k: v for k, v in ingested.items() if isinstance(v, int | float | str)}}
    ds = workdir / "deepspeed.json"
    ds.write_text(json.dumps(deepspeed or DEFAULT_DEEPSPEED))
    load_start = os.getloadavg()[0]
    rows = []
    for world in sorted(set(worlds)):
        job = workdir / f"world-{world}"
        shutil.copytree(source / "data", job / "data")
        cmd = [sys.executable, "-m", "training.cli.main", "train", "--workdir", str(job), "--task", "anomaly",
               "--size", size, "--seed", str(seed), "--no-progress", "--deepspeed", str(ds),
               "--config", json.dumps(config or {})]
        log.info("bench train: %d rank(s)", world)
        printed, wall = run_world(cmd, world, threads, timeout)
        per_rank = printed[0]["data_parallel"]["per_rank"]
        rows.append({"world": world, "wall_seconds": round(wall, 3),
                     "trainer_seconds": per_rank[0]["fit_seconds"],
                     "refresh_seconds": max(r["refresh_seconds"] for r in per_rank),
                     "refresh_encode_seconds": max(r["refresh_encode_seconds"] for r in per_rank),
                     "surprise_seconds": max(r["surprise_seconds"] for r in per_rank),
                     "max_windows": max(r["refresh_windows"] for r in per_rank),
                     "ranks": [{"rank": i, **{k: r[k] for k in COUNTS}} for i, r in enumerate(per_rank)],
                     "metrics": {"dev": printed[0]["metrics"]["dev"], "test": printed[0]["metrics"]["test"]}})
    one = next(r for r in rows if r["world"] == 1)
    ratios = {str(r["world"]): {k: (round(r[k] / one[k], 3) if one[k] else None)
                                for k in ("refresh_seconds", "refresh_encode_seconds", "trainer_seconds",
                                          "wall_seconds", "surprise_seconds")}
              | {"windows_share": round(r["max_windows"] / one["max_windows"], 4)}
              for r in rows if r["world"] != 1}
    return {"settings": {"size": size, "worlds": sorted(set(worlds)), "seed": seed, "threads_per_rank": threads,
                         "config": config or {}, "deepspeed": deepspeed or DEFAULT_DEEPSPEED,
                         "cpu_count": os.cpu_count()},
            "data": data, "worlds": rows, "ratios": ratios,
            "load_average_1m": {"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2)}}


def train_table(r: dict) -> str:
    """One line per (world, rank), then the ratios against one rank."""
    lines = ["| world | rank | sequences held | windows held | windows refreshed | tokens | refresh encode s | "
             "refresh s (with gather) | surprise seqs | surprise s | fit s | trainer s | wall s | peak RSS MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in r["worlds"]:
        for p in w["ranks"]:
            lines.append(f"| {w['world']} | {p['rank']} | {p['held_sequences']} | {p['held_windows']} | "
                         f"{p['refresh_windows']} | {p['refresh_tokens']} | "
                         f"{p['refresh_encode_seconds']:.2f} | {p['refresh_seconds']:.2f} | {p['surprise_sequences']} | "
                         f"{p['surprise_seconds']:.2f} | {p['fit_seconds']:.2f} | {w['trainer_seconds']:.2f} | "
                         f"{w['wall_seconds']:.1f} | {p['peak_rss_mb']} |")
    for world, ratio in r["ratios"].items():
        shown = ", ".join(f"{k} {v}" for k, v in ratio.items())
        lines.append(f"\n{world} ranks / 1 rank: {shown}")
    return "\n".join(lines)


def plot_train(r: dict, path: Path) -> None:
    """Seconds per world size: refresh (slowest rank's encode, with gather), surprise, trainer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = ("refresh_encode_seconds", "refresh_seconds", "surprise_seconds", "trainer_seconds")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / len(r["worlds"])
    for i, w in enumerate(r["worlds"]):
        ax.bar([k + i * width for k in range(len(kinds))], [w[k] for k in kinds], width,
               label=f"{w['world']} rank(s)")
    ax.set_xticks([k + width * (len(r["worlds"]) - 1) / 2 for k in range(len(kinds))],
                  [k.replace("_seconds", "").replace("_", " ") for k in kinds])
    ax.set_ylabel("seconds")
    ax.set_title(f"seqenc train, size {r['settings']['size']}: 1 rank vs N")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
