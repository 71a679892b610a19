"""Value repeats (seqenc.links): [SEEN] / [NEW] markers through the tokenizer, S(k), the
baselines and a trained bundle."""

import polars as pl
import pytest

from seqenc.links import ALONE, LINKED, NEW, SEEN, long_repeat_flags, repeat_flags, value_link_flags
from seqenc.tokenizer import ValueTokenizer
from training.tasks.spec import resolve_task
from training.tasks.task_data import vocab_and_windows


def _value_seqs() -> pl.DataFrame:
    return pl.DataFrame({
        "sequence_id": ["a", "a", "b"],
        "key": ["size", "src_ip", "size"],
        "values": [["64", "64", "63", "64"], ["10.0.0.1", "/10.0.0.1"], ["63"]],
    })


def test_flags_mark_a_value_equal_to_an_earlier_one_of_its_key():
    assert repeat_flags(["64", "64", "63", "64"]) == [False, True, False, True]
    assert repeat_flags(["10.0.0.1", "/10.0.0.1"]) == [False, False]  # exact text, unlike links
    assert repeat_flags([]) == []
    long = pl.DataFrame({"sequence_id": ["a", "a", "a", "b", "a", "a"],
                         "key": ["size", "size", "src_ip", "size", "size", "src_ip"],
                         "value": ["64", "64", "64", "64", "63", "64"]})
    # per (sequence, key) in row order: another key or sequence does not count
    assert long_repeat_flags(long).to_list() == [False, True, False, False, False, True]


def test_markers_lead_in_order_link_repeat_bin_and_survive_save_load(tmp_path):
    tok = ValueTokenizer.train(["size", "64", "63", "10.0.0.1"] * 3, vocab_size=200)
    assert not tok.value_repeats
    with pytest.raises(ValueError, match="no value-repeat tokens"):
        tok.encode_values("size", ["64"], seen=[True])
    tok.with_value_links().with_value_repeats()
    seen, new, linked, alone = (tok.tokenizer.token_to_id(t) for t in (SEEN, NEW, LINKED, ALONE))
    assert tok.value_repeats and tok.marker_kinds["repeat"] == {seen, new} and not {seen, new} & tok.special_ids
    plain = tok.encode_values("size", ["64", "63"])
    assert tok.encode_values("size", ["64", "63"], [True, False], [True, False]) == \
        [[linked, seen, *plain[0]], [alone, new, *plain[1]]]
    assert tok.encode_values("size", ["64"], seen=[False]) == [[new, *plain[0]]]
    with pytest.raises(ValueError, match="1 repeat flags for 2 values"):
        tok.encode_values("size", ["64", "63"], seen=[True])
    tok.save(tmp_path / "tokenizer.json")
    loaded = ValueTokenizer.from_file(tmp_path / "tokenizer.json")
    assert loaded.value_repeats and loaded.encode_values("size", ["64"], seen=[True]) == [[seen, *plain[0]]]


def test_windows_carry_one_repeat_marker_per_value_only_when_the_config_asks():
    value_seqs = _value_seqs()
    config = {"vocab_size": 300, "max_positions": 32, "value_links": True, "value_repeats": True}
    tok, data = vocab_and_windows(value_seqs, pl.Series(["a", "b"]), config)
    ids = {t: tok.tokenizer.token_to_id(t) for t in (SEEN, NEW, LINKED, ALONE)}
    after_sep = [(w[i + 1], w[i + 2]) for w in data.windows for i, t in enumerate(w) if t == tok.val_sep_id]
    links = [f for row in value_link_flags(value_seqs) for f in row]
    repeats = [f for vs in value_seqs["values"].to_list() for f in repeat_flags(vs)]
    assert after_sep == [(ids[LINKED] if link else ids[ALONE], ids[SEEN] if rep else ids[NEW])
                         for link, rep in zip(links, repeats)]
    tok0, data0 = vocab_and_windows(value_seqs, pl.Series(["a", "b"]), {**config, "value_repeats": False})
    assert not tok0.value_repeats  # off unless asked
    assert sum(map(len, data.windows)) == sum(map(len, data0.windows)) + len(repeats)


def test_baseline_objects_carry_the_repeat_markers():
    from seqenc.baselines import ObjectSequences

    objects = pl.DataFrame({"sequence_id": ["a"] * 3, "step": [2, 0, 1], "key": ["size"] * 3,
                            "value": ["63", "64", "64"]})  # in time order: 64, 64, 63
    tok = ValueTokenizer.train(["size", "64", "63"] * 3, vocab_size=200).with_value_repeats()
    seen, new = (tok.tokenizer.token_to_id(t) for t in (SEEN, NEW))
    data = ObjectSequences.from_objects(objects, tok)
    key_ids = tok.encode_many(["size"])[0]
    assert [ids for ids, _ in data.objects[0]] == [key_ids + [new, *tok.encode_many(["64"])[0]],
                                                   key_ids + [seen, *tok.encode_many(["64"])[0]],
                                                   key_ids + [new, *tok.encode_many(["63"])[0]]]


def test_seqenc_train_with_value_repeats_keeps_them_in_the_bundle(prepared_task, tmp_path):
    import shutil

    from training.pipeline import stages as pipeline
    from training.serving.scoring import load_bundle

    work = tmp_path / "w"
    shutil.copytree(prepared_task("anomaly"), work)
    steps = {"pretrain_steps": 2, "rounds": 1, "tvm_steps_per_round": 2, "checkpoint_every": 0,
             "mlm_mask_unit": "value"}
    result = pipeline.run_train(str(work), resolve_task(None, "anomaly"), "tiny", config={"model": {"value_repeats": True},
                                                                      "train": steps}, progress=False)
    model, tok, _ = load_bundle(result["model_dir"])
    assert model.config.value_repeats and tok.value_repeats
    windows = pipeline.TokenizedSequences.read_parquet(work / "sequences" / "anomaly" / "windows.parquet").windows
    seen = tok.tokenizer.token_to_id(SEEN)
    assert sum(w.count(seen) for w in windows) > 0  # an HDFS block's id repeats in S(block)
