"""S(k) construction, windowing and tokenisation: golden examples and no silent loss."""

import numpy as np
import polars as pl
import pytest

from seqenc.sequences import (
    TokenizedSequences,
    collect_value_sequences,
    tokenize_value_sequences,
    value_sequence_windows,
)
from seqenc.tokenizer import ValueTokenizer

CLS, SEP = 2, 5  # ids of [CLS] and [VAL_SEP] in a trained ValueTokenizer


def test_short_sequence_is_one_window():
    windows, dropped = value_sequence_windows([50], [[60, 61], [62]], CLS, SEP, max_len=16)
    assert windows == [[CLS, 50, SEP, 60, 61, SEP, 62]]
    assert dropped == 0


def test_long_sequence_windows_each_start_with_cls_and_key():
    values = [[60, 61], [62], [63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76]]
    windows, dropped = value_sequence_windows([50], values, CLS, SEP, max_len=8)
    assert windows == [
        [CLS, 50, SEP, 60, 61, SEP, 62],
        [CLS, 50, SEP, 63, 64, 65, 66, 67],
        [CLS, 50, 68, 69, 70, 71, 72, 73],
        [CLS, 50, 74, 75, 76],
    ]
    assert dropped == 0
    assert all(len(w) <= 8 for w in windows)
    # every value token appears, in order
    body = [t for w in windows for t in w[2:] if t != SEP]
    assert body == [t for v in values for t in v]


@pytest.mark.parametrize("seed", range(5))
def test_every_value_lands_in_some_window(seed):
    rng = np.random.default_rng(seed)
    values = [list(rng.integers(10, 99, size=rng.integers(1, 12))) for _ in range(40)]
    windows, dropped = value_sequence_windows([7, 8], values, CLS, SEP, max_len=24)
    assert dropped == 0
    assert all(w[:3] == [CLS, 7, 8] and len(w) <= 24 for w in windows)
    assert [t for w in windows for t in w[3:] if t != SEP] == [t for v in values for t in v]


def test_balanced_windows_leave_no_value_alone_at_the_end():
    """31 values of 3 tokens in windows of 2 + 45: greedily 15 + 15 + 1 (the last value alone);
    balanced, as many windows with 11 / 10 / 10 values, in order, none lost."""
    values = [[60 + i % 30, 90] for i in range(31)]
    greedy, _ = value_sequence_windows([50], values, CLS, SEP, max_len=47, mode="window")
    balanced, dropped = value_sequence_windows([50], values, CLS, SEP, max_len=47, mode="balanced")
    assert [w.count(SEP) for w in greedy] == [15, 15, 1]
    assert [w.count(SEP) for w in balanced] == [11, 10, 10] and dropped == 0
    assert all(w[:2] == [CLS, 50] and len(w) <= 47 for w in balanced)
    assert [t for w in balanced for t in w[2:]] == [t for w in greedy for t in w[2:]]
    # one window, or a value longer than a window: as "window"
    assert value_sequence_windows([50], values[:3], CLS, SEP, 47, mode="balanced")[0] == \
        value_sequence_windows([50], values[:3], CLS, SEP, 47, mode="window")[0]
    long = [[60] * 50, [61]]
    assert value_sequence_windows([50], long, CLS, SEP, 8, mode="balanced")[0] == value_sequence_windows(
        [50], long, CLS, SEP, 8, mode="window")[0]
    # max_windows drops the earliest values, counted
    windows, dropped = value_sequence_windows([50], values, CLS, SEP, 47, mode="balanced", max_windows=2)
    assert len(windows) == 2 and dropped == 11 and windows[-1][-1] == 90


def test_truncate_keeps_most_recent_and_counts():
    windows, dropped = value_sequence_windows([50], [[60, 61], [62], [63, 64]], CLS, SEP, 8, mode="truncate")
    assert windows == [[CLS, 50, SEP, 62, SEP, 63, 64]]
    assert dropped == 1


def test_max_windows_counts_dropped_values():
    values = [[60 + i, 70 + i] for i in range(10)]  # each unit is 3 tokens; 2 per window of 8
    windows, dropped = value_sequence_windows([50], values, CLS, SEP, 8, max_windows=2)
    assert len(windows) == 2 and dropped == 6
    assert windows[-1][-2:] == [69, 79]  # the most recent value is kept


def objects_frame():
    return pl.DataFrame({
        "sequence_id": ["b", "a", "a", "a", "b", "a"],
        "step": [0, 1, 0, 1, 1, 2],
        "key": ["size", "size", "size", "ip", "size", "size"],
        "value": ["10", "20", "30", "1.2.3.4", "40", "50"],
    })


def test_collect_value_sequences_orders_by_step():
    vs = collect_value_sequences(objects_frame())
    assert vs.rows() == [("a", "ip", ["1.2.3.4"]), ("a", "size", ["30", "20", "50"]), ("b", "size", ["10", "40"])]
    assert collect_value_sequences(objects_frame(), ("ip",))["key"].to_list() == ["size", "size"]


def test_tokenize_and_parquet_round_trip(tmp_path):
    vs = collect_value_sequences(objects_frame())
    tok = ValueTokenizer.train(["size", "ip", "10", "20", "30", "40", "50", "1.2.3.4"], vocab_size=100, min_frequency=1)
    assert (tok.cls_id, tok.val_sep_id) == (CLS, SEP)
    data = tokenize_value_sequences(vs, tok, max_len=16)
    assert data.sequence_ids == ["a", "b"]
    assert data.keys == ["ip", "size", "size"]
    assert data.key_seq.tolist() == [0, 0, 1]
    size_a = data.windows[1]
    assert tok.decode(size_a) == "[CLS] size [VAL_SEP] 30 [VAL_SEP] 20 [VAL_SEP] 50"
    data.write_parquet(tmp_path / "w.parquet")
    back = TokenizedSequences.read_parquet(tmp_path / "w.parquet")
    assert back.sequence_ids == data.sequence_ids and back.keys == data.keys
    assert back.windows == data.windows and back.window_key.tolist() == data.window_key.tolist()
    sub = data.subset(np.array([1]))
    assert sub.sequence_ids == ["b"] and sub.keys == ["size"] and sub.key_seq.tolist() == [0]


def test_truncate_mode_is_counted_in_the_logs(caplog):
    import logging

    import polars as pl

    from seqenc.sequences import collect_value_sequences, tokenize_value_sequences
    from seqenc.tokenizer import ValueTokenizer

    objects = pl.DataFrame({"sequence_id": ["s"] * 30, "step": list(range(30)), "key": ["k"] * 30,
                            "value": [f"v{i}" for i in range(30)]})
    tok = ValueTokenizer.train(objects["value"].to_list() + ["k"], vocab_size=100, min_frequency=1)
    seqs = collect_value_sequences(objects)
    with caplog.at_level(logging.WARNING, logger="seqenc.sequences"):
        data = tokenize_value_sequences(seqs, tok, max_len=16, mode="truncate")
    assert len(data.windows) == 1 and data.dropped_values > 0
    assert f"{data.dropped_values} of 30 values did not fit (mode=truncate" in caplog.text
    assert tok.decode(data.windows[0]).endswith("v29")  # the most recent value is kept
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="seqenc.sequences"):
        data = tokenize_value_sequences(seqs, tok, max_len=16, mode="window")
    assert data.dropped_values == 0 and len(data.windows) > 1 and "did not fit" not in caplog.text


TRAIN_VOCAB = """
import random, sys
from seqenc.tokenizer import ValueTokenizer
rng = random.Random(0)
texts = [f"{rng.choice(['alpha', 'beta', 'gamma'])}-{rng.randint(0, 10 ** rng.randint(1, 9))} /x/{rng.randint(0, 999)}"
         for _ in range(20000)]
ValueTokenizer.train(texts, vocab_size=1024).save(sys.argv[1])
"""


def test_trained_vocabulary_is_the_same_in_every_process(tmp_path):
    """Same corpus, separate processes (fresh hash seeds): the same vocabulary and ids. With a
    "##" continuation prefix the tokenizers trainer gave a different vocabulary in each of 3 runs."""
    import subprocess
    import sys

    outs = []
    for i in range(3):
        path = tmp_path / f"tok{i}.json"
        subprocess.run([sys.executable, "-c", TRAIN_VOCAB, str(path)], check=True, timeout=120)
        outs.append(path.read_text())
    assert outs[0] == outs[1] == outs[2]
    tok = ValueTokenizer.from_file(tmp_path / "tok0.json")
    assert tok.vocab_size == 1024 and tok.tokenizer.token_to_id("[VAL_SEP]") is not None


def test_value_end_closes_every_s_k_and_survives_a_save(tmp_path):
    vs = collect_value_sequences(objects_frame())
    tok = ValueTokenizer.train(["size", "ip", "10", "20", "30", "40", "50", "1.2.3.4"], vocab_size=100, min_frequency=1)
    assert not tok.value_end
    tok.with_value_end()
    assert tok.value_end and tok.end_id not in tok.special_ids  # masked and predicted like a value
    data = tokenize_value_sequences(vs, tok, max_len=16)
    assert [tok.decode(w) for w in data.windows] == [
        "[CLS] ip [VAL_SEP] 1. 2. 3. 4 [VAL_SEP] [END]",
        "[CLS] size [VAL_SEP] 30 [VAL_SEP] 20 [VAL_SEP] 50 [VAL_SEP] [END]",
        "[CLS] size [VAL_SEP] 10 [VAL_SEP] 40 [VAL_SEP] [END]",
    ]
    assert data.stats["values"] == 6 and data.dropped_values == 0  # the end is not a value of V(k)
    truncated = tokenize_value_sequences(vs, tok, max_len=6, mode="truncate")
    assert tok.decode(truncated.windows[1]) == "[CLS] size [VAL_SEP] 50 [VAL_SEP] [END]"  # the end is kept
    tok.save(tmp_path / "tokenizer.json")
    back = ValueTokenizer.from_file(tmp_path / "tokenizer.json")
    assert back.value_end and back.end_id == tok.end_id  # scoring rebuilds S(k) the same way
    assert tokenize_value_sequences(vs, back, max_len=16).windows == data.windows
    plain = ValueTokenizer.train(["size", "10"], vocab_size=100, min_frequency=1)
    assert not ValueTokenizer.from_file(_saved(plain, tmp_path / "plain.json")).value_end


def _saved(tok: ValueTokenizer, path) -> str:
    tok.save(path)
    return str(path)
