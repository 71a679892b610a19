"""Replaced-value detection (RVD): the swapped batches, the TVM's second loss and its gradient,
that the objective learns, and the trainer wiring. Its effect on a task is measured by
``seqenc bench accuracy`` (the interleaved+rvd row), not here."""

import numpy as np
import polars as pl
import pytest
import torch
from toy_tokens import tokenized

from seqenc.config import TVMKAConfig
from seqenc.model import TVMKA
from seqenc.sequences import collect_value_sequences
from training.engine.trainer import InterleavedTrainer, TrainConfig
from training.tasks.data import MLMBatches, split_indices


def mismatch_objects(n=240, seed=0):
    """Each sequence repeats one size 4-7 times (like HDFS replicas); in a positive one, one
    repeat disagrees. Every size is an ordinary size, so only the disagreement gives it away."""
    rng = np.random.default_rng(seed)
    sizes = [str(s) for s in rng.integers(1000, 99999, size=40)]
    rows, labels = [], []
    for i in range(n):
        positive = i % 4 == 0
        size = sizes[int(rng.integers(len(sizes)))]
        steps = int(rng.integers(4, 8))
        odd = int(rng.integers(steps)) if positive else -1
        for step in range(steps):
            value = size if step != odd else sizes[(sizes.index(size) + 1 + int(rng.integers(39))) % 40]
            rows += [(f"s{i}", step, "size", value), (f"s{i}", step, "node", f"n{i % 7}")]
        labels.append(int(positive))
    return pl.DataFrame(rows, schema=["sequence_id", "step", "key", "value"], orient="row"), np.array(labels)


def prepared(seed=0):
    objects, y = mismatch_objects(seed=seed)
    return tokenized(collect_value_sequences(objects), y, vocab_size=300)


def test_swapped_batches_replace_exactly_one_value_of_the_same_key():
    tok, data, _ = prepared()
    keys = [data.keys[r] for r in data.window_key]
    batches = MLMBatches(data.windows, tok, batch_tokens=100_000, seed=0, window_keys=keys, replace_prob=1.0,
                         max_len=32)
    pool_of = {k: set(v) for k, v in batches.pool.items()}
    swapped = 0
    for window, key in zip(data.windows, keys):
        swap = batches._swap(window, key)
        row = None if swap is None else swap[0]
        old_values = [v for _, v in batches._values(window)]
        if row is None:  # one value alone is never swapped
            assert len(old_values) < 2
            continue
        swapped += 1
        new_values = [v for _, v in batches._values(row)]
        assert len(new_values) == len(old_values) and len(row) <= 32
        changed = [(a, b) for a, b in zip(old_values, new_values) if a != b]
        assert len(changed) == 1 and changed[0][1] in pool_of[key]
        head = window.index(tok.val_sep_id)
        assert row[:head] == window[:head]  # [CLS] and the key are kept
        assert tuple(row[swap[1]:swap[2]]) == changed[0][1]  # the span of the new value
    assert swapped > len(data.windows) // 2
    ids, mask, labels, replaced = next(batches)
    assert replaced.dtype == torch.bool and replaced.shape == ids.shape
    assert replaced[:, 0].any() and (replaced[:, 1:].any(1) == replaced[:, 0]).all()
    assert not (replaced & ~mask).any()
    with pytest.raises(ValueError, match="window_keys"):
        MLMBatches(data.windows, tok, 1000, 0, replace_prob=0.5)


def test_rvd_loss_needs_the_head_and_trains_the_cls_position():
    tok, data, _ = prepared()
    config = TVMKAConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=4, n_shared_heads=2, d_ff=64,
                         max_positions=32, replaced_value_detection=True)
    model = TVMKA(config)
    batches = MLMBatches(data.windows, tok, 2048, 0, [data.keys[r] for r in data.window_key], 0.5, 32)
    mlm, rvd = model.tvm.mlm_loss(*next(batches))
    assert mlm.ndim == rvd.ndim == 0 and rvd.item() > 0
    rvd.backward()
    assert model.tvm.rvd_head.weight.grad.abs().sum() > 0
    assert model.tvm.embeddings.word.weight.grad.abs().sum() > 0  # it reaches the encoder
    plain = TVMKA(TVMKAConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=4, n_shared_heads=2,
                              d_ff=64, max_positions=32))
    assert plain.tvm.rvd_head is None
    with pytest.raises(ValueError, match="replaced_value_detection"):
        plain.tvm.mlm_loss(*next(batches))


def test_the_rvd_objective_learns_to_spot_the_swapped_value():
    """TVM steps with MLM + RVD on sequences whose values repeat: the detection loss falls well
    below its starting level (the head learns to tell a swapped value from the rest)."""
    tok, data, _ = prepared()
    torch.manual_seed(0)
    config = TVMKAConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4, n_shared_heads=2, d_ff=64,
                         max_positions=32, dropout=0.0, attn_dropout=0.0, replaced_value_detection=True)
    tvm = TVMKA(config).tvm
    batches = MLMBatches(data.windows, tok, 2048, 0, [data.keys[r] for r in data.window_key], 0.5, 32)
    optimizer = torch.optim.AdamW(tvm.parameters(), lr=2e-3)
    losses = []
    for _ in range(300):
        mlm, rvd = tvm.mlm_loss(*next(batches))
        (mlm + rvd).backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(rvd.item())
    assert np.mean(losses[-50:]) < 0.75 * np.mean(losses[:50]), (np.mean(losses[:50]), np.mean(losses[-50:]))


def test_interleaved_trainer_logs_the_rvd_loss_on_every_tvm_step(tmp_path):
    tok, data, y = prepared()
    config = TVMKAConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=4, n_shared_heads=2, d_ff=64,
                         max_positions=32, replaced_value_detection=True)
    cfg = TrainConfig(pretrain_steps=6, rounds=2, tvm_steps_per_round=4, batch_tokens=2048, warmup_steps=1, seed=0)
    trainer = InterleavedTrainer(TVMKA(config), tok, data, y, split_indices(y, 0), cfg, tmp_path, progress=False)
    result = trainer.fit()
    rvd_steps = [s for s, _ in trainer.history["train/rvd_loss"]]
    assert rvd_steps == [s for s, _ in trainer.history["train/mlm_loss"]] and len(rvd_steps) == 6 + 2 * 4
    assert 0 <= result["test"]["f1"] <= 1
