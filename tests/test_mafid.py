"""seqenc.ema and seqenc.mafid: the damped EMA equals its recurrence, the low-dimensional EMA is
linear in the length, a closed gate passes its input unchanged, and the MAFiD table model
reads per-row blocks, ignores padding rows and round-trips through save / load."""

import random

import pytest
import torch
from test_table_model import WORDS, random_table

from seqenc.config import TableConfig
from seqenc.ema import DampedEMA, LowDimEMA
from seqenc.mafid import GatedCrossAttention, MafidTableEncoder, row_blocks
from seqenc.model import read_architecture
from seqenc.table_model import TableExamples, table_encoder
from seqenc.tokenizer import ValueTokenizer


@pytest.fixture(scope="module")
def tok():
    return ValueTokenizer.train(WORDS * 2, vocab_size=200, min_frequency=1)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_damped_ema_by_fft_equals_the_recurrence(bidirectional):
    torch.manual_seed(0)
    ema = DampedEMA(6, ema_dim=3, bidirectional=bidirectional)
    x = torch.randn(2, 37, 6)
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[1, 30:] = False  # a padded example
    fast, slow = ema(x, mask), ema.recurrent(x, mask)
    assert (fast - slow).abs().max() <= 1e-5
    assert fast[1, 30:].abs().max() == 0  # padding stays zero
    # padding never reaches a real position: the padded example equals itself cut short
    alone = ema(x[1:, :30], None)
    assert (alone - fast[1:, :30]).abs().max() <= 1e-5
    # a genuinely moving average: the output at t depends on earlier inputs (and later ones when bidirectional)
    y = x.clone()
    y[0, 0] += 1.0
    changed = (ema(y, mask) - fast)[0].abs().sum(-1) > 1e-6
    assert changed[5] and changed[0]
    y = x.clone()
    y[0, 20] += 1.0
    assert bool(((ema(y, mask) - fast)[0, 10].abs() > 1e-6).any()) == bidirectional


def _saved_elements(module, x, mask) -> int:
    """Elements autograd keeps for the backward pass of one forward: what the layer's memory grows with."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x, mask).sum()
    return total


def test_low_dim_ema_shapes_and_linear_cost():
    torch.manual_seed(0)
    d, K = 64, 4
    ema = LowDimEMA(d, reduction=K)
    assert ema.reduce.out_features == d // K and ema.ema.dim == d // K and ema.reconstruct.out_features == d
    x = torch.randn(2, 256, d, requires_grad=True)
    out = ema(x, torch.ones(2, 256, dtype=torch.bool))
    assert out.shape == x.shape
    out.sum().backward()
    assert x.grad is not None and ema.ema.alpha.grad.abs().sum() > 0
    sizes = {L: _saved_elements(ema, torch.randn(1, L, d, requires_grad=True), torch.ones(1, L, dtype=torch.bool))
             for L in (1024, 4096)}
    assert 3.5 < sizes[4096] / sizes[1024] < 4.5  # 4x the positions, 4x the memory (attention: 16x)
    full = LowDimEMA(d, reduction=1)
    assert _saved_elements(full, torch.randn(1, 1024, d, requires_grad=True), None) > sizes[1024]
    with pytest.raises(ValueError, match="divide"):
        LowDimEMA(d, reduction=3)


def test_a_closed_gate_passes_its_input_unchanged():
    torch.manual_seed(0)
    config = TableConfig(d_model=32, n_heads=4, n_shared_heads=0, dropout=0.0, attn_dropout=0.0)
    layer = GatedCrossAttention(config)
    x, context = torch.randn(3, 2, 32), torch.randn(3, 9, 32)
    mask = torch.ones(3, 9, dtype=torch.bool)
    assert torch.equal(layer(x, context, mask), x)
    layer(x, context, mask).sum().backward()
    assert layer.gate.grad.abs().sum() > 0  # closed, but it learns to open
    with torch.no_grad():
        layer.gate.fill_(1.0)
    assert not torch.allclose(layer(x, context, mask), x)
    ungated = GatedCrossAttention(config, gated=False)  # the ablation: always open
    assert torch.allclose(ungated(x, context, mask), x + ungated.attn(x, context, mask))


def mafid(tok, **extra) -> MafidTableEncoder:
    torch.manual_seed(0)
    config = TableConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=4, n_shared_heads=0, d_ff=64,
                         dropout=0.0, attn_dropout=0.0, max_positions=64, table_attention="mafid", n_classes=2,
                         mafid_reduction=4, **extra)
    model = table_encoder(config).eval()
    with torch.no_grad():  # open the gates: closed ones would hide the EMA branch from the checks
        model.fuse.gate.fill_(0.5)
        model.row_gate.fill_(0.5)
    return model


def test_rows_are_blocks_of_text_then_header_and_cell(tok):
    config = mafid(tok).config
    blocks = row_blocks(tok, "w1 w2", ["h0", "h1"], [["w3", "w4 w5"], ["1", "2"]], config)
    assert len(blocks) == 2
    ids, types, _, _ = blocks[0]
    text = [tok.cls_id, *tok.encode_many(["w1 w2"])[0], tok.sep_id]
    assert ids[:len(text)] == text and ids[-1] == tok.sep_id and types[:len(text)] == [0] * len(text)
    assert set(types[len(text):]) == {1}
    assert ids[len(text):-1] == [t for piece in tok.encode_many(["h0", "w3", "h1", "w4 w5"]) for t in piece]


def test_mafid_ignores_padding_rows_and_round_trips(tok, tmp_path):
    rng = random.Random(0)
    tables = [random_table(rng, n_rows=2), random_table(rng, n_rows=6)]
    data = TableExamples(["a", "b"], tables)
    model = mafid(tok)
    together = model(*model.batch_inputs(data, [0, 1], tok))
    alone = model(*model.batch_inputs(data, [0], tok))
    assert together.shape == (2, 2) and torch.allclose(together[0], alone[0], atol=1e-5)
    # the multi-row EMA matters: a change in row 5 reaches the output
    changed = TableExamples(["b"], [(tables[1][0], tables[1][1], [*tables[1][2][:5], ["w1"] * 4])])
    assert not torch.allclose(model(*model.batch_inputs(changed, [0], tok)), together[1:])
    model.save_pretrained(tmp_path / "m")
    assert read_architecture(tmp_path / "m")["class"] == "MafidTableEncoder"
    again = MafidTableEncoder.from_pretrained(tmp_path / "m").eval()
    assert torch.allclose(again(*again.batch_inputs(data, [0, 1], tok)), together, atol=1e-6)


@pytest.mark.parametrize("ablation", [{"mafid_ema": "none"}, {"mafid_ema": "full"}, {"mafid_gate": False}])
def test_mafid_ablations_build_and_run(tok, ablation):
    torch.manual_seed(0)
    config = TableConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=4, n_shared_heads=0, d_ff=64,
                         dropout=0.0, attn_dropout=0.0, max_positions=64, table_attention="mafid", n_classes=2,
                         **ablation)
    model = table_encoder(config)
    data = TableExamples(["a"], [random_table(random.Random(1))])
    model(*model.batch_inputs(data, [0], tok)).sum().backward()
    if ablation.get("mafid_ema") == "none":
        assert model.multi_row is None and model.fuse is None
    if ablation.get("mafid_ema") == "full":
        assert model.multi_row.ema.dim == 32
    if ablation.get("mafid_gate") is False:
        assert model.row_gate is None and model.fuse.gate is None


def test_an_ema_ka_reads_long_key_sets_in_linear_memory_and_ignores_padding(tmp_path):
    from seqenc.model import TVMKA

    torch.manual_seed(0)
    config = TableConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_shared_heads=2, d_ff=64, dropout=0.0,
                         attn_dropout=0.0, max_positions=16, ka_mixer="ema", ka_layers=2)
    model = TVMKA(config).eval()
    ka = model.ka
    assert not any(".attn." in name for name, _ in ka.named_parameters())  # no attention, no shared heads
    kr, mask = torch.randn(2, 50, 32), torch.ones(2, 50, dtype=torch.bool)
    mask[1, 20:] = False
    out = ka(kr, mask)
    assert out.shape == (2, 2)
    assert torch.allclose(ka(kr[1:, :20], mask[1:, :20]), out[1:], atol=1e-5)  # padded keys change nothing
    sizes = {K: _saved_elements(lambda x, m: ka(x, m), torch.randn(1, K, 32, requires_grad=True),
                                torch.ones(1, K, dtype=torch.bool)) for K in (1000, 4000)}
    assert sizes[4000] / sizes[1000] < 4.5  # linear in the number of keys
    model.save_pretrained(tmp_path / "m")
    again = TVMKA.from_pretrained(tmp_path / "m").eval()
    assert torch.allclose(again.ka(kr, mask), out, atol=1e-6)
    with pytest.raises(ValueError, match="ka_mixer"):
        TableConfig(ka_mixer="mamba")
