"""Baselines: flattened encoding, record view, joint end-to-end TVM-KA; and the next-item head."""

import logging

import numpy as np
import polars as pl
import pytest
import torch
from test_model import tiny_config
from transformers import BertModel

from seqenc.baselines import (
    FlattenedEncoder,
    JointTVMKA,
    ObjectSequences,
    RecordViewEncoder,
    flatten_objects,
    flattened_batch,
    joint_config,
    joint_inputs,
    pack_keys,
    record_batch,
)
from seqenc.config import TVMKAConfig
from seqenc.inference import gather_keys, ka_probabilities, key_representations
from seqenc.model import TVMKA
from seqenc.pretrained import config_from_bert, load_bert_encoder, minilm_dir
from seqenc.sequences import collect_value_sequences, tokenize_value_sequences
from seqenc.tokenizer import ValueTokenizer

CLS, SEP = 2, 3


def objects_frame() -> pl.DataFrame:
    rows = []
    for s, n_steps in (("a", 4), ("b", 2), ("c", 3)):
        for step in range(n_steps):
            rows.append((s, step, "status", f"ok{step}"))
            rows.append((s, step, "port", str(50000 + step)))
    return pl.DataFrame(rows, schema=["sequence_id", "step", "key", "value"], orient="row")


@pytest.fixture(scope="module")
def tok():
    df = objects_frame()
    return ValueTokenizer.train(df["key"].to_list() + df["value"].to_list(), vocab_size=120, min_frequency=1)


def test_flatten_keeps_most_recent_whole_objects_with_markers():
    objects = [([10, 11], [0, 1]), ([12, 13, 14], [0, 1, 1]), ([15, 16], [0, 1])]
    ids, types, dropped = flatten_objects(objects, CLS, SEP, max_len=8)
    assert ids == [CLS, 12, 13, 14, SEP, 15, 16, SEP] and dropped == 1
    assert types == [0, 0, 1, 1, 0, 0, 1, 0]
    ids, _, dropped = flatten_objects(objects, CLS, SEP, max_len=100)
    assert ids == [CLS, 10, 11, SEP, 12, 13, 14, SEP, 15, 16, SEP] and dropped == 0
    # one object longer than the budget keeps its first tokens
    ids, _, dropped = flatten_objects([([20, 21, 22, 23, 24], [0, 1, 1, 1, 1])], CLS, SEP, max_len=4)
    assert ids == [CLS, 20, 21, SEP] and dropped == 0


def test_object_sequences_from_long_form(tok):
    data = ObjectSequences.from_objects(objects_frame(), tok)
    assert data.sequence_ids == ["a", "b", "c"]
    assert [len(o) for o in data.objects] == [4, 2, 3]
    ids, types = data.objects[0][1]
    text = tok.decode(ids)
    assert "port" in text and "50001" in text and "ok1" in text
    assert types[0] == 0 and 1 in types  # a key token first, value tokens marked 1


def test_flattened_batch_logs_what_it_drops(tok, caplog):
    data = ObjectSequences.from_objects(objects_frame(), tok)
    with caplog.at_level(logging.WARNING):
        ids, types, mask = flattened_batch(data, [0, 1], tok, max_len=12)
    assert ids.shape[1] <= 12 and mask.sum(1).tolist()[1] <= 12
    assert "dropped" in caplog.text


def test_baselines_have_the_same_width_and_depth_and_no_shared_heads(tok):
    config = tiny_config(vocab_size=tok.vocab_size)
    flat, record = FlattenedEncoder(config), RecordViewEncoder(config)
    for model in (flat, record):
        assert model.config.n_shared_heads == 0 and model.config.drophead == 0.0
        assert len(model.encoder.layers) == config.n_layers
        assert model.encoder.layers[0].ffn_in.weight.shape == (config.d_ff, config.d_model)
    tvmka = TVMKA(config)
    n_flat = sum(p.numel() for p in flat.encoder.parameters())
    n_tvm = sum(p.numel() for p in tvmka.tvm.encoder.parameters())
    assert n_flat == n_tvm  # the same encoder size, heads split differently


def test_flattened_and_record_view_forward_and_learn(tok):
    torch.manual_seed(0)
    config = tiny_config(vocab_size=tok.vocab_size)
    data = ObjectSequences.from_objects(objects_frame(), tok)
    y = torch.tensor([1, 0, 1])  # a: 4 objects, b: 2, c: 3
    models = {"flat": (FlattenedEncoder(config), flattened_batch(data, [0, 1, 2], tok, 32)),
              "pool": (RecordViewEncoder(config, "pool"), record_batch(data, [0, 1, 2], tok, 8, 16)),
              "transformer": (RecordViewEncoder(config, "transformer"), record_batch(data, [0, 1, 2], tok, 8, 16))}
    for name, (model, inputs) in models.items():
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        first = None
        for _ in range(30):
            loss = torch.nn.functional.cross_entropy(model(*inputs), y)
            first = first if first is not None else loss.item()
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert loss.item() < 0.5 * first, name


def test_record_view_ignores_padding_objects_and_reads_order(tok):
    config = tiny_config(vocab_size=tok.vocab_size)
    model = RecordViewEncoder(config).eval()
    data = ObjectSequences.from_objects(objects_frame(), tok)
    alone = model(*record_batch(data, [1], tok, 8, 16))
    padded = model(*record_batch(data, [1, 0], tok, 8, 16))[:1]  # b padded to a's 4 objects
    assert torch.allclose(alone, padded, atol=1e-5)
    data.objects[0] = data.objects[0][::-1]
    reordered = model(*record_batch(data, [0], tok, 8, 16))
    original = model(*record_batch(ObjectSequences.from_objects(objects_frame(), tok), [0], tok, 8, 16))
    assert not torch.allclose(reordered, original, atol=1e-4)  # object positions matter


def test_record_view_counts_cut_objects(tok, caplog):
    data = ObjectSequences.from_objects(objects_frame(), tok)
    with caplog.at_level(logging.WARNING):
        ids, _, _, object_mask = record_batch(data, [0], tok, max_objects=2, max_object_tokens=16)
    assert ids.shape[1] == 2 and "2 object(s) beyond 2" in caplog.text


def _value_data(tok):
    return tokenize_value_sequences(collect_value_sequences(objects_frame()), tok, max_len=8)


def test_pack_keys_matches_gather_keys(tok):
    data = _value_data(tok)
    kr = torch.randn(len(data.keys), 5)
    packed, mask = pack_keys(kr, torch.as_tensor(data.key_seq), data.n_sequences)
    gathered, gmask = gather_keys(kr, data.key_rows_of(), np.arange(data.n_sequences))
    assert torch.equal(packed, gathered) and torch.equal(mask, gmask)


def test_joint_model_matches_the_two_stage_path_and_trains_the_tvm_end_to_end(tok):
    torch.manual_seed(0)
    config = joint_config(tiny_config(vocab_size=tok.vocab_size, max_positions=8))
    assert config.n_shared_heads == 0
    model = JointTVMKA(config).eval()
    data = _value_data(tok)
    assert len(data.windows) > len(data.keys)  # some S(k) span several windows
    inputs = joint_inputs(data, [0, 1, 2], tok.pad_id)
    with torch.no_grad():
        joint = model(*inputs).softmax(-1)
    kr = key_representations(model.tvm, data, tok.pad_id, progress=False)
    two_stage = torch.as_tensor(ka_probabilities(model.ka, kr, data))
    assert torch.allclose(joint, two_stage, atol=1e-5)

    model.train()
    model(*inputs).sum().backward()
    private = model.tvm.encoder.layers[0].attn.query.weight.grad
    assert private is not None and private.abs().sum() > 0  # the task loss reaches the TVM
    assert model.tvm.embeddings.word.weight.grad.abs().sum() > 0


def test_flattened_encoder_from_minilm_equals_bert_with_token_types():
    config = config_from_bert("minilm", dropout=0.0, attn_dropout=0.0)
    model = FlattenedEncoder(config).eval()
    load_bert_encoder(model.embeddings, model.encoder, model.config, "minilm")
    bert = BertModel.from_pretrained(str(minilm_dir())).eval()
    ids = torch.tensor([[101, 2003, 1037, 3231, 102, 2054, 2003, 102]])
    types = torch.tensor([[0, 0, 1, 1, 0, 0, 1, 0]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        ours = model.encoder(model.embeddings(ids, types), mask)
        theirs = bert(input_ids=ids, token_type_ids=types).last_hidden_state
    assert (ours - theirs).abs().max().item() <= 1e-4


# --- next-item retrieval head --------------------------------------------------------------------


def test_next_item_head_config_and_top_k():
    with pytest.raises(ValueError, match="n_items"):
        TVMKAConfig(task="next_item")
    model = TVMKA(tiny_config(task="next_item", n_items=11)).eval()
    kr, mask = torch.randn(3, 4, 32), torch.ones(3, 4, dtype=torch.bool)
    scores = model.ka(kr, mask)
    assert scores.shape == (3, 11)
    top, items = model.ka.top_k(kr, mask, k=5)
    assert torch.equal(top, scores.topk(5).values) and torch.equal(items, scores.topk(5).indices)
    assert (top[:, :-1] >= top[:, 1:]).all()
    exclude = torch.zeros(3, 11, dtype=torch.bool)
    exclude[:, items[:, 0]] = True
    _, items2 = model.ka.head.top_k(model.ka.encode(kr, mask), 3, exclude=exclude)
    assert not exclude.gather(1, items2).any()
    with pytest.raises(ValueError, match="next_item"):
        TVMKA(tiny_config()).ka.top_k(kr, mask)


def test_next_item_head_learns_to_retrieve():
    """The next item is the index of the key whose KR carries a marker: recall@1 after training."""
    torch.manual_seed(0)
    n_items, K = 6, 4
    model = TVMKA(tiny_config(task="next_item", n_items=n_items))
    marker = torch.randn(n_items, 32)

    def sample(B):
        target = torch.randint(n_items, (B,))
        kr = torch.randn(B, K, 32) * 0.1
        kr[:, 0] += marker[target]
        return kr[:, torch.randperm(K)], target

    opt = torch.optim.AdamW(model.ka.parameters(), lr=3e-3)
    model.train()
    for _ in range(150):
        kr, target = sample(32)
        loss = torch.nn.functional.cross_entropy(model.ka(kr, torch.ones(32, K, dtype=torch.bool)), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    kr, target = sample(200)
    _, items = model.ka.top_k(kr, torch.ones(200, K, dtype=torch.bool), k=1)
    assert (items[:, 0] == target).float().mean() > 0.9


def test_baselines_save_and_load_as_safetensors_directories(tmp_path, tok):
    config = tiny_config(vocab_size=tok.vocab_size)
    data = ObjectSequences.from_objects(objects_frame(), tok)
    record = RecordViewEncoder(config, "transformer").eval()
    record.save_pretrained(tmp_path / "record")
    again = RecordViewEncoder.from_pretrained(tmp_path / "record").eval()
    assert again.object_encoder == "transformer"
    inputs = record_batch(data, [0, 1], tok, 8, 16)
    assert torch.equal(record(*inputs), again(*inputs))
    flat = FlattenedEncoder(config).eval()
    flat.save_pretrained(tmp_path / "flat")
    inputs = flattened_batch(data, [0, 2], tok, 32)
    assert torch.equal(flat(*inputs), FlattenedEncoder.from_pretrained(tmp_path / "flat").eval()(*inputs))
    with pytest.raises(ValueError, match="holds a FlattenedEncoder, not a TVMKA"):
        TVMKA.from_pretrained(tmp_path / "flat")


def test_key_representations_encode_a_repeated_window_once_with_the_same_result(tok, monkeypatch):
    torch.manual_seed(0)
    model = TVMKA(tiny_config(vocab_size=tok.vocab_size, max_positions=8))
    data = _value_data(tok)
    windows = [tuple(w) for w in data.windows]
    assert len(set(windows)) < len(windows)  # "status" ok0 / "port" 50000 repeat across sequences
    kr = key_representations(model.tvm, data, tok.pad_id, progress=False)

    seen = []
    encode = model.tvm.key_representations
    monkeypatch.setattr(model.tvm, "key_representations", lambda ids, mask: seen.append(len(ids)) or encode(ids, mask))
    again = key_representations(model.tvm, data, tok.pad_id, progress=False)
    assert sum(seen) == len(set(windows)) and torch.equal(kr, again)
    # each key's KR is the mean of its windows' [CLS] vectors, each window encoded on its own
    model.tvm.eval()
    with torch.no_grad():
        alone = torch.cat([encode(torch.tensor([w]), torch.ones(1, len(w), dtype=torch.bool)) for w in data.windows])
    pooled = torch.zeros(len(data.keys), alone.size(1)).index_add_(0, torch.as_tensor(data.window_key), alone)
    counts = torch.bincount(torch.as_tensor(data.window_key), minlength=len(data.keys)).clamp(min=1)
    assert torch.allclose(kr, pooled / counts[:, None], atol=1e-5)
