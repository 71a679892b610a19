"""Argument helpers shared by the ``seqenc`` commands (training.cli.main, training.cli.bench)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def config_arg(text: str | None) -> dict:
    """``--config``: inline JSON (starts with ``{``) or the path of a JSON file; None -> {}."""
    if not text:
        return {}
    raw = text if text.lstrip().startswith("{") else Path(text).read_text()
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as err:
        raise SystemExit(f"--config: not valid JSON ({err}): {text[:80]}") from err
    if not isinstance(config, dict):
        raise SystemExit(f"--config: expected a JSON object, got {type(config).__name__}")
    return config


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)
