"""The variants of ``seqenc bench tables`` trained side by side, each in its own process.

Why: a demo-size table encoder does not scale across the cores of a small machine. On the 2-core
machine ``mate`` with the longer pre-training (2,400 + 1,500 updates) pre-trained in 16.5 min on
both cores (torch's intra-op threads) against 19 min on one core beside a second run (1.15x), and
its task updates ran at 1.22 a second on both cores against 1.35-1.65 on one core beside another
variant: two variants one after the other took about twice as long as the two side by side
(docs/tables.md, "Longer pre-training": the default run 46.6 min side by side). So the bench
trains up to ``jobs`` variants at once (default: as many as torch's threads in the calling
process, i.e. ``OMP_NUM_THREADS`` or the cores), each in a process of its own with
``threads // jobs`` torch threads, and scores them there too. ``jobs`` 1 (or ``OMP_NUM_THREADS=1``) keeps the old order: one variant after the
other in the calling process.

Processes are started with ``spawn`` (a fork after torch has started its thread pool can hang).
The MLflow store and its experiment are created by the caller before the workers start, so the
workers never race to create the SQLite schema; their runs then write to it side by side. The
first failure stops the others (``Pool.terminate``) and is raised in the caller.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
from collections.abc import Callable

log = logging.getLogger(__name__)


def plan(jobs: int, n_variants: int) -> tuple[int, int]:
    """(workers, torch threads per worker) for ``n_variants`` variants: ``jobs`` (0: torch's threads
    here) workers at most one per variant, the threads shared out between them (at least one)."""
    import torch

    threads = torch.get_num_threads()
    if jobs < 0:
        raise ValueError(f"jobs must be 0 (one per torch thread) or more, got {jobs}")
    workers = max(1, min(jobs or threads, n_variants))
    return workers, max(1, threads // workers)


def _start_worker(threads: int, level: int) -> None:
    import torch

    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(threads)


def _call(fn: Callable, args: tuple, variant: str) -> tuple[str, object]:
    return variant, fn(variant, *args)


def run_variants(fn: Callable, variants: list[str], jobs: int, *args) -> dict:
    """``{variant: fn(variant, *args)}`` in the order of ``variants``, up to ``jobs`` of them at once
    in worker processes (the module docstring); in this process, one after the other, when one
    worker is all there is. ``fn`` and ``args`` must pickle (a module-level function)."""
    workers, threads = plan(jobs, len(variants))
    if workers == 1:
        return {v: fn(v, *args) for v in variants}
    log.info("bench tables: %d variants, %d at a time, %d torch thread(s) each", len(variants), workers, threads)
    out = {}
    pool = multiprocessing.get_context("spawn").Pool(workers, _start_worker, (threads, logging.getLogger().level))
    try:
        for variant, result in pool.imap_unordered(functools.partial(_call, fn, args), variants):
            out[variant] = result  # in the order they finish; a failure raises as soon as it happens
            log.info("bench tables: %s done (%d of %d)", variant, len(out), len(variants))
    except BaseException:
        pool.terminate()
        raise
    else:
        pool.close()
    finally:
        pool.join()
    return {v: out[v] for v in variants}
