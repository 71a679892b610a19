"""Shared fixtures."""

import pytest


@pytest.fixture(scope="session")
def prepared_task(tmp_path_factory):
    """``prepared_task(task)``: a tiny work directory with the task's built-in data generated,
    ingested and turned into value sequences (made once per session; copy it before training)."""
    from training import pipeline

    made = {}

    def make(task: str):
        if task not in made:
            work = tmp_path_factory.mktemp(f"prepared-{task}") / "w"
            raw = pipeline.stage_generate(str(work), "tiny", seed=0)
            if task == "anomaly":
                pipeline.stage_ingest_logs(str(work), raw["hdfs_log"], raw["hdfs_labels"])
            else:
                pipeline.stage_ingest_events(str(work), raw["events"], raw["events_labels"])
            pipeline.stage_sequences(str(work), task, "tiny", seed=0)
            made[task] = work
        return made[task]

    return make
