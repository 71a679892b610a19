"""Value links (seqenc.links): [LINKED] / [ALONE] markers through the tokenizer, S(k), the
baselines, training and scoring."""

import polars as pl
import pytest

from seqenc.links import ALONE, LINKED, link_flags, value_link_flags
from seqenc.sequences import tokenize_value_sequences
from seqenc.tokenizer import ValueTokenizer
from training.tasks.catalog import load_catalog
from training.tasks.data import mask_tokens
from training.tasks.spec import resolve_task
from training.tasks.task_data import value_sequences, vocab_and_windows


def _value_seqs() -> pl.DataFrame:
    return pl.DataFrame({
        "sequence_id": ["a", "a", "a", "a", "b", "b"],
        "key": ["dest", "size", "src", "src_ip", "dest", "src_ip"],
        "values": [["10.0.0.1:50010", "10.0.0.2:50010"], ["64", "64"], ["10.0.0.1:41234"],
                   ["10.0.0.1", "10.0.0.9", "/10.0.0.2"], ["10.0.0.1:50011"], ["10.0.0.3", "10.0.0.3"]],
    })


def test_flags_link_values_across_keys_of_one_sequence_only():
    assert value_link_flags(_value_seqs()) == [
        [True, True],  # both hosts are also src_ip values (host:port -> host)
        [False, False],  # repeated within its own key only: not a link
        [True],  # host 10.0.0.1 is a dest host and a src_ip
        [True, False, True],  # a leading "/" is ignored; 10.0.0.9 occurs nowhere else
        [False],  # 10.0.0.1 is in sequence a, not b
        [False, False],
    ]
    assert value_link_flags(_value_seqs().clear()) == []


def test_link_flags_of_long_rows_match_the_nested_form():
    long = _value_seqs().explode("values").rename({"values": "value"})
    nested = [f for row in value_link_flags(_value_seqs()) for f in row]
    assert link_flags(long).to_list() == nested


def _tokenizer() -> ValueTokenizer:
    texts = ["dest", "size", "src_ip", "10.0.0.1:50010", "64", "10.0.0.9"] * 3
    return ValueTokenizer.train(texts, vocab_size=200)


def test_tokenizer_markers_lead_each_value_are_maskable_and_saved(tmp_path):
    tok = _tokenizer()
    assert not tok.value_links
    with pytest.raises(ValueError, match="no value-link tokens"):
        tok.encode_values("dest", ["64"], [True])
    size = tok.vocab_size
    tok.with_value_links()
    on, off = (tok.tokenizer.token_to_id(t) for t in (LINKED, ALONE))
    assert tok.value_links and tok.vocab_size == size + 2
    assert on not in tok.special_ids and off not in tok.special_ids  # MLM masks and predicts them
    plain = tok.encode_values("dest", ["10.0.0.1:50010", "64"])
    assert tok.encode_values("dest", ["10.0.0.1:50010", "64"], [True, False]) == [[on, *plain[0]], [off, *plain[1]]]
    with pytest.raises(ValueError, match="2 link flags for 1 values"):
        tok.encode_values("dest", ["64"], [True, False])
    tok.save(tmp_path / "tokenizer.json")
    loaded = ValueTokenizer.from_file(tmp_path / "tokenizer.json")
    assert loaded.value_links and loaded.encode_values("dest", ["64"], [True]) == [[on, *plain[1]]]
    import torch
    ids = torch.tensor([[tok.cls_id] + [on, off] * 50])
    masked, labels = mask_tokens(ids, tok, torch.Generator().manual_seed(0))
    assert (labels != -100).any()  # markers are picked for prediction like any value token


def test_windows_carry_one_marker_per_value_only_when_the_config_asks():
    value_seqs = _value_seqs()
    tok, data = vocab_and_windows(value_seqs, pl.Series(["a", "b"]), {"vocab_size": 300, "max_positions": 32,
                                                                     "value_links": True})
    on, off = (tok.tokenizer.token_to_id(t) for t in (LINKED, ALONE))
    after_sep = [w[i + 1] for w in data.windows for i, t in enumerate(w) if t == tok.val_sep_id]
    flags = [f for row in value_link_flags(value_seqs) for f in row]
    assert after_sep == [on if f else off for f in flags]
    tok0, data0 = vocab_and_windows(value_seqs, pl.Series(["a", "b"]), {"vocab_size": 300, "max_positions": 32})
    assert not tok0.value_links  # off by default
    assert sum(map(len, data.windows)) == sum(map(len, data0.windows)) + len(flags)


def test_baseline_objects_carry_the_markers():
    from seqenc.baselines import ObjectSequences

    objects = pl.DataFrame({"sequence_id": ["a", "a", "a"], "step": [0, 0, 1],
                            "key": ["dest", "size", "src_ip"], "value": ["10.0.0.1:50010", "64", "10.0.0.1"]})
    tok = _tokenizer().with_value_links()
    on, off = (tok.tokenizer.token_to_id(t) for t in (LINKED, ALONE))
    data = ObjectSequences.from_objects(objects, tok)
    first, second = data.objects[0]
    dest_ids, size_ids = tok.encode_many(["dest", "size"])
    assert first[0] == dest_ids + [on] + tok.encode_many(["10.0.0.1:50010"])[0] + size_ids + [off, *tok.encode_many(["64"])[0]]
    assert on in second[0]


def test_seqenc_train_with_value_links_scores_with_them(prepared_task, tmp_path):
    """``seqenc train --config '{"model": {"value_links": true}}'``: the windows carry markers, the
    bundle's tokenizer keeps them, and batch scoring marks new objects the same way."""
    import shutil

    from parsers import storage
    from training.pipeline import stages as pipeline
    from training.serving.scoring import load_bundle, score_objects

    work = tmp_path / "w"
    shutil.copytree(prepared_task("anomaly"), work)
    steps = {"pretrain_steps": 2, "rounds": 1, "tvm_steps_per_round": 2, "checkpoint_every": 0}
    result = pipeline.run_train(str(work), resolve_task(None, "anomaly"), "tiny", config={"model": {"value_links": True}, "train": steps},
                                progress=False)
    model, tok, _ = load_bundle(result["model_dir"])
    assert model.config.value_links and tok.value_links
    seq_dir = work / "sequences" / "anomaly"
    windows = pipeline.TokenizedSequences.read_parquet(seq_dir / "windows.parquet").windows
    on = tok.tokenizer.token_to_id(LINKED)
    assert sum(w.count(on) for w in windows) > 0  # HDFS hosts link dest, datanode and src_ip
    spec = load_catalog().task("anomaly")
    objects = storage.read_objects(work / "data", spec.source)
    rebuilt = tokenize_value_sequences(value_sequences(objects, spec), tok,  # what scoring builds
                                       model.config.max_positions)
    trained = pipeline.TokenizedSequences.read_parquet(seq_dir / "windows.parquet")

    def windows_by_key(data):
        out = {}
        for r, w in zip(data.window_key, data.windows):
            out.setdefault((data.sequence_ids[data.key_seq[r]], data.keys[r]), []).append(w)
        return out

    rebuilt, trained = windows_by_key(rebuilt), windows_by_key(trained)
    assert all(rebuilt[k] == w for k, w in trained.items())
    scored = score_objects(result["model_dir"], objects, progress=False)
    assert scored.height == objects["sequence_id"].n_unique()
    assert scored["score"].is_between(0, 1).all()
