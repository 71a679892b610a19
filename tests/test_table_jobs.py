"""training.bench.table_jobs: the variants of ``seqenc bench tables`` side by side in processes."""

import os

import pytest
import torch

from training.bench.table_jobs import plan, run_variants


def _train(variant: str, base: int) -> tuple:
    """Stands in for one variant's training: what it was given, where it ran, with how many threads."""
    if variant == "broken":
        raise ValueError(f"variant {variant} failed to train")
    return variant, base + len(variant), os.getpid(), torch.get_num_threads()


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_the_plan_shares_torch_threads_between_workers(two_threads):
    assert plan(0, 3) == (2, 1)  # default: a worker per torch thread, one thread each
    assert plan(0, 1) == (1, 2)  # one variant: this process, both threads
    assert plan(1, 3) == (1, 2)  # one after the other
    assert plan(4, 3) == (3, 1)  # never more workers than variants, never under a thread each
    with pytest.raises(ValueError, match="jobs"):
        plan(-1, 3)


def test_variants_run_side_by_side_in_their_own_processes(two_threads):
    out = run_variants(_train, ["mate", "tvmka", "dense"], 2, 10)
    assert list(out) == ["mate", "tvmka", "dense"]  # the caller's order, whatever finished first
    assert [out[v][:2] for v in out] == [("mate", 14), ("tvmka", 15), ("dense", 15)]
    pids = {out[v][2] for v in out}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2  # two workers took the three
    assert {out[v][3] for v in out} == {1}  # each with its share of the threads


def test_one_job_runs_here_one_after_the_other(two_threads):
    out = run_variants(_train, ["mate", "tvmka"], 1, 0)
    assert {out[v][2] for v in out} == {os.getpid()} and {out[v][3] for v in out} == {2}


def test_a_variant_that_fails_stops_the_bench(two_threads):
    with pytest.raises(ValueError, match="broken failed to train"):
        run_variants(_train, ["mate", "broken"], 2, 0)
