"""Where the real data for tests lives (../shared/data, see its README), and what a test does
when it is absent: skip with the reason -- except in CI (CI=true), where it must be present."""

import os
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def require(path: Path = DATA) -> Path:
    if not path.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"real data missing in CI: {path}")
        pytest.skip(f"real data not found at {path} (../shared/data is absent on this machine)")
    return path
