"""Intermediate pre-training of table encoders on lookup statements from the training tables
(training.engine.table_pretrain): what the statements say, the curriculum, and an exact resume."""

import random

import numpy as np
import pytest
import torch

from seqenc.config import TableConfig
from seqenc.table_model import TableExamples, table_encoder
from seqenc.tokenizer import ValueTokenizer
from training.engine.end_to_end import EndToEndTrainer, TableInputs
from training.engine.table_pretrain import (
    LookupCurriculum,
    comparison_statement,
    count_statement,
    lookup_statement,
    superlative_statement,
)
from training.engine.trainer import TrainConfig, phase_plan

WORDS = [f"w{i}" for i in range(80)]


def tables(n: int, rows: int, seed: int = 0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        cells = rng.sample(WORDS, rows * 3)
        out.append((["name", "city", "team"], [cells[r * 3:(r + 1) * 3] for r in range(rows)]))
    return out


class Killed(Exception):
    pass


def test_lookup_statements_are_true_in_the_key_row_and_false_from_another_row():
    rng = random.Random(0)
    header, body = tables(1, 6)[0]
    for truth in (True, False) * 20:
        text = lookup_statement(header, body, 0, 4, truth, rng)
        column, rest = text.removeprefix("the ").split(" of ", 1)
        key, value = rest.split(" is ")
        row = next(r for r in body if r[0] == key)
        assert body.index(row) < 4  # only the candidate rows are named
        assert (row[header.index(column)] == value) == truth
        if not truth:  # a value of the same column, from another candidate row
            assert value in [r[header.index(column)] for r in body[:4]]


def test_the_curriculum_cuts_the_tables_stage_by_stage_and_is_half_true():
    curriculum = LookupCurriculum(tables(20, 10), stages=[2, 4, 0], steps=30, seed=0)
    for step, rows in ((0, 2), (9, 2), (10, 4), (29, 10)):
        examples, labels = curriculum.batch(step, 8)
        assert {len(body) for _, _, body in examples} == {rows} and labels == [1, 0] * 4
    with pytest.raises(ValueError, match="table_pretrain_steps"):
        LookupCurriculum([(["a", "b"], [["x", "y"]])], stages=[2], steps=5, seed=0)  # one row: nothing to look up


def numeric_table(rows: int, seed: int = 0):
    """Distinct names, distinct points (so every extreme is one row) and a team column with repeats."""
    rng = random.Random(seed)
    points = rng.sample(range(1, 500), rows)
    return ["name", "points", "team"], [[f"w{r}", f"{points[r]:,}", rng.choice(["w70", "w71", "w72"])]
                                        for r in range(rows)]


def test_superlatives_comparisons_and_counts_say_what_the_table_holds():
    rng = random.Random(1)
    header, body = numeric_table(9)
    points = {r[0]: int(r[1].replace(",", "")) for r in body}
    seen = set()
    for truth in (True, False) * 25:
        text = superlative_statement(header, body, 0, 6, truth, rng)
        key, rest = text.split(" have the ")
        most = rest.split(" ")[0]
        seen.add(most)
        extreme = (max if most == "highest" else min)(points, key=points.get)
        assert (key == extreme) == truth and key in [r[0] for r in body[:6]]  # a named row, said of the table
        text = comparison_statement(header, body, 0, 6, truth, rng)
        a, rest = text.split(" have a ")
        word, b = rest.split(" points than ")
        assert ((points[a] > points[b]) == (word == "higher")) == truth
        text = count_statement(header, body, 0, 6, truth, rng)
        n, rest = text.removeprefix("there be ").split(" name with ", 1)
        column, value = rest.split(" ", 1)
        held = sum(r[header.index(column)] == value for r in body)
        assert (int(n) == held) == truth and int(n) >= 1
    assert seen == {"highest", "lowest"}
    # nothing to say: no numeric column, or two rows tied at the top
    words = (["name", "team"], [["w1", "w2"], ["w3", "w4"]])
    assert superlative_statement(*words, 0, 2, True, rng) is None and comparison_statement(*words, 0, 2, True, rng) is None
    assert superlative_statement(["name", "points"], [["a", "5"], ["b", "5"]], 0, 2, True, rng) is None


def test_the_curriculum_draws_every_configured_kind_and_rejects_unknown_ones():
    curriculum = LookupCurriculum([numeric_table(6, s) for s in range(10)], stages=[0], steps=10, seed=0,
                                  kinds=["lookup", "superlative", "comparison", "count"])
    examples, labels = curriculum.batch(0, 200)
    texts = [t for t, _, _ in examples]
    assert labels == [1, 0] * 100
    for marker in (" is ", " have the ", " than ", "there be "):
        assert 20 < sum(marker in t for t in texts) < 100, marker
    with pytest.raises(ValueError, match="table_pretrain_kinds"):
        LookupCurriculum(tables(3, 4), stages=[0], steps=5, seed=0, kinds=["lookup", "sums"])
    with pytest.raises(ValueError, match="table_pretrain_kinds"):
        TrainConfig(mode="table", table_pretrain_kinds=["sums"])
    # a table without numbers writes no superlative: a clear error, not an endless draw
    with pytest.raises(ValueError, match="no training table gave"):
        LookupCurriculum(tables(3, 4), stages=[0], steps=5, seed=0, kinds=["superlative"]).batch(0, 4)


def test_the_plan_starts_with_lookup_pre_training_in_table_mode_only():
    cfg = TrainConfig(mode="table", table_pretrain_steps=7, task_steps=4, rounds=2)
    assert phase_plan(cfg)[0] == ("table_pretrain", 0, 7) and ("task", 1, 2) in phase_plan(cfg)
    assert phase_plan(TrainConfig(mode="flattened", table_pretrain_steps=7, task_steps=4))[0][0] == "task"
    with pytest.raises(ValueError, match="row cuts"):
        TrainConfig(mode="table", table_pretrain_rows=[1, 4])


def _trainer(workdir, examples, y, splits, cfg, tok, seed, **kwargs):
    torch.manual_seed(seed)
    config = TableConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=1, n_heads=2, n_shared_heads=0, d_ff=32,
                         max_positions=80, table_attention="mate", table_lookup_head=True, dropout=0.0,
                         attn_dropout=0.0, task="multiclass")
    model = table_encoder(config)
    return EndToEndTrainer(model, TableInputs(model, examples, tok), y, splits, cfg, workdir, "multiclass", 2,
                           progress=False, **kwargs)


def test_lookup_pre_training_resumes_exactly(tmp_path):
    """Killed inside the pre-training phase, resumed in a fresh trainer: the same losses, weights
    and metrics as a run that was never interrupted (the curriculum's RNG is in the checkpoint)."""
    tok = ValueTokenizer.train([" ".join(WORDS), "name city team the of is"] * 2, vocab_size=200, min_frequency=1)
    tabs = tables(12, 4)
    examples = TableExamples([f"s{i}" for i in range(24)],
                             [(f"the city of {b[0][0]} is {b[i % 2][1]}", h, b) for i, (h, b) in enumerate(tabs * 2)])
    y = np.array([1, 0] * 12)
    splits = {"train": np.arange(16), "dev": np.arange(16, 20), "test": np.arange(20, 24)}
    cfg = TrainConfig(mode="table", table_pretrain_steps=8, task_steps=4, rounds=2, batch_size=4, lr_task=1e-3,
                      checkpoint_every=3, log_every=1, warmup_steps=2, seed=0)
    straight = _trainer(tmp_path / "a", examples, y, splits, cfg, tok, 0)
    init = {k: v.clone() for k, v in straight.model.state_dict().items()}
    expected = straight.fit()
    assert [k for k, v in straight.history.items() if k.startswith("train/") and v] == ["train/lookup_loss",
                                                                                          "train/task_loss"]
    assert len(straight.history["train/lookup_loss"]) == 8

    def kill_at(step):
        def log(metrics, s):
            if s == step:
                raise Killed
        return log

    first = _trainer(tmp_path / "b", examples, y, splits, cfg, tok, 0, log_metrics=kill_at(5))
    first.model.load_state_dict(init)
    with pytest.raises(Killed):
        first.fit()
    resumed = _trainer(tmp_path / "b", examples, y, splits, cfg, tok, 3)
    assert resumed.resume() and (resumed.step, resumed.phase) == (3, 0)
    result = resumed.fit()
    assert resumed.history == straight.history
    for name, p in straight.model.state_dict().items():
        assert torch.equal(p, resumed.model.state_dict()[name]), name
    assert result["dev"] == expected["dev"] and result["test"] == expected["test"]
