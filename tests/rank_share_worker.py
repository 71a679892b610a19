"""One rank of tests/test_sharded_training.py::test_every_gather_of_two_ranks_equals_one_process: run as
``python tests/rank_share_worker.py DIR`` by training.engine.launch (RANK, WORLD_SIZE, ...). Each
rank computes every gathered quantity of training.engine.rank_share / sharding over its share and
the same over the whole data in this process, asserts they agree, and writes DIR/rank-<r>.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.distributed as dist

from seqenc.config import TVMKAConfig
from seqenc.inference import key_representations
from seqenc.model import TVMKA
from seqenc.novel_values import NovelValues
from seqenc.sequences import TokenizedSequences
from seqenc.surprise import key_surprise
from training.engine.rank_share import RankShare
from training.engine.sharding import RefreshPlan, sharded_key_representations, sharded_key_surprise

VAL_SEP, EVENT_IDS = 3, (10, 11, 12, 13, 14, 15)


def tiny_sequences(n: int = 13) -> TokenizedSequences:
    """n sequences of keys ``event`` and ``size`` (one to three windows each); the event values of
    sequence 11 and 12 (the last share's) are seen nowhere else; sequence 0 shares a window with 12."""
    rng = np.random.default_rng(1)
    keys, key_seq, windows, window_key = [], [], [], []
    for s in range(n):
        for key in ("event", "size"):
            keys.append(key)
            key_seq.append(s)
            for _ in range(int(rng.integers(1, 4))):
                values = [[int(rng.choice(EVENT_IDS[:4] if s < 11 else EVENT_IDS[4:]))] if key == "event"
                          else [int(t) for t in rng.integers(20, 40, size=2)] for _ in range(int(rng.integers(1, 5)))]
                windows.append([1, 5 if key == "event" else 6] + [t for v in values for t in [VAL_SEP, *v]])
                window_key.append(len(keys) - 1)
    windows[-1] = list(windows[0])
    return TokenizedSequences([f"s{i:02d}" for i in range(n)], keys, np.array(key_seq), windows, np.array(window_key))


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    whole = tiny_sequences()
    path = out / "windows.parquet"
    if rank == 0:
        pq.write_table(whole.to_arrow(), path, row_group_size=7)  # a share starts and ends inside row groups
    dist.barrier()
    share = RankShare.read(path, rank, world)
    cut = RankShare.of(whole, rank, world)
    assert (share.start, share.key_row_start) == (cut.start, cut.key_row_start)
    assert share.local.windows == cut.local.windows and share.local.keys == cut.local.keys
    assert np.array_equal(share.local.window_key, cut.local.window_key)
    assert share.index.sequence_ids == whole.sequence_ids and np.array_equal(share.index.key_seq, whole.key_seq)

    share.gather_value_bags(64, VAL_SEP)
    everyone = np.arange(whole.n_sequences)
    for got, want in zip(share.index.value_count_bags(everyone, 64, VAL_SEP),
                         whole.value_count_bags(everyone, 64, VAL_SEP)):
        assert torch.equal(got, want)

    fit, vocabulary = np.arange(0, 11, 2), np.arange(whole.n_sequences)
    novel, counts = share.novel_values(fit, vocabulary, "event", VAL_SEP, frozenset())
    alone = NovelValues.fit(whole, fit, vocabulary, "event", VAL_SEP)
    assert novel == alone and novel.values
    assert np.array_equal(counts, alone.counts(whole)) and counts[11] > 0 and counts[:11].sum() == 0

    torch.manual_seed(0)
    tvm = TVMKA(TVMKAConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, n_shared_heads=1, d_ff=32,
                            max_positions=32, n_classes=2)).tvm
    plan = RefreshPlan.build(share.local, rank, world)
    kr, mine = sharded_key_representations(tvm, share, plan, 0, progress=False)
    assert torch.allclose(kr, key_representations(tvm, whole, 0, progress=False), atol=1e-5)

    scored = np.array([1, 2, 5, 8, 9, 12])
    stats = sharded_key_surprise(tvm, share, scored, mask_id=2, val_sep_id=VAL_SEP, pad_id=0, progress=False)
    assert np.allclose(stats, key_surprise(tvm, whole.subset(scored), 2, VAL_SEP, 0, progress=False), atol=1e-4)
    (out / f"rank-{rank}.json").write_text(json.dumps(
        {"sequences": share.local.n_sequences, "windows": len(share.local.windows), "refresh_windows": mine["windows"],
         "distinct_held": len(plan.unique), "distinct_global": plan.n_global}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    os._exit(0)
