"""The README's "Your own data" commands run as written (copied from README.md, not restated
here) on small files of the names they use: order events with risk labels, and an application
log without labels. ``SEQENC_SIZE=tiny`` (the default size of every command: training.pipeline.stages.
resolve_size) keeps the training steps small: what is tested is that the commands run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from byod_data import write_app_log, write_orders

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_block(name: str) -> str:
    """The bash block that follows ``<!-- your-own-data: NAME -->`` in the README."""
    text = README.read_text()
    match = re.search(rf"<!-- your-own-data: {name} -->\s*```bash\n(.*?)```", text, re.S)
    assert match, f"README.md has no 'your-own-data: {name}' block"
    return match.group(1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    base = tmp_path_factory.mktemp("readme")
    write_orders(base, n_orders=60)
    write_app_log(base / "app1.log", n_lines=600)
    return base


def _run(script: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), "SEQENC_SIZE": "tiny"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("SEQENC_CATALOG", None)
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, f"README commands failed:\n{script}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def test_labelled_commands_run_as_written(folder):
    _run(readme_block("labelled"), folder)
    pred = pl.concat([pl.read_parquet(p) for p in (folder / "work" / "predictions" / "fraud").rglob("*.parquet")])
    assert pred.height == 60 and "prob_fraud" in pred.columns  # the starter task's positive: the rarer class
    assert (folder / "work" / "models" / "fraud" / "bundle" / "model.safetensors").is_file()


def test_unlabelled_commands_run_as_written(folder):
    _run(readme_block("unlabelled"), folder)
    pred = pl.concat([pl.read_parquet(p) for p in (folder / "work" / "predictions" / "app1_watch").rglob("*.parquet")])
    assert pred.height == 15  # 600-second windows over 2.5 hours
    assert set(pred["label"].to_list()) <= {"normal", "anomaly"}
