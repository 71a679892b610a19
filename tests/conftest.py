"""Shared fixtures."""

import pytest


@pytest.fixture(scope="session")
def prepared_task(tmp_path_factory):
    """``prepared_task(task)``: a tiny work directory with the task's built-in data generated,
    ingested and turned into value sequences (made once per session; copy it before training)."""
    from seqenc.catalog import load_catalog
    from training import pipeline

    made = {}

    def make(task: str):
        if task not in made:
            work = tmp_path_factory.mktemp(f"prepared-{task}") / "w"
            raw = pipeline.stage_generate(str(work), "tiny", seed=0)
            source = load_catalog().task(task).source
            pipeline.stage_ingest(str(work), source, raw[source]["path"], raw[source]["labels"])
            pipeline.stage_sequences(str(work), task, "tiny", seed=0)
            made[task] = work
        return made[task]

    return make
