"""Where the real data for tests lives (../shared/data, see its README), and what a test does
when it is absent: skip with the reason -- except in CI (CI=true), where it must be present."""

import os
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


TRUE, FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def env_flag(name: str) -> bool:
    """The one reader of a yes/no environment flag (``CI`` and the like): 1/true/yes/on or
    0/false/no/off (any case; unset is false); anything else is an error, never a silent false."""
    value = os.environ.get(name, "").strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise ValueError(f"environment variable {name}={os.environ[name]!r} is not a yes/no flag: "
                     f"use one of {', '.join(TRUE + FALSE[1:])}")


def in_ci() -> bool:
    return env_flag("CI")


def require(path: Path = DATA) -> Path:
    if not path.exists():
        if in_ci():
            pytest.fail(f"real data missing in CI: {path}")
        pytest.skip(f"real data not found at {path} (../shared/data is absent on this machine)")
    return path
