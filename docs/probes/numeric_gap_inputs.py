"""Probe (2026-12-07, docs/training.md "Magnitude gaps"): do the gap cuts (``numeric_gap_cuts``)
change any input of the bench's binary datasets? For each dataset and seed, the numeric keys of
its train split, and whether 16 quantile bins with ``gap_cuts=2`` have the same edges and bin
tokens as without.

    python docs/probes/numeric_gap_inputs.py hdfs,bgl,value_anomaly 0,1,2,10,11,12,13,14
"""
import sys
import tempfile
from pathlib import Path

import numpy as np
import polars as pl

from seqenc.numeric import BinFitter
from training.bench.data import load_dataset
from training.tasks.task_data import collect_value_sequences

for name in sys.argv[1].split(","):
    for seed in map(int, sys.argv[2].split(",")):
        ds = load_dataset(name, Path("../shared/data"), Path(tempfile.mkdtemp()), seed=seed)
        value_seqs = collect_value_sequences(ds.objects, ds.exclude_keys)
        train = ds.split.filter(pl.col("split") == "train")["sequence_id"]
        rows = value_seqs.filter(pl.col("sequence_id").is_in(train.to_list()))
        plain, cut = BinFitter(16), BinFitter(16, gap_cuts=2)
        for fitter in (plain, cut):
            fitter.add(rows["key"].to_list(), rows["values"].to_list())
        plain, cut = plain.bins(), cut.bins()
        same = (plain.edges.keys() == cut.edges.keys() and plain.tokens == cut.tokens
                and all(np.array_equal(plain.edges[k], cut.edges[k]) for k in plain.edges))
        print(f"{name} seed {seed}: numeric keys {sorted(cut.edges)}; the same edges and tokens: {same}", flush=True)
