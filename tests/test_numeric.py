"""Quantile-bin tokens for numeric values (seqenc.numeric) through the tokenizer and S(k)."""

import numpy as np
import polars as pl
import pytest
import torch

from seqenc.numeric import NumericBins, as_number, bin_token, gap_cuts_between
from seqenc.sequences import TokenizedSequences
from seqenc.tokenizer import NUMERIC_BINS_FILE, ValueTokenizer
from training.serving.scoring import load_bundle, save_bundle
from training.tasks.data import mask_tokens
from training.tasks.spec import resolve_task
from training.tasks.task_data import vocab_and_windows

BLOCK = 67108864  # a value that fills most quantiles, as HDFS's 64 MiB block size


def _bins() -> NumericBins:
    keys = ["size", "size", "host", "mixed"]
    values = [[str(BLOCK)] * 30 + [str(x) for x in range(1000, 11000, 1000)],  # 40 numbers
              [str(BLOCK + 5)],  # one value just above the block size
              [f"10.0.0.{i}" for i in range(40)],  # not numbers
              ["1", "2", "3", "x", "y", "z", "4", "5", "6", "7", "8"]]  # 8 of 11 numeric: < 95 %
    return NumericBins.fit(keys, values, n_bins=4)


def test_as_number():
    assert as_number("67108864") == 67108864.0
    assert as_number("-3.5e2") == -350.0
    assert as_number(" 12 ") == 12.0
    for text in ("10.0.0.1", "blk_1", "0x1f", "nan", "inf", "", "1,000"):
        assert as_number(text) is None, text


def test_fit_keeps_numeric_keys_and_distinct_quantile_edges():
    bins = _bins()
    assert set(bins.edges) == {"size"}  # host: no numbers; mixed: under the 95 % share
    edges = bins.edges["size"].tolist()
    assert edges == sorted(set(edges)) and edges[0] == 1000 and edges[-1] == BLOCK + 5
    assert BLOCK in edges  # the value filling many quantiles is one edge
    assert len(bins.tokens) == 5 and bins.tokens[0] == bin_token(0) == "[NUM_0]"


def test_bin_of_right_closed_and_clamped():
    bins = _bins()
    last = len(bins.edges["size"]) - 1
    assert bins.bin_of("size", "1000") == 0
    assert bins.bin_of("size", "5") == 0  # below the train range: the lowest bin
    assert bins.bin_of("size", str(BLOCK)) == last - 1
    assert bins.bin_of("size", str(BLOCK + 1)) == last  # just above the block size: its own bin
    assert bins.bin_of("size", str(10 * BLOCK)) == last  # above the train range: the highest bin
    assert bins.bin_of("size", "not a number") is None
    assert bins.bin_of("host", "10.0.0.1") is None and bins.bin_of("unseen", "3") is None


def _exports() -> tuple[list[str], list[str]]:
    """Page sizes 200-2,990 B, a few exports of 20-89 kB and three exfiltrations of 2-8 MB."""
    pages = [str(200 + 10 * i) for i in range(280)]
    exports = [str(20_000 + 3_000 * i) for i in range(24)]
    return pages + exports + ["2000000", "5000000", "8000000"], exports


def test_gap_cuts_split_an_outer_bin_at_a_magnitude_gap(tmp_path):
    x = np.array([5.0, 7.0, 90.0, 95.0, 2_000.0, 3_000.0])
    assert gap_cuts_between(x, 5.0, 3_000.0, 2) == [7.0, 95.0]  # below each gap of a decade or more
    assert gap_cuts_between(x, 5.0, 3_000.0, 1) == [95.0]  # the widest first (2000 / 95 > 90 / 7)
    assert gap_cuts_between(x, 7.0, 3_000.0, 2) == [95.0]  # a cut at the bin's own edge is no cut
    assert gap_cuts_between(np.array([-500.0, -40.0, -3.0, 0.0, 30.0]), -500.0, 30.0, 3) == [-40.0]  # one sign
    assert gap_cuts_between(np.arange(1.0, 100.0), 1.0, 99.0, 2) == []  # values that run on: no gap

    values, exports = _exports()
    plain = NumericBins.fit(["bytes"], [values], n_bins=8)
    cut = NumericBins.fit(["bytes"], [values], n_bins=8, gap_cuts=2)
    top = len(plain.edges["bytes"]) - 1
    # quantile bins alone: the exports and the exfiltrations share the top bin
    assert {plain.bin_of("bytes", v) for v in exports} | {plain.bin_of("bytes", "5000000")} == {top}
    # a cut at the gap: the exfiltrations get the top bin alone, the pages keep their bins
    assert {cut.bin_of("bytes", v) for v in exports} == {top} and cut.bin_of("bytes", "5000000") == top + 1
    assert all(cut.bin_of("bytes", v) == plain.bin_of("bytes", v) for v in values[:280])
    assert len(cut.tokens) == len(plain.tokens) + 1 == 10  # one more bin than n_bins + 1: one more token
    cut.save(tmp_path / "bins.json")
    again = NumericBins.load(tmp_path / "bins.json")
    assert again.gap_cuts == 2 and again.edges["bytes"].tolist() == cut.edges["bytes"].tolist()
    assert again.tokens == cut.tokens

    # values without a gap of a decade in their outer bins: the same edges and tokens as without
    even = [str(1000 + 7 * i) for i in range(300)]
    with_cuts, without = NumericBins.fit(["n"], [even], 8, gap_cuts=2), NumericBins.fit(["n"], [even], 8)
    assert with_cuts.to_dict()["edges"] == without.to_dict()["edges"] and with_cuts.tokens == without.tokens

    from seqenc.config import TVMKAConfig
    with pytest.raises(ValueError, match="numeric_gap_cuts"):
        TVMKAConfig(numeric_bins=16, numeric_gap_cuts=-1)


def _tokenizer() -> ValueTokenizer:
    texts = ["size", "host", str(BLOCK), "1000", "2000", "10.0.0.1"] * 3
    return ValueTokenizer.train(texts, vocab_size=200).with_numeric_bins(_bins())


def test_encode_values_puts_the_bin_token_first_and_survives_save_load(tmp_path):
    tok = _tokenizer()
    plain = tok.encode_many([str(BLOCK), "10.0.0.1"])
    size_ids = tok.encode_values("size", [str(BLOCK), str(2 * BLOCK)])
    last = len(tok.numeric.edges["size"]) - 1
    assert size_ids[0] == [tok.tokenizer.token_to_id(bin_token(last - 1)), *plain[0]]
    assert size_ids[1][0] == tok.tokenizer.token_to_id(bin_token(last))
    assert tok.encode_values("host", ["10.0.0.1"]) == [plain[1]]  # a non-numeric key: no bin token
    assert tok.encode_keyed(["host", "size"], ["10.0.0.1", str(BLOCK)]) == [plain[1], size_ids[0]]

    tok.save(tmp_path / "tokenizer.json")
    assert (tmp_path / NUMERIC_BINS_FILE).is_file()
    again = ValueTokenizer.from_file(tmp_path / "tokenizer.json")
    assert again.vocab_size == tok.vocab_size
    assert again.encode_values("size", [str(BLOCK), str(2 * BLOCK)]) == size_ids

    ValueTokenizer.train(["a b c"] * 3, vocab_size=50).save(tmp_path / "tokenizer.json")
    assert not (tmp_path / NUMERIC_BINS_FILE).exists()  # a tokenizer without bins leaves no stale file
    assert ValueTokenizer.from_file(tmp_path / "tokenizer.json").numeric is None


def test_bin_tokens_are_value_tokens_for_mlm():
    tok = _tokenizer()
    ids = torch.tensor([[tok.tokenizer.token_to_id(t) for t in tok.numeric.tokens]] * 64)
    assert not set(ids[0].tolist()) & tok.special_ids
    _, labels = mask_tokens(ids, tok, torch.Generator().manual_seed(0), prob=0.5)
    assert (labels != -100).any()  # bin tokens get masked and predicted like any value token


def test_value_sequences_carry_bins_fitted_on_train_only():
    value_seqs = pl.DataFrame({
        "sequence_id": [f"s{i}" for i in range(12) for _ in range(2)],
        "key": ["host", "size"] * 12,
        "values": [v for i in range(12) for v in ([f"10.0.0.{i}"], [str(1000 * (i + 1)), str(1000 * (i + 1))])],
    })
    train = pl.Series([f"s{i}" for i in range(6)])  # sizes 1000..6000 in train
    model = {"vocab_size": 300, "max_positions": 32, "numeric_bins": 16}
    tok, data = vocab_and_windows(value_seqs, train, model)
    assert set(tok.numeric.edges) == {"size"} and tok.numeric.edges["size"][-1] == 6000
    top = tok.tokenizer.token_to_id(bin_token(len(tok.numeric.edges["size"]) - 1))
    size_rows = [r for r, k in enumerate(data.keys) if k == "size"]
    last_window = data.windows[size_rows[-1]]  # s11, 12000: above the train range -> the top bin
    assert last_window.count(tok.val_sep_id) == 2
    assert [last_window[i + 1] for i, t in enumerate(last_window) if t == tok.val_sep_id] == [top, top]

    tok0, data0 = vocab_and_windows(value_seqs, train, {"vocab_size": 300, "max_positions": 32})
    assert tok0.numeric is None  # off unless the model config asks for bins
    assert sum(map(len, data0.windows)) == sum(map(len, data.windows)) - 24  # one bin token per size value


def test_numeric_bins_config_is_checked():
    from seqenc.config import TVMKAConfig

    with pytest.raises(ValueError, match="numeric_bins"):
        TVMKAConfig(numeric_bins=-1)


def test_bundle_carries_the_bins(tmp_path):
    from seqenc.config import TVMKAConfig
    from seqenc.model import TVMKA
    tok = _tokenizer()
    config = TVMKAConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=1, n_heads=2, n_shared_heads=1, d_ff=32,
                         max_positions=32, numeric_bins=tok.numeric.n_bins)
    save_bundle(TVMKA(config), tok, {"task": "binary"}, tmp_path / "bundle")
    assert (tmp_path / "bundle" / NUMERIC_BINS_FILE).is_file()
    model, loaded, _ = load_bundle(tmp_path / "bundle")
    assert model.config.numeric_bins == loaded.numeric.n_bins == 4
    assert loaded.encode_values("size", [str(BLOCK)]) == tok.encode_values("size", [str(BLOCK)])


def test_seqenc_train_config_turns_bins_on(prepared_task, tmp_path):
    """``seqenc train --config '{"model": {"numeric_bins": 8}}'``: the value sequences are built with
    bins (the model overrides reach the tokenisation, not only the model), and the bundle keeps them."""
    import shutil

    from training.pipeline import stages as pipeline

    work = tmp_path / "w"
    shutil.copytree(prepared_task("anomaly"), work)
    steps = {"pretrain_steps": 2, "rounds": 1, "tvm_steps_per_round": 2, "checkpoint_every": 0}
    result = pipeline.run_train(str(work), resolve_task(None, "anomaly"), "tiny", config={"model": {"numeric_bins": 8, "max_positions": 48},
                                                                      "train": steps}, progress=False)
    model, tok, _ = load_bundle(result["model_dir"])
    assert model.config.numeric_bins == tok.numeric.n_bins == 8 and "size" in tok.numeric.edges
    assert model.config.max_positions == 48
    windows = TokenizedSequences.read_parquet(work / "sequences" / "anomaly" / "windows.parquet").windows
    assert max(map(len, windows)) <= 48  # the windows follow the overridden window, too
    assert set(tok.tokenizer.token_to_id(t) for t in tok.numeric.tokens) & {t for w in windows for t in w}
    assert set(result["metrics"]["test"]) >= {"precision", "recall", "f1"}
