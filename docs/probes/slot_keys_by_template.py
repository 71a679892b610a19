"""Probe (2026-12-06, docs/training.md "Small days, and why LOF leads on bgl"): bgl with slot keys
qualified by their template (``E71.param_1`` instead of ``param_1``) -- does the all-train surprise
rank bgl's alert windows better when S(param_1) no longer mixes the first parameters of 108
templates? Runs the ``seqenc`` CLI with ``training.bench.data._as_objects`` wrapped, so every log
bgl slot keys (not its header keys, not ``template`` or ``event``) are renamed. From the
repository root:

    python docs/probes/slot_keys_by_template.py bench accuracy --data ../shared/data --json OUT \
      --datasets bgl --modes unlabelled,unlabelled+normal --seeds 0,1,2 --workdir W
"""
import sys

import polars as pl

from training.bench import data as D
from training.cli.main import main

HEADER = {"timestamp", "date", "time", "node", "noderepeat", "type", "component", "level", "template", "event"}
_as_objects = D._as_objects


def qualified(frame: pl.DataFrame) -> pl.DataFrame:
    """A log dataset's objects (bgl: it has ``noderepeat``) with slot keys renamed ``E<template id>.<slot>``."""
    frame = _as_objects(frame)
    if "template_id" in frame.columns and frame.filter(pl.col("key") == "noderepeat").height:
        frame = frame.with_columns(
            pl.when(~pl.col("key").is_in(list(HEADER)) & pl.col("template_id").is_not_null())
            .then("E" + pl.col("template_id").cast(pl.String) + "." + pl.col("key"))
            .otherwise(pl.col("key")).alias("key"))
    return frame


if __name__ == "__main__":
    D._as_objects = qualified  # load_dataset's loaders call it at run time
    sys.exit(main(sys.argv[1:]))
