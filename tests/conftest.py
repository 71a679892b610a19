"""Shared fixtures, and one thread per test worker.

The suite runs on two pytest-xdist workers (``-n 2 --dist loadfile`` in pyproject.toml: each test
file stays on one worker, so a module's fixture is built once). On a 2-core machine two workers
that each start two torch threads slow each other down several times over, so every worker (and
every subprocess it starts, through ``OMP_NUM_THREADS``) uses one thread. ``pytest -n 0`` runs the
suite in one process with the default threads.
"""

import os

import pytest

from training.tasks.spec import resolve_task

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    os.environ["POLARS_MAX_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def prepared_task(tmp_path_factory):
    """``prepared_task(task)``: a tiny work directory with the task's built-in data generated,
    ingested and turned into value sequences (made once per session; copy it before training).
    ``paper=True``: the sequences tokenised as the paper's S(k), without a binary task's value
    markers and bins (the preset "paper", training.engine.sizes)."""
    from training.engine.sizes import TRAINING_PRESETS
    from training.pipeline import stages as pipeline
    from training.tasks.catalog import load_catalog

    made = {}

    def make(task: str, paper: bool = False):
        if (task, paper) not in made:
            work = tmp_path_factory.mktemp(f"prepared-{task}{'-paper' if paper else ''}") / "w"
            raw = pipeline.stage_generate(str(work), "tiny", seed=0)
            source = load_catalog().task(task).source
            pipeline.stage_ingest(str(work), source, raw[source]["path"], raw[source]["labels"])
            pipeline.stage_sequences(str(work), resolve_task(None, task), "tiny", seed=0,
                                     model_overrides=TRAINING_PRESETS["paper"]["model"] if paper else None)
            made[task, paper] = work
        return made[task, paper]

    return make
